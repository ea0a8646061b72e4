"""#27: the classes a project trusts in meta and cb_kwargs (``LEASED_META_TYPES``), each
stored by an explicit encoder/decoder; scrapy-playwright's ``PageMethod`` built in; what
cannot cross workers refused naming the request's URL, the key and the fix; scrapy-poet's
``callback_for`` callbacks and injected arguments. Fast, no Redis."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import io
import sys

import attrs
import pytest
import scrapy
from hypothesis import given, settings
from hypothesis import strategies as st
from scrapy.settings import Settings

from scrapy_leased.codec import Codec, ItemClasses, PayloadError, meta_types
from scrapy_leased.settings import LeasedConfigError

HERE = __name__


class S(scrapy.Spider):
    name = "s"

    def parse(self, response):
        pass


SPIDER = S()


class Money:
    """A plain class: stored through its codec (MoneyCodec)."""

    def __init__(self, amount: decimal.Decimal, currency: str) -> None:
        self.amount, self.currency = amount, currency

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Money)
                and (self.amount, self.currency) == (other.amount, other.currency))


class MoneyCodec:
    @staticmethod
    def encode(m: Money) -> dict:
        return {"a": m.amount, "c": m.currency}  # a Decimal: packed by the codec

    @staticmethod
    def decode(data: dict) -> Money:
        return Money(data["a"], data["c"])


class Window:
    """A class with to_dict() and from_dict()."""

    def __init__(self, start: datetime.date, days: int) -> None:
        self.start, self.days = start, days

    def to_dict(self) -> dict:
        return {"start": self.start, "days": self.days}

    @classmethod
    def from_dict(cls, data: dict) -> Window:
        return cls(data["start"], data["days"])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Window) and vars(self) == vars(other)


@dataclasses.dataclass(frozen=True)
class Point:
    x: int
    y: int
    tags: tuple = ()


@attrs.define
class Box:
    corner: Point
    label: str = ""


class Unregistered:
    pass


TYPES = {f"{HERE}.Money": f"{HERE}.MoneyCodec", f"{HERE}.Window": None,
         f"{HERE}.Point": None, f"{HERE}.Box": None}
# the package "other": no item class of this module counts as the project's
CODEC = Codec(ItemClasses(["other"], meta_types(Settings({"LEASED_META_TYPES": TYPES}))))


def roundtrip(request: scrapy.Request, codec: Codec = CODEC) -> scrapy.Request:
    return codec.decode(codec.encode(request, None), SPIDER)


def refusal(codec: Codec, url: str, **kwargs) -> str:
    with pytest.raises(PayloadError) as e:
        codec.encode(scrapy.Request(url, **kwargs), None)
    return str(e.value)


scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**53, 2**53),
                    st.text(max_size=8), st.decimals(allow_nan=False, allow_infinity=False,
                                                     places=2, max_value=10**6,
                                                     min_value=-10**6))
points = st.builds(Point, st.integers(), st.integers(),
                   st.lists(st.integers(), max_size=3).map(tuple))
registered = st.one_of(
    st.builds(Money, st.decimals(allow_nan=False, allow_infinity=False, places=2,
                                 max_value=10**9, min_value=-10**9), st.text(max_size=3)),
    st.builds(Window, st.dates(), st.integers(0, 400)),
    points,
    st.builds(Box, points, st.text(max_size=5)),
)
values = st.recursive(st.one_of(scalars, registered),
                      lambda inner: st.one_of(st.lists(inner, max_size=3),
                                              st.dictionaries(st.text(max_size=4), inner,
                                                              max_size=3)),
                      max_leaves=10)


@settings(max_examples=150, deadline=None)
@given(meta=st.dictionaries(st.text(min_size=1, max_size=6).filter(
    lambda k: not k.startswith("_leased")), values, max_size=4),
       kwargs=st.dictionaries(st.from_regex(r"[a-z]{1,6}", fullmatch=True), values,
                              max_size=3))
def test_registered_types_round_trip_equal(meta, kwargs):
    back = roundtrip(scrapy.Request("http://e.com/p", meta=meta, cb_kwargs=kwargs))
    assert back.meta == meta
    assert back.cb_kwargs == kwargs


def test_each_form_of_the_setting():
    found = meta_types(Settings({"LEASED_META_TYPES": f"{HERE}.Point, {HERE}.Window"}))
    assert {f"{HERE}:Point", f"{HERE}:Window", "scrapy_playwright.page:PageMethod"} <= set(found)
    as_json = meta_types(Settings({"LEASED_META_TYPES":
                                   f'{{"{HERE}.Money": "{HERE}.MoneyCodec"}}'}))
    assert f"{HERE}:Money" in as_json
    assert f"{HERE}:Money" in meta_types(Settings({"LEASED_META_TYPES": {Money: MoneyCodec}}))
    # a built-in type may be named too (it keeps its built-in codec)
    pm = pytest.importorskip("scrapy_playwright.page").PageMethod
    named = meta_types(Settings({"LEASED_META_TYPES": ["scrapy_playwright.page.PageMethod"]}))
    assert named["scrapy_playwright.page:PageMethod"].load() is pm
    # only the built-in types when unset
    assert set(meta_types(Settings())) == {"scrapy_playwright.page:PageMethod"}


@pytest.mark.parametrize(("value", "message"), [
    (3, "must be a list of classes"),
    ({f"{HERE}.Point": 3}, "must be a list of classes"),
    ([f"{HERE}.Nowhere"], "cannot be imported: AttributeError"),
    (["no_such_module_27.X"], "cannot be imported: ModuleNotFoundError"),
    (["Point"], "is not a dotted path"),
    ([f"{HERE}.SPIDER"], "is not a class"),
    ([f"{HERE}.Unregistered"], "no to_dict()/from_dict(data): name a codec for it"),
    ({f"{HERE}.Money": f"{HERE}.Point"}, "has no encode(obj) and decode(data)"),
])
def test_bad_settings_name_the_setting(value, message):
    with pytest.raises(LeasedConfigError) as e:
        meta_types(Settings({"LEASED_META_TYPES": value}))
    assert str(e.value).startswith("LEASED_META_TYPES"), str(e.value)
    assert message in str(e.value)


def test_unregistered_objects_are_refused_naming_url_key_and_setting():
    text = refusal(CODEC, "http://e.com/u?q=1", meta={"deal": {"m": [Unregistered()]}})
    assert text.startswith("cannot store <GET http://e.com/u?q=1>: meta['deal']['m'][0] is a "
                           f"{HERE}.Unregistered; ")
    assert "name it in LEASED_META_TYPES" in text and "LEASED_ITEM_MODULES" not in text
    # a registered class's subclass is not the class: refused as well
    class Pointier(Point):
        pass
    text = refusal(CODEC, "http://e.com/v", cb_kwargs={"p": Pointier(1, 2)})
    assert text.startswith("cannot store <GET http://e.com/v>: cb_kwargs['p'] is a ")
    # without the setting, Money is refused
    text = refusal(Codec(ItemClasses(["other"])), "http://e.com/w",
                   meta={"price": Money(decimal.Decimal(1), "EUR")})
    assert f"meta['price'] is a {HERE}.Money" in text


def test_a_payload_names_only_registered_classes_and_imports_nothing():
    payload = CODEC.encode(scrapy.Request("http://e.com", meta={"p": Point(1, 2)}), None)
    assert f'"c":"{HERE}:Point"' in payload
    plain = Codec(ItemClasses(["other"]))
    with pytest.raises(PayloadError, match=r"meta\['p'\]: class '.*:Point' is not one of "
                                           "LEASED_META_TYPES"):
        plain.decode(payload, SPIDER)
    module = "tests.support.never_imported_27"
    with pytest.raises(PayloadError, match="is not one of LEASED_META_TYPES"):
        CODEC.decode('{"u":"http://e.com","k":{"x":{"$leased":"obj","c":"' + module
                     + ':X","v":{}}}}', SPIDER)
    assert module not in sys.modules


def test_an_encoder_that_fails_is_named():
    class Broken:
        @staticmethod
        def encode(obj):
            raise RuntimeError("boom")

        decode = staticmethod(lambda data: data)

    codec = Codec(ItemClasses([], meta_types(Settings({"LEASED_META_TYPES":
                                                       {Money: Broken}}))))
    text = refusal(codec, "http://e.com/b", meta={"m": Money(decimal.Decimal(1), "X")})
    assert f"meta['m'] is a {HERE}.Money, whose encoder ({HERE}:Money) raised " \
           "RuntimeError: boom" in text


# -- scrapy-playwright -------------------------------------------------------------------

def test_page_methods_are_built_in():
    page = pytest.importorskip("scrapy_playwright.page")
    pm = page.PageMethod("screenshot", path="/tmp/x.png", full_page=True)
    methods = [page.PageMethod("wait_for_selector", "div.quote"), pm,
               page.PageMethod("evaluate", "1 + 1")]
    back = roundtrip(scrapy.Request("http://e.com", meta={"playwright": True,
                                                           "playwright_page_methods": methods}),
                     Codec())
    got = back.meta["playwright_page_methods"]
    assert [type(m) for m in got] == [page.PageMethod] * 3
    assert [(m.method, m.args, m.kwargs) for m in got] == [
        ("wait_for_selector", ("div.quote",), {}),
        ("screenshot", (), {"path": "/tmp/x.png", "full_page": True}),
        ("evaluate", ("1 + 1",), {})]
    # a dict of page methods (scrapy-playwright accepts one too)
    back = roundtrip(scrapy.Request("http://e.com", meta={"playwright_page_methods": {
        "shot": pm}}), Codec())
    assert back.meta["playwright_page_methods"]["shot"].kwargs == pm.kwargs


def test_what_cannot_cross_workers_is_refused_with_the_fix():
    page = pytest.importorskip("scrapy_playwright.page")
    from playwright.async_api import async_playwright

    live = async_playwright()  # a Playwright object (no browser started)
    text = refusal(Codec(), "http://e.com/a", meta={"playwright": True,
                                                    "playwright_page": live})
    assert text.startswith("cannot store <GET http://e.com/a>: meta['playwright_page'] is a "
                           "playwright.")
    assert "a live Playwright object" in text and "playwright_page_methods" in text
    text = refusal(Codec(), "http://e.com/b", meta={"playwright_page_methods": [
        page.PageMethod(lambda p: p.title())]})
    assert text.startswith("cannot store <GET http://e.com/b>: "
                           "meta['playwright_page_methods'][0] is a "
                           "scrapy_playwright.page.PageMethod, whose method is <function")
    assert "a worker cannot receive code" in text
    text = refusal(Codec(), "http://e.com/c", meta={"playwright_page_event_handlers": {
        "dialog": print}})
    assert "meta['playwright_page_event_handlers']['dialog'] is a " in text
    assert "a callable; a worker cannot receive code: store the name of a spider method" \
        in text
    with io.BytesIO() as f:
        text = refusal(Codec(), "http://e.com/d", cb_kwargs={"out": f})
    assert "cb_kwargs['out'] is a _io.BytesIO, an open file; " in text
    text = refusal(Codec(), "http://e.com/e", meta={"cls": Unregistered})
    assert "meta['cls'] is a builtins.type, a class; " in text


# -- scrapy-poet -------------------------------------------------------------------------

def test_callback_for_callbacks_are_stored_by_their_attribute():
    poet = pytest.importorskip("scrapy_poet")
    from web_poet import WebPage

    class BookPage(WebPage):
        async def to_item(self):
            return {}

    class ListPage(WebPage):
        def to_item(self):
            return {}

    class Books(scrapy.Spider):
        name = "books"
        parse_book = poet.callback_for(BookPage)
        parse_list = poet.callback_for(ListPage)

    spider = Books()
    assert spider.parse_book.__name__ == "async_parse"
    for attr in ("parse_book", "parse_list"):
        payload = Codec().encode(scrapy.Request("http://e.com/b",
                                                callback=getattr(spider, attr)), spider)
        assert f'"cb":"{attr}"' in payload
        assert Codec().decode(payload, spider).callback == getattr(spider, attr)
    # an inline callback_for (not a spider attribute): refused, naming the URL
    with pytest.raises(PayloadError) as e:
        Codec().encode(scrapy.Request("http://e.com/inline",
                                      callback=poet.callback_for(BookPage)), spider)
    assert str(e.value).startswith("cannot store <GET http://e.com/inline>: callback ")
    assert "parse_book = callback_for(BookPage)" in str(e.value)


def test_poet_injected_arguments_are_left_out():
    pytest.importorskip("scrapy_poet")
    from web_poet import HttpResponse, RequestUrl, WebPage

    class BookPage(WebPage):
        pass

    response = HttpResponse("http://e.com/b", b"<html></html>")
    request = scrapy.Request("http://e.com/b", cb_kwargs={
        "page": BookPage(response=response), "url": RequestUrl("http://e.com/b"),
        "mine": 3})
    back = roundtrip(request, Codec())
    assert back.cb_kwargs == {"mine": 3}
    only_injected = scrapy.Request("http://e.com/b", cb_kwargs={"page": BookPage(response)})
    assert Codec().encode(only_injected, None) == '{"u":"http://e.com/b"}'
