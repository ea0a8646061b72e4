"""Requests round-trip through JSON (never pickle); what cannot be stored is refused
with a reason, and what cannot be decoded raises PayloadError."""

from __future__ import annotations

import json

import pytest
import scrapy
from scrapy.http import FormRequest, JsonRequest

from scrapy_leased.codec import PayloadError, decode_request, encode_request


class S(scrapy.Spider):
    name = "s"

    def parse_page(self, response):
        pass

    def on_error(self, failure):
        pass


SPIDER = S()


def roundtrip(request: scrapy.Request) -> scrapy.Request:
    return decode_request(encode_request(request, SPIDER), SPIDER, request.priority)


def test_plain_get_is_little_more_than_its_url():
    payload = encode_request(scrapy.Request("http://example.com/a"), SPIDER)
    assert payload == '{"u":"http://example.com/a"}'


def test_every_field_round_trips():
    r = scrapy.Request("http://example.com/b?q=1", method="POST", body=b"\x00\xffbin",
                       headers={"X-A": ["1", "2"]}, cookies={"c": "v"},
                       meta={"depth": 2, "k": [1, "x"], "_leased_claim": 7}, encoding="latin-1",
                       priority=-3, dont_filter=True, flags=["f"], cb_kwargs={"n": 1},
                       callback=SPIDER.parse_page, errback=SPIDER.on_error)
    back = roundtrip(r)
    assert type(back) is scrapy.Request
    assert (back.url, back.method, back.body, back.encoding, back.priority, back.dont_filter,
            back.flags, back.cb_kwargs) == (r.url, "POST", b"\x00\xffbin", "latin-1", -3, True,
                                            ["f"], {"n": 1})
    assert back.headers.getlist("X-A") == [b"1", b"2"]
    assert back.cookies == {"c": "v"}
    assert back.meta == {"depth": 2, "k": [1, "x"]}  # the claim token is never stored
    assert back.callback == SPIDER.parse_page and back.errback == SPIDER.on_error


def test_request_subclasses_round_trip():
    back = roundtrip(JsonRequest("http://example.com/j", data={"a": 1}))
    assert type(back) is JsonRequest and json.loads(back.body) == {"a": 1}
    back = roundtrip(FormRequest("http://example.com/f", formdata={"a": "1"}))
    assert type(back) is FormRequest and back.body == b"a=1"


def test_callbacks_must_be_spider_methods():
    with pytest.raises(PayloadError, match="not a method of spider 's'"):
        encode_request(scrapy.Request("http://e.com", callback=lambda r: None), SPIDER)


def test_meta_must_be_json():
    with pytest.raises(PayloadError, match="JSON"):
        encode_request(scrapy.Request("http://e.com", meta={"obj": object()}), SPIDER)


@pytest.mark.parametrize("payload", [
    "{not json", "[]", '{"x": 1}', '{"u": "http://e.com", "cb": "missing"}',
    '{"u": "http://e.com", "cls": "os.system"}', '{"u": "http://e.com", "cls": "never.imported.Req"}',
    '{"u": "http://e.com", "b": "%%%"}',
])
def test_undecodable_payloads_raise_payload_error(payload):
    with pytest.raises(PayloadError):
        decode_request(payload, SPIDER)


# -- rich meta: tagged JSON ---------------------------------------------------------------

import dataclasses  # noqa: E402
import datetime  # noqa: E402
import decimal  # noqa: E402
import uuid  # noqa: E402
from collections import OrderedDict  # noqa: E402

import attrs  # noqa: E402
import pydantic  # noqa: E402

from scrapy_leased.codec import Codec, ItemClasses  # noqa: E402
from scrapy_leased.settings import LeasedConfigError  # noqa: E402


class Product(scrapy.Item):
    name = scrapy.Field()
    price = scrapy.Field()
    seen = scrapy.Field()


@dataclasses.dataclass
class Offer:
    sku: str
    price: decimal.Decimal = decimal.Decimal("0")
    computed: int = dataclasses.field(default=0, init=False)


@attrs.define
class Review:
    stars: int
    _secret: str = "s"
    when: datetime.datetime | None = None


