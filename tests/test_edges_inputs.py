"""One rule for every unit of input, on the request side (issue #24): a request from a
spider, a child request, a feed entry, a redirect either works, or it is refused alone
(a dropped request with its reason, or a dead letter naming it and the reason), and
everything else goes on. Unit tests of the codec, the feed format and the ``leased_*``
meta readers (no Redis), Hypothesis properties of the same, and real crawls: a child
request that cannot be stored among good ones, a fuzz test pushing good and hostile
feed entries of hand-written kinds to a 2-worker crawl before it starts, and one pushing
Hypothesis-drawn good and hostile entries (tests/support/feed_fuzz.py) into a running
2-worker crawl.
"""

from __future__ import annotations

import datetime
import decimal
import json
import math
import random
import uuid
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.connection import Encoder
from scrapy import Request, Spider
from scrapy.settings import Settings
from scrapy.utils.request import RequestFingerprinter

from scrapy_leased.codec import MAX_PRIORITY, Codec, PayloadError
from scrapy_leased.feed import FeedEntryError, parse_entry
from scrapy_leased.feed.packer import RequestPacker
from scrapy_leased.frontier import as_str
from scrapy_leased.frontier.keys import CrawlKeys
from scrapy_leased.frontier.scripts import safe_text
from scrapy_leased.meta import MAX_REVISIT_MS, META_REVISIT_AFTER, claim_token, revisit_ms
from scrapy_leased.settings import Budgets
from tests.test_crawl import assert_exit, stat

# bounded, reproducible: the same examples on every run (no flakes, no example database)
PROPS = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow])
#: redis-py's own encoder, as a client built with the defaults uses it
ENCODER = Encoder("utf-8", "strict", False)
WAIT = 60  # hang guard: the old code hangs for ever here


class EdgeSpider(Spider):
    name = "edges"

    def parse(self, response: Any) -> None:
        pass

    def parse_item(self, response: Any) -> None:
        pass


SPIDER = EdgeSpider()
CODEC = Codec()
PACKER = RequestPacker(RequestFingerprinter(), 8, CODEC, Budgets.from_settings(Settings()))


def redis_can_send(*values: Any) -> None:
    """What redis-py does to each argument of a command: raises as it would."""
    for v in values:
        ENCODER.encode(v)


# --------------------------------------------------------------------------- the codec


@pytest.mark.parametrize("kwargs, where", [
    ({"meta": {"title": "caf\ud83d"}}, "['meta']['title']"),
    ({"meta": {"\udc00": 1}}, "['meta']['\\udc00'] (the key)"),
    ({"meta": {"t": ("a", {"b": "\ud83d"})}}, "['meta']['t']"),
    ({"cb_kwargs": {"q": ["ok", "\ud83d"]}}, "['cb_kwargs']['q'][1]"),
    ({"method": "G\ud83dT"}, "['method']"),
    ({"cookies": {"c": "\ud83d"}}, "['cookies']['c']"),
    ({"flags": ["\ud83d"]}, "['flags'][0]"),
])
def test_a_lone_surrogate_is_refused_by_the_codec_naming_where(kwargs, where):
    """json.dumps writes a lone surrogate as it is (ensure_ascii=False) and redis-py
    then raised UnicodeEncodeError; the codec refuses it with PayloadError naming the
    field, and its message can be stored itself."""
    request = Request("https://example.com/a", **kwargs)
    with pytest.raises(PayloadError) as exc:
        CODEC.encode(request, SPIDER)
    assert where in str(exc.value) and "lone surrogate" in str(exc.value)
    str(exc.value).encode("utf-8")  # the message itself is text Redis takes


class Prio(int):
    pass