class Shop(pydantic.BaseModel):
    name: str
    opened: datetime.date


CODEC = Codec(ItemClasses([__name__.split(".")[0]]))  # this test module's package


def rich_roundtrip(request: scrapy.Request) -> scrapy.Request:
    return CODEC.decode(CODEC.encode(request, SPIDER), SPIDER, request.priority)


def test_rich_meta_round_trips_exactly():
    offer = Offer("A1", decimal.Decimal("9.99"))
    offer.computed = 7
    nested = scrapy.Request("http://e.com/n", callback=SPIDER.parse_page, priority=4,
                            meta={"raw": b"\x01"}, cb_kwargs={"t": (1, 2)}, dont_filter=True)
    meta = {
        "item": Product(name="x", price=decimal.Decimal("1.50"),
                        seen=datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.timezone.utc)),
        "offer": offer,
        "review": Review(5, "hidden", datetime.datetime(2026, 2, 3, 4, 5, 6, 7)),
        "shop": Shop(name="s", opened=datetime.date(2020, 5, 6)),
        "raw": b"\x00\xff", "buf": bytearray(b"ab"),
        "when": datetime.datetime(2026, 12, 1, 10, 0, 0, 123),
        "day": datetime.date(2026, 12, 1), "at": datetime.time(7, 8, 9),
        "took": datetime.timedelta(days=1, seconds=2, microseconds=3),
        "money": decimal.Decimal("-0.000100"), "id": uuid.UUID(int=42),
        "pair": (1, ("a", b"b")), "tags": {"x", 1}, "frozen": frozenset({2}),
        "by_id": {1: "one", (2, 3): [4]}, "tag_key": {"$leased": "mine", "v": 1},
        "ordered": OrderedDict([("b", 1), ("a", 2)]),
        "next": nested, "list": [nested, {"deep": [b"d", (None,)]}],
        "plain": {"a": [1, 2.5, True, None, "s"]},
    }
    back = rich_roundtrip(scrapy.Request("http://e.com/r", meta=meta))
    for key, value in meta.items():
        got = back.meta[key]
        if isinstance(value, scrapy.Request):
            assert (type(got), got.url, got.callback, got.priority, got.meta, got.cb_kwargs,
                    got.dont_filter) == (scrapy.Request, value.url, SPIDER.parse_page, 4,
                                         {"raw": b"\x01"}, {"t": (1, 2)}, True)
            continue
        if key == "list":
            assert got[0].url == nested.url and got[1] == value[1]
            continue
        assert got == value, key
        assert type(got) is type(value), key
    assert back.meta["offer"].computed == 7  # a dataclass field with init=False
    assert back.meta["review"]._secret == "hidden"  # an attrs private field


def test_plain_json_payloads_stay_as_compact_as_before():
    r = scrapy.Request("http://example.com/b", meta={"depth": 2, "download_slot": "x",
                                                     "redirect_urls": ["http://a/"]})
    assert CODEC.encode(r, SPIDER) == ('{"u":"http://example.com/b","k":{"depth":2,'
                                       '"download_slot":"x","redirect_urls":["http://a/"]}}')
    assert CODEC.encode(scrapy.Request("http://example.com/a"), SPIDER) == \
        '{"u":"http://example.com/a"}'


def test_str_subclasses_are_stored_as_strings():
    class Text(str):
        pass

    back = rich_roundtrip(scrapy.Request("http://e.com", meta={"link_text": Text("go")}))
    assert back.meta["link_text"] == "go"


@pytest.mark.parametrize(("meta", "where"), [
    ({"obj": object()}, "meta['obj'] is a builtins.object; meta and cb_kwargs may hold"),
    ({"a": [1, {"b": object()}]}, "meta['a'][1]['b'] is a builtins.object"),
    ({"f": lambda: 1}, "meta['f'] is a builtins.function"),
])
def test_what_cannot_be_stored_is_refused_naming_the_request_and_the_key(meta, where):
    with pytest.raises(PayloadError) as e:
        CODEC.encode(scrapy.Request("http://e.com/x", meta=meta), SPIDER)
    assert str(e.value).startswith("cannot store <GET http://e.com/x>: " + where), str(e.value)