@pytest.mark.parametrize("kwargs, why", [
    ({"priority": True}, "priority (True) is not an integer"),
    ({"priority": MAX_PRIORITY + 1}, "out of range"),
    ({"priority": -(10**30)}, "out of range"),
    ({"priority": 10**5000}, "an integer of 16610 bits"),
    ({"meta": {META_REVISIT_AFTER: 1e306}}, "leased_revisit_after"),
    ({"meta": {META_REVISIT_AFTER: "3600"}}, "leased_revisit_after"),
    ({"meta": {"n": 10**5000}}, "cannot be written as JSON"),
])
def test_what_redis_or_lua_cannot_take_is_refused_by_the_codec(kwargs, why):
    """A bool priority made redis-py raise DataError (a RedisError: the writer retried
    it for ever), a priority past 2**53 is not exact in Lua, a huge revisit raised
    OverflowError, an int of more digits than Python prints raised ValueError: each is
    a PayloadError now, with its reason."""
    with pytest.raises(PayloadError, match=None) as exc:
        CODEC.encode(Request("https://example.com/a", **kwargs), SPIDER)
    assert why in str(exc.value)


def test_a_meta_holding_itself_is_a_payload_error_not_a_recursion_error():
    meta: dict[str, Any] = {}
    meta["self"] = meta
    with pytest.raises(PayloadError, match="nested too deeply"):
        CODEC.encode(Request("https://example.com/a", meta=meta), SPIDER)


def test_an_int_subclass_priority_is_queued_as_a_plain_int():
    """redis-py sends an int subclass as repr(): an IntEnum as '<P.HIGH: 5>'."""
    new = PACKER.pack(Request("https://example.com/a", priority=Prio(5)))
    assert type(new.priority) is int and new.priority == 5
    redis_can_send(new.priority)


# --------------------------------------------------------------------------- meta readers


def _meta(value: Any) -> Request:
    return Request("https://example.com/", meta={META_REVISIT_AFTER: value})


@pytest.mark.parametrize("value", [1e306, math.inf, -math.inf, math.nan, -1, -0.5,
                                   10**400, 10**16, "3600", "", True, False, [1], {"s": 1},
                                   decimal.Decimal("NaN"), decimal.Decimal("1e400")])
def test_revisit_ms_raises_value_error_for_what_does_not_fit(value):
    with pytest.raises(ValueError, match="leased_revisit_after"):
        revisit_ms(_meta(value), 0)


@pytest.mark.parametrize("value, ms", [(0, 0), (3600, 3_600_000), (1.5, 1500),
                                       (decimal.Decimal("2.5"), 2500),
                                       (MAX_REVISIT_MS // 1000, MAX_REVISIT_MS // 1000 * 1000)])
def test_revisit_ms_of_good_values(value, ms):
    assert revisit_ms(_meta(value), 7) == ms
    assert revisit_ms(Request("https://example.com/"), 7) == 7


@pytest.mark.parametrize("value", [None, "1", [1], True, 1.0])
def test_claim_token_of_something_else_is_none(value):
    assert claim_token(Request("https://example.com/", meta={"_leased_claim": value})) is None
    assert claim_token(Request("https://example.com/", meta={"_leased_claim": 42})) == 42


# --------------------------------------------------------------------------- the feed format


def _feed(**fields: Any) -> bytes:
    return json.dumps({"url": "https://example.com/p", **fields}).encode()


@pytest.mark.parametrize("raw, why", [
    (_feed(meta={"t": "\ud83d"}), "['meta']['t'] holds a lone surrogate"),
    (_feed(method="P\ud83dST"), "['method'] holds a lone surrogate"),
    (_feed(cb_kwargs={"\ud83d": 1}), "['cb_kwargs']['\\ud83d'] (the key)"),
    (_feed(headers={"X": ["a", "\udc00"]}), "['headers']['X'][1]"),
    (_feed(headers={"\udc00": "a"}), "['headers']['\\udc00'] (the key)"),
    (_feed(body="\ud83d"), "['body']"),
    (_feed(cookies={"c": "\ud83d"}), "['cookies']['c']"),
    (json.dumps({"url": "https://example.com/\ud83d"}).encode(), "['url']"),
    (b'{"url": "https://example.com/p", "meta": {"x": NaN}}', "NaN is not a JSON number"),
    (b'{"url": "https://example.com/p", "meta": {"x": -Infinity}}', "-Infinity"),
    (b'{"url": "https://example.com/p", "meta": {"x": 1e400}}', "1e400 is out of range"),
    (_feed(priority=10**30), "'priority' (1000000000000000000000000000000) is out of range"),
    (_feed(priority=-(2**53)), "out of range"),
])
def test_feed_entries_the_old_format_let_through(raw, why):
    """Each parsed into a request before, which redis-py or Lua could not take."""
    with pytest.raises(FeedEntryError) as exc:
        parse_entry(raw)
    assert why in str(exc.value), str(exc.value)
    str(exc.value).encode("utf-8")


@pytest.mark.parametrize("meta", [{META_REVISIT_AFTER: 1e306}, {META_REVISIT_AFTER: "5"},
                                  {META_REVISIT_AFTER: -1}, {META_REVISIT_AFTER: True}])
def test_a_feed_entry_with_a_bad_revisit_is_refused_when_packed(meta):
    fed = parse_entry(_feed(meta=meta))
    with pytest.raises(PayloadError, match="leased_revisit_after"):
        PACKER.pack(fed.request, fed.names)


# --------------------------------------------------------------------------- properties

#: lone surrogates, beside ordinary text (Hypothesis' text() leaves surrogates out)
SURROGATES = st.sampled_from(["\ud83d", "\udc00", "\udfff", "\ud800"])
TEXT = st.one_of(st.text(max_size=8),
                 st.builds(lambda a, s, b: a + s + b, st.text(max_size=3), SURROGATES,
                           st.text(max_size=3)))
NUMBERS = st.one_of(st.integers(), st.integers(min_value=-(10**30), max_value=10**30),
                    st.floats(allow_nan=True, allow_infinity=True), st.booleans())
JSON = st.recursive(st.none() | NUMBERS | TEXT,
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(TEXT, inner, max_size=4), max_leaves=12)
FIELD_NAMES = st.sampled_from(["url", "method", "headers", "body", "body_base64", "meta",
                               "cb_kwargs", "cookies", "priority", "callback", "errback",
                               "dont_filter", "encoding", "flags", "other"])
URLS = st.one_of(st.just("https://example.com/p"), st.just("no-scheme"), TEXT,
                 st.builds(lambda t: "https://example.com/" + t, TEXT))
ENTRY_OBJECTS = st.builds(lambda url, more: {"url": url, **more}, URLS,
                          st.dictionaries(FIELD_NAMES, JSON, max_size=4)) | \
    st.dictionaries(FIELD_NAMES, JSON, max_size=5)
#: entries of the right shape, whose values may still be hostile
WELL_TYPED = st.fixed_dictionaries(
    {"url": st.just("https://example.com/p") | st.builds(lambda t: "https://example.com/" + t,
                                                         TEXT)},
    optional={"method": TEXT, "meta": st.dictionaries(TEXT, JSON, max_size=3),
              "cb_kwargs": st.dictionaries(TEXT, JSON, max_size=2),
              "headers": st.dictionaries(TEXT, TEXT | st.lists(TEXT, max_size=2), max_size=2),
              "cookies": st.dictionaries(TEXT, TEXT, max_size=2), "body": TEXT,
              "priority": st.integers(), "callback": st.sampled_from(["parse", "parse_item"]),
              "dont_filter": st.booleans(), "flags": st.lists(TEXT, max_size=2)})


def _check_parsed(raw: Any) -> None:
    """parse_entry gives a request, or FeedEntryError and nothing else; a request it
    gives is packed (or refused with PayloadError) into what redis-py sends as is."""
    try:
        fed = parse_entry(raw)
    except FeedEntryError as exc:
        str(exc).encode("utf-8")
        return
    try:
        new = PACKER.pack(fed.request, fed.names)
    except PayloadError as exc:
        str(exc).encode("utf-8")
        return
    redis_can_send(new.payload, new.priority, new.lane, new.order)
    assert -MAX_PRIORITY <= new.priority <= MAX_PRIORITY


@PROPS
@given(st.binary(max_size=200))
def test_any_bytes_parse_or_raise_the_feeds_own_error(raw):
    _check_parsed(raw)


@PROPS
@given(ENTRY_OBJECTS | WELL_TYPED)
def test_any_json_entry_parses_or_raises_the_feeds_own_error(obj):
    """Any JSON object an outside producer can push (lone surrogates as \\u escapes,
    huge numbers, wrong types, unknown fields), as text and as the dict Crawl.push
    takes."""
    try:
        text = json.dumps(obj)  # NaN/Infinity as JSON's extensions, surrogates escaped
    except ValueError:  # an int of more digits than Python prints
        return
    _check_parsed(text.encode())
    _check_parsed(text)
    _check_parsed(obj)


@PROPS
@given(st.text(alphabet=st.sampled_from('{}[]":,0123456789.eE+-truefalsnNaIinfy\\u d8'),
               max_size=60))
def test_json_like_text_parses_or_raises_the_feeds_own_error(text):
    _check_parsed("{" + text)
    _check_parsed(text)


STORABLE = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=False) | st.text(max_size=6)
    | st.binary(max_size=6) | st.decimals(allow_nan=False) | st.uuids()
    | st.datetimes() | st.dates() | st.timedeltas(),
    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    | st.dictionaries(st.integers(-5, 5), inner, max_size=2)
    | st.frozensets(st.integers(-9, 9), max_size=3), max_leaves=10)


@PROPS
@given(meta=st.dictionaries(st.text(max_size=5).filter(lambda k: not k.startswith("_leased")
                                                        and not k.startswith("leased_")),
                            STORABLE, max_size=4),
       cb_kwargs=st.dictionaries(st.text(max_size=5), STORABLE, max_size=3),
       priority=st.integers(-MAX_PRIORITY, MAX_PRIORITY),
       method=st.sampled_from(["GET", "POST", "PUT"]), body=st.binary(max_size=20),
       path=st.text(max_size=10))
def test_the_codec_gives_back_everything_it_accepts(meta, cb_kwargs, priority, method,
                                                    body, path):
    request = Request("https://example.com/" + path, method=method, meta=meta,
                      cb_kwargs=cb_kwargs, body=body, callback=SPIDER.parse_item)
    payload = CODEC.encode(request, SPIDER)
    redis_can_send(payload, priority)
    back = CODEC.decode(payload, SPIDER, priority)
    assert (back.url, back.method, back.body, back.priority) == \
        (request.url, request.method, request.body, priority)
    assert back.meta == meta and back.cb_kwargs == cb_kwargs
    assert back.callback == SPIDER.parse_item


ANY_META = st.one_of(JSON, st.decimals(), st.builds(uuid.uuid4),
                     st.just(datetime.date(2026, 1, 1)), st.just(float("nan")))


@PROPS
@given(meta=st.dictionaries(st.one_of(TEXT, st.sampled_from(["leased_lane",
                                                              "leased_revisit_after",
                                                              "download_slot"])),
                            ANY_META, max_size=4),
       priority=st.one_of(st.integers(), st.booleans()), method=TEXT)
def test_whatever_the_codec_accepts_redis_py_can_send(meta, priority, method):
    """Any meta (lone surrogates, huge numbers, nan, leased_* keys of any type), any
    priority, any method: encode raises PayloadError, or gives a payload, priority and
    lane that redis-py sends as they are."""
    try:
        request = Request("https://example.com/", method=method or "GET", meta=meta,
                          priority=priority)
    except (TypeError, ValueError):  # Scrapy itself refuses it
        return
    try:
        new = PACKER.pack(request)
    except PayloadError as exc:
        str(exc).encode("utf-8")
        return
    redis_can_send(new.payload, new.priority, new.lane)
    assert "|" not in new.lane
    CODEC.decode(new.payload, SPIDER, new.priority)


@PROPS
@given(st.one_of(NUMBERS, TEXT, JSON, st.decimals(), st.none()))
def test_revisit_ms_is_a_bounded_int_or_a_value_error(value):
    try:
        ms = revisit_ms(_meta(value), 5)
    except ValueError as exc:
        assert META_REVISIT_AFTER in str(exc)
        str(exc).encode("utf-8")
        return
    assert type(ms) is int and 0 <= ms <= MAX_REVISIT_MS
    redis_can_send(ms)


@PROPS
@given(st.one_of(NUMBERS, TEXT, JSON))
def test_claim_token_is_an_int_or_none(value):
    token = claim_token(Request("https://example.com/", meta={"_leased_claim": value}))
    assert token is None or type(token) is int


@PROPS
@given(TEXT)
def test_safe_text_is_utf8_and_keeps_what_was_text(text):
    out = safe_text(text)
    out.encode("utf-8")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        assert "\\ud" in out
    else:
        assert out == text


# --------------------------------------------------------------------------- a crawl


def test_a_child_that_cannot_be_stored_is_dropped_alone(redis_server, make_site,
                                                        start_worker, crawl_id):
    """/p/0 yields 13 children that cannot be stored (lone surrogates in meta, a meta
    key, cb_kwargs, the method, the lane; bool, IntEnum-free huge priority; bad
    leased_revisit_after; a meta holding itself; an int of 5000 digits) among good ones
    and a redirect; /p/4's callback raises an error whose text holds a lone surrogate.
    Before, the first such child killed the commit writer: the parent's ack and its
    siblings were lost and the worker never closed. Now each bad child is dropped with
    its reason (leased/unserializable) and kept as a dead letter, the others are crawled
    once, /p/4 is a dead letter with its reason escaped, and the worker ends
    ``finished``."""
    from tests.project.testproject.spiders.edges_inputs import BAD_CHILDREN

    site = make_site(pages=200)
    r = redis_server.client()
    w = start_worker(redis_server.url, crawl_id, site.url + "/p/0", spider="edges_inputs",
                     settings={"LEASED_LEASE_SECONDS": 5})
    assert w.wait(WAIT) == 0 and w.close_reason() == "finished", w.log_tail(60)
    # the one traceback: Scrapy's log of /p/4's callback error
    assert w.log_text().count("Traceback") == 1, w.log_tail(80)
    paths = Counter(e["path"] for e in site.entries())
    assert paths == Counter(["/p/0", "/p/1", "/p/2", "/redirect/3", "/p/3", "/p/4"]), paths
    assert {it["url"] for it in w.items()} == {site.url + f"/p/{i}" for i in range(4)}
    log = w.log_text()
    assert log.count("Dropped a request that cannot be stored") == len(BAD_CHILDREN), log
    assert w.stats().get("leased/unserializable") == len(BAD_CHILDREN)
    for i in range(len(BAD_CHILDREN)):
        assert f"/p/{100 + i}" not in paths
    assert stat(r, crawl_id, "done") == 5  # /p/0-3 and the redirect's own claim
    letters = [json.loads(v) for v in r.hgetall(CrawlKeys(crawl_id).dead).values()]
    dead = [d for d in letters if not d.get("dropped")]
    assert len(dead) == 1 and "/p/4" in dead[0]["envelope"], dead
    assert "callback error" in dead[0]["reason"] and "caf\\ud83d" in dead[0]["reason"], dead
    # each dropped child a dead letter of its own (issue 27), its reason escaped too
    dropped = {d["url"]: d for d in letters if d.get("dropped")}
    assert set(dropped) == {site.url + f"/p/{100 + i}" for i in range(len(BAD_CHILDREN))}
    assert all(d["reason"].startswith("cannot store <") for d in dropped.values()), dropped
    assert dropped[site.url + "/p/100"]["removed"] == ["meta['title']"]
    assert dropped[site.url + "/p/103"]["method"] == "G\\ud83dT"
    assert stat(r, crawl_id, "dropped") == len(BAD_CHILDREN)


# --------------------------------------------------------------------------- the fuzz crawl

FUZZ_SEED = 20261201
FUZZ_GOOD = 100
FUZZ_BAD = 30


def _good_entry(site_url: str, i: int, rng: random.Random) -> dict[str, Any]:
    url = f"{site_url}/p/{i}"
    kind = rng.randrange(5)
    if kind == 0:
        return {"url": url}
    if kind == 1:
        return {"url": url, "method": "POST", "body": json.dumps({"i": i, "q": "é☕"}),
                "headers": {"Content-Type": "application/json"}, "callback": "parse_feed",
                "meta": {"i": i, "nested": {"x": [1, 2.5, None, "ü"]}}}
    if kind == 2:
        return {"url": url, "priority": rng.randrange(-5, 6), "callback": "parse_other",
                "meta": {"i": i, "big": 2**62, "leased_revisit_after": 0}}
    if kind == 3:
        return {"url": url, "dont_filter": True, "meta": {"i": i, "leased_lane": "lane-a"}}
    return {"url": url, "priority": rng.choice([MAX_PRIORITY, -MAX_PRIORITY, 0]),
            "callback": "parse_feed", "meta": {"i": i}}


def _hostile(site_url: str, j: int) -> list[bytes]:
    """Hostile entries; each names its own page /p/<1000 + index> so that a fetch of
    one would be seen."""
    def page(k: int) -> str:
        return f"{site_url}/p/{1000 + j * 100 + k}"

    def obj(k: int, **fields: Any) -> bytes:
        return json.dumps({"url": page(k), **fields}).encode()

    deep = b"[" * 3000 + b"]" * 3000
    return [
        json.dumps({"url": page(0) + "\ud83d"}).encode(),
        obj(1, meta={"t": "caf\ud83d"}),
        obj(2, meta={"\udc00": 1}),
        obj(3, method="P\ud83dST"),
        obj(4, cb_kwargs={"q": "\ud83d"}),
        obj(5, headers={"X-T": "\ud83d"}),
        obj(6, headers={"\ud83d": "v"}),
        obj(7, body="\udfff", method="POST"),
        obj(8, callback="parse\ud83d"),
        obj(9, meta={"leased_lane": "l\ud83d"}),
        obj(10, priority=10**30),
        obj(11, priority=-(2**60)),
        b'{"url": "' + page(12).encode() + b'", "meta": {"x": NaN}}',
        b'{"url": "' + page(13).encode() + b'", "meta": {"x": Infinity}}',
        b'{"url": "' + page(14).encode() + b'", "meta": {"x": 1e999}}',
        b'{"url": "' + page(15).encode() + b'", "meta": {"x": ' + b"9" * 5000 + b"}}",
        obj(16, priority=1.5),
        obj(17, priority=True),
        obj(18, meta=[1, 2]),
        obj(19, dont_filter="yes"),
        b'{"url": "' + page(20).encode() + b'", "meta": {"a": ' + deep + b"}}",
        json.dumps({"url": "no-scheme/p/" + str(21 + j)}).encode(),
        obj(22, callback="nope"),
        obj(23, meta={"leased_revisit_after": 1e306}),
        obj(24, meta={"leased_revisit_after": "3600"}),
        obj(25, meta={"leased_revisit_after": -1}),
        obj(26, meta={"leased_revisit_after": True}),
        b'{"url": "' + page(27).encode() + b'", "meta": {"leased_revisit_after": 1e400}}',
        b"\xff\xfe" + page(28).encode(),
        obj(29, body_base64="not base64!"),
        obj(30, unknown=1),
        json.dumps([page(31)]).encode(),
    ]


def test_fuzz_a_feed_of_good_and_hostile_entries_before_the_fleet_starts(
        redis_server, make_site, start_worker, crawl_id):
    """100 good entries and 30 hostile ones (drawn with a fixed seed from 32 kinds: lone
    surrogates in every field, huge numbers, NaN/Infinity, wrong types, deep nesting, bad
    URLs, unknown callbacks, bad leased_* meta, not UTF-8), shuffled and pushed to the
    feed before 2 workers start: every good entry is fetched exactly once, every hostile
    one is a dead letter with a reason, nothing is left in the feed and both workers end
    ``finished``. (Before: the first lone surrogate held its batch for ever.)"""
    rng = random.Random(FUZZ_SEED)
    site = make_site(pages=1200)
    r = redis_server.client()
    keys = CrawlKeys(crawl_id)
    good = [_good_entry(site.url, i, rng) for i in range(FUZZ_GOOD)]
    kinds = _hostile(site.url, 0)
    bad = rng.sample(kinds, FUZZ_BAD)
    entries = [json.dumps(e).encode() for e in good] + bad
    rng.shuffle(entries)
    r.rpush(keys.feed, *entries)

    fast = {"LEASED_LEASE_SECONDS": 3, "LEASED_SWEEP_INTERVAL": 0.5}
    workers = [start_worker(redis_server.url, crawl_id, None, name=f"w{i}", spider="feed",
                            settings=fast) for i in range(2)]
    for w in workers:
        assert_exit(w, "finished", timeout=WAIT)

    fetched = Counter(e["path"] for e in site.entries())
    assert fetched == Counter(f"/p/{i}" for i in range(FUZZ_GOOD)), \
        {p: n for p, n in fetched.items() if n != 1 or not p.startswith("/p/")
         or int(p[3:]) >= FUZZ_GOOD}
    assert stat(r, crawl_id, "done") == FUZZ_GOOD
    items = [it for w in workers for it in w.items()]
    assert sorted(it["url"] for it in items) == sorted(e["url"] for e in good)

    dead = {as_str(f): json.loads(v) for f, v in r.hgetall(keys.dead).items()}
    assert all(f.startswith("feed:") for f in dead), dead
    by_entry = {d["entry"]: d["reason"] for d in dead.values()}
    assert len(by_entry) == FUZZ_BAD
    for entry in bad:
        text = entry.decode("utf-8", "replace").replace("\ufffd", "?")
        assert by_entry.get(text, "").startswith("feed entry: "), (text[:200], by_entry)
    assert r.llen(keys.feed) == 0 and r.hlen(keys.feed_taken) == 0


FUZZ_RUNNING_GOOD = 200
FUZZ_RUNNING_BAD = 100
FUZZ_WAVES = 4


def test_fuzz_hostile_feed_entries_into_a_running_2_worker_crawl(
        redis_server, make_site, start_worker, crawl_id):
    """Hypothesis draws 200 good feed entries (random values of the right type in every
    field the format reads: method, headers, body or body_base64, meta of any JSON shape,
    cookies, priority up to the limits, callback, dont_filter, encoding, flags, a lane)
    and 100 hostile ones (tests/support/feed_fuzz.py: not UTF-8, JSON of another shape,
    unknown fields, no url, a wrong type in every field, lone surrogates anywhere, NaN,
    Infinity, numbers beyond a double, priorities out of range, URLs without a scheme,
    unknown callbacks, bad leased_revisit_after, deep nesting), derandomized: the same
    entries on every run. They are pushed in 4 waves into a RUNNING crawl of 2 workers
    (its start page held, so it cannot end in between; each wave once the last is
    drained). Every good entry is fetched exactly once (the site's log), every hostile
    one is a dead letter whose reason says what is wrong, the feed is empty, and both
    workers end ``finished``."""
    from urllib.parse import urlsplit

    from tests.support.feed_fuzz import collect, good_entry, hostile_entry
    from tests.support.workers import wait_for

    site = make_site(pages=FUZZ_RUNNING_GOOD + 1100)
    base = site.url
    good = collect(lambda n: good_entry(base, n, n + 1), FUZZ_RUNNING_GOOD)
    bad = collect(lambda n: hostile_entry(base, 1000 + n), FUZZ_RUNNING_BAD)
    assert len(good) == FUZZ_RUNNING_GOOD and len({e for e, _ in bad}) == FUZZ_RUNNING_BAD
    entries = [json.dumps(e).encode() for e in good]
    for i, (raw, _) in enumerate(bad):  # spread over the good ones, every wave has some
        entries.insert(i * 3 % (len(entries) + 1), raw)
    r = redis_server.client()
    keys = CrawlKeys(crawl_id)

    site.hold()  # the start page: the crawl is on until it is released
    fast = {"LEASED_LEASE_SECONDS": 3, "LEASED_SWEEP_INTERVAL": 0.5}
    workers = [start_worker(redis_server.url, crawl_id, site.url + "/p/0", name=f"w{i}",
                            spider="feed", settings=fast) for i in range(2)]
    wait_for(lambda: r.zcard(keys.leases) >= 1 and r.zcard(keys.workers) == 2, WAIT,
             "2 workers running, the start page claimed", workers)
    size = -(-len(entries) // FUZZ_WAVES)
    for start in range(0, len(entries), size):
        r.rpush(keys.feed, *entries[start:start + size])
        wait_for(lambda: r.llen(keys.feed) == 0 and r.hlen(keys.feed_taken) == 0, WAIT,
                 "the wave drained", workers)
        assert all(w.running for w in workers)
    wait_for(lambda: stat(r, crawl_id, "done") == FUZZ_RUNNING_GOOD, WAIT,
             "every good entry done", workers)
    site.release()
    for w in workers:
        assert_exit(w, "finished", timeout=WAIT)

    def path(url: str) -> str:
        parts = urlsplit(url)
        return f"{parts.path}?{parts.query}"

    fetched = Counter(e["path"] for e in site.entries())
    expected = Counter(["/p/0"] + [path(e["url"]) for e in good])
    assert fetched == expected, ({p: n for p, n in fetched.items() if expected[p] != n},
                                 [p for p in expected if p not in fetched][:10])
    assert stat(r, crawl_id, "done") == FUZZ_RUNNING_GOOD + 1
    dead = {as_str(f): json.loads(v) for f, v in r.hgetall(keys.dead).items()}
    assert all(f.startswith("feed:") for f in dead), dead
    by_entry = {d["entry"]: d["reason"] for d in dead.values()}
    assert len(by_entry) == FUZZ_RUNNING_BAD, len(by_entry)
    for raw, fragment in bad:
        text = raw.decode("utf-8", "replace").replace("\ufffd", "?")
        reason = by_entry.get(text, "")
        assert reason.startswith("feed entry: ") and fragment in reason, \
            (text[:200], fragment, reason)
    assert r.llen(keys.feed) == 0 and r.hlen(keys.feed_taken) == 0


# --------------------------------------------------------------------------- the claim path


def test_a_stored_request_with_a_bad_revisit_is_a_dead_letter_at_claim(
        redis_server, make_site, start_worker, crawl_id):
    """Requests already in Redis (queued by an older version, or by hand) whose
    leased_revisit_after does not fit: 1e306 raised OverflowError in meta.revisit_ms,
    which _absorb did not catch, so the claim loop ended silently and the next worker's
    claim loop too. Each is now a dead letter naming the meta key, beside undecodable
    payloads; the good requests are crawled and the worker ends ``finished``."""
    from scrapy_leased.frontier import NewRequest
    from tests.test_crawl import payload, run_frontier

    site = make_site(pages=100)
    r = redis_server.client()
    keys = CrawlKeys(crawl_id)
    lane = "127.0.0.1"

    def revisit(i: int, raw: str) -> str:
        return f'{{"u":"{site.url}/p/{i}","k":{{"leased_revisit_after":{raw}}}}}'

    bad = {revisit(50, "1e306"): "leased_revisit_after", revisit(51, "1" + "0" * 400):
           "leased_revisit_after", revisit(52, "NaN"): "leased_revisit_after",
           revisit(53, "-1"): "leased_revisit_after", revisit(54, '"3600"'):
           "leased_revisit_after", '{"u": 5}': "payload", "not json": "undecodable payload"}
    good = [payload(f"{site.url}/p/{i}") for i in (1, 2, 3)]
    stored = [good[0], *list(bad)[:4], good[1], *list(bad)[4:], good[2]]

    async def body(f):
        await f.check_layout(14)
        await f.enqueue([NewRequest(p, lane=lane) for p in stored])

    run_frontier(redis_server.url, crawl_id, body)
    w = start_worker(redis_server.url, crawl_id, None, spider="feed",
                     settings={"LEASED_LEASE_SECONDS": 3})
    assert_exit(w, "finished", timeout=WAIT)
    assert Counter(e["path"] for e in site.entries()) == Counter(["/p/1", "/p/2", "/p/3"])
    dead = [json.loads(v) for v in r.hgetall(keys.dead).values()]
    by_payload = {d["envelope"].split("|", 5)[5]: d["reason"] for d in dead}
    assert set(by_payload) == set(bad), by_payload
    for p, why in bad.items():
        assert why in by_payload[p], (p, by_payload[p])
    assert stat(r, crawl_id, "done") == 3