def test_item_classes_outside_the_project_are_refused_both_ways():
    from tests.support.outside import OutsideItem

    project = Codec(ItemClasses(["myproject"]))
    with pytest.raises(PayloadError) as e:  # no spider: only the project's modules
        project.encode(scrapy.Request("http://e.com/x", meta={"o": OutsideItem(1)}), None)
    assert str(e.value) == (
        "cannot store <GET http://e.com/x>: meta['o'] is a tests.support.outside.OutsideItem, "
        "an item class outside the project's modules (myproject); add "
        "'tests.support.outside' to LEASED_ITEM_MODULES if it is yours")
    # the spider's own package counts as the project's
    assert type(CODEC.decode(CODEC.encode(scrapy.Request(
        "http://e.com/x", meta={"o": Offer("z")}), SPIDER), SPIDER).meta["o"]) is Offer

    class Local(scrapy.Item):
        v = scrapy.Field()

    with pytest.raises(PayloadError, match=r"meta\['l'\] is a .*Local, an item class defined "
                                           "inside a function"):
        CODEC.encode(scrapy.Request("http://e.com/x", meta={"l": Local(v=1)}), SPIDER)
    for payload, reason in [
        ('{"u":"http://e.com","k":{"x":{"$leased":"item","c":"os:system","v":{}}}}',
         "meta['x']: class 'os:system' is not in one of the project's modules"),
        ('{"u":"http://e.com","kw":{"y":{"$leased":"item","c":"' + __name__ + ':roundtrip",'
         '"v":{}}}}', f"cb_kwargs['y']: '{__name__}:roundtrip' is not an item class"),
        ('{"u":"http://e.com","k":{"z":{"$leased":"nope","v":1}}}', "meta['z']: unknown tag"),
        ('{"u":"http://e.com","k":{"z":{"$leased":"bytes","v":"%%"}}}',
         "meta['z']: bad 'bytes' value"),
    ]:
        with pytest.raises(PayloadError) as e:
            CODEC.decode(payload, SPIDER)
        assert str(e.value).startswith(reason), str(e.value)


def test_item_modules_come_from_spider_modules_and_the_setting():
    from scrapy.settings import Settings

    c = ItemClasses.from_settings(Settings({"SPIDER_MODULES": ["proj.spiders"],
                                            "LEASED_ITEM_MODULES": ["shared.items", "other"]}))
    assert c.modules == ("proj", "shared.items", "other")
    assert c.allows("proj.items") and c.allows("shared.items.x") and not c.allows("shared")
    assert ItemClasses.from_settings(Settings({"LEASED_ITEM_MODULES": "a.b, c"})).modules == \
        ("a.b", "c")
    for bad in (["not a module"], [3], {"a": 1}):
        with pytest.raises(LeasedConfigError, match="LEASED_ITEM_MODULES"):
            ItemClasses.from_settings(Settings({"LEASED_ITEM_MODULES": bad}))


def test_a_callback_is_stored_by_the_name_the_spider_gives_it():
    """#27: a callback made by a factory (scrapy-poet's ``parse_book =
    callback_for(BookPage)``, whose ``__name__`` is ``async_parse``) is found by
    identity, as Scrapy's ``request_to_dict`` finds it, and comes back as the same
    spider attribute."""
    def callback_for(kind: str):
        async def async_parse(self, response):
            yield {"kind": kind}
        return async_parse

    class PoetLike(scrapy.Spider):
        name = "poet_like"
        parse_book = callback_for("book")
        parse_author = callback_for("author")

    spider = PoetLike()
    for attr in ("parse_book", "parse_author"):
        request = scrapy.Request("https://example.com/x", callback=getattr(spider, attr),
                                 errback=getattr(spider, attr))
        back = decode_request(encode_request(request, spider), spider)
        assert back.callback == getattr(spider, attr)
        assert back.errback == getattr(spider, attr)
    with pytest.raises(PayloadError, match="not a method of spider"):
        encode_request(scrapy.Request("https://example.com/y",
                                      callback=callback_for("x").__get__(spider)), spider)
