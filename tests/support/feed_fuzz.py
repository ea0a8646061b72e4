"""Hypothesis strategies of feed entries (docs/feed.md, scrapy_leased/feed/format.py)
for the crawl fuzz test (tests/test_edges_inputs.py): good entries, each a request to a
page of its own on the local test site, and hostile ones, each with a fragment its dead
letter's reason must hold (what is wrong with it).

A good entry: ``/slow/<i>?s=0&f=<n>`` of the site (answered at once, never held), with
random values of the right type in every field the format reads (method, headers, body
or body_base64, meta of any JSON shape, cookies, priority, callback, dont_filter,
encoding, flags, a lane). A hostile entry has one defect: not UTF-8, JSON that is not an
object, an unknown field, no url, a value of the wrong type in any field, a lone
surrogate in any text, NaN / Infinity / a number beyond a double, a priority out of
range, a URL without a scheme, an unknown callback, a bad ``leased_revisit_after``, JSON
nested too deeply.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from hypothesis import strategies as st

from scrapy_leased.codec import MAX_PRIORITY
from scrapy_leased.feed.format import FIELDS

#: every field's JSON type, and values of every other type (for the wrong ones)
_TYPE_OF = {str: "string", dict: "object", int: "integer", bool: "boolean", list: "array"}
SAFE_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]),
                    max_size=12)
ASCII_WORD = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyz0123456789"), min_size=1,
                     max_size=8)
PRINTABLE = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=16)
#: JSON values of any shape (text without lone surrogates, finite numbers)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False) | SAFE_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(SAFE_TEXT, inner, max_size=3),
    max_leaves=6)
SURROGATES = st.sampled_from(["\ud83d", "\udc00", "\udfff", "\ud800"])
LONE = st.builds(lambda a, s, b: a + s + b, ASCII_WORD, SURROGATES, ASCII_WORD)
CALLBACKS = ("parse", "parse_feed", "parse_other")


def _wrong_value(name: str) -> st.SearchStrategy[Any]:
    """A JSON value of another type than the field's (true/false are no integers)."""
    want = FIELDS[name][0]
    kinds = {str: SAFE_TEXT, dict: st.dictionaries(ASCII_WORD, JSON_VALUES, max_size=2),
             int: st.integers(-99, 99), bool: st.booleans(),
             list: st.lists(JSON_VALUES, max_size=2)}
    others = [s for t, s in kinds.items() if t is not want
              and not (want is int and t is bool is False)]
    if want is int:  # a float or a bool is no integer either
        others.append(st.floats(allow_nan=False, allow_infinity=False)
                      .filter(lambda f: not f.is_integer()))
    return st.one_of(st.none(), *others)


@st.composite
def good_entry(draw: Any, base: str, n: int, page: int) -> dict[str, Any]:
    """A good entry for page ``page`` of the site, its URL made unique by ``n``."""
    entry: dict[str, Any] = {"url": f"{base}/slow/{page}?s=0&f={n}"}
    meta = {f"k_{k}": v for k, v in draw(st.dictionaries(ASCII_WORD, JSON_VALUES,
                                                         max_size=3)).items()}
    if draw(st.booleans()):
        meta["leased_lane"] = draw(SAFE_TEXT)
    if meta:
        entry["meta"] = meta
    if draw(st.booleans()):
        entry["method"] = draw(st.sampled_from(["GET", "POST"]))
    if entry.get("method") == "POST":
        body = draw(SAFE_TEXT)
        if draw(st.booleans()):
            entry["body"] = body
        else:
            entry["body_base64"] = base64.b64encode(draw(st.binary(max_size=12))).decode()
    if draw(st.booleans()):
        entry["headers"] = {f"X-F-{k}": draw(PRINTABLE | st.lists(PRINTABLE, max_size=2))
                            for k in draw(st.lists(ASCII_WORD, max_size=2, unique=True))}
    if draw(st.booleans()):
        entry["cookies"] = {f"c{k}": draw(ASCII_WORD)
                            for k in draw(st.lists(ASCII_WORD, max_size=2, unique=True))}
    if draw(st.booleans()):
        entry["priority"] = draw(st.integers(-MAX_PRIORITY, MAX_PRIORITY)
                                 | st.integers(-5, 5))
    if draw(st.booleans()):
        entry["callback"] = draw(st.sampled_from(CALLBACKS))
    if draw(st.booleans()):
        entry["dont_filter"] = draw(st.booleans())
    if draw(st.booleans()):
        entry["encoding"] = draw(st.sampled_from(["utf-8", "latin-1", "ascii"]))
    if draw(st.booleans()):
        entry["flags"] = draw(st.lists(SAFE_TEXT, max_size=2))
    return entry


def _obj(url: str, **fields: Any) -> bytes:
    return json.dumps({"url": url, **fields}).encode()


@st.composite
def hostile_entry(draw: Any, base: str, n: int) -> tuple[bytes, str]:
    """(a hostile entry, a fragment of the reason its dead letter must give). Its URL,
    where it has one, is a page of its own (``/slow/<n>``), so a fetch would be seen."""
    url = f"{base}/slow/{n}?s=0&bad=1"
    kind = draw(st.sampled_from([
        "bytes", "not_object", "unknown", "no_url", "wrong_type", "surrogate",
        "constant", "huge_number", "priority", "no_scheme", "callback", "revisit",
        "deep"]))
    if kind == "bytes":  # not UTF-8: a byte that never starts a UTF-8 sequence inside
        head, tail = draw(st.binary(max_size=20)), draw(st.binary(max_size=20))
        return head + draw(st.sampled_from([b"\xff", b"\xfe", b"\xc0\x80"])) + tail + \
            f" {n}".encode(), "not UTF-8"
    if kind == "not_object":  # JSON of another shape: a bare "URL" without a scheme
        value = draw(st.lists(JSON_VALUES, max_size=3) | st.integers() | st.booleans()
                     | st.floats(allow_nan=False, allow_infinity=False))
        return json.dumps([value, n]).encode() if not isinstance(value, list) \
            else json.dumps([*value, n]).encode(), "not a URL Scrapy takes"
    if kind == "unknown":
        name = draw(ASCII_WORD.filter(lambda k: k not in FIELDS))
        return _obj(url, **{name: draw(JSON_VALUES)}), f"unknown field '{name}'"
    if kind == "no_url":
        fields = {"meta": {"n": n}, **({"priority": 1} if draw(st.booleans()) else {})}
        return json.dumps(fields).encode(), "no 'url'"
    if kind == "wrong_type":
        name = draw(st.sampled_from(sorted(FIELDS)))
        value = draw(_wrong_value(name))
        entry = {"url": url, name: value} if name != "url" else {"url": value, "meta": {"n": n}}
        return json.dumps(entry).encode(), f"'{name}' must be a JSON {_TYPE_OF[FIELDS[name][0]]}"
    if kind == "surrogate":
        text = draw(LONE)
        where = draw(st.sampled_from(["url", "method", "meta_value", "meta_key", "cb_kwargs",
                                      "header", "flags", "callback", "lane"]))
        entry = {"url": url}
        if where == "url":
            entry["url"] = url + text
        elif where == "method":
            entry["method"] = text
        elif where == "meta_value":
            entry["meta"] = {"k": [1, {"t": text}]}
        elif where == "meta_key":
            entry["meta"] = {text: 1}
        elif where == "cb_kwargs":
            entry["cb_kwargs"] = {"q": text}
        elif where == "header":
            entry["headers"] = {"X-T": text}
        elif where == "flags":
            entry["flags"] = [text]
        elif where == "callback":
            entry["callback"] = text
        else:
            entry["meta"] = {"leased_lane": text}
        return json.dumps(entry).encode(), "lone surrogate"
    if kind == "constant":
        constant = draw(st.sampled_from(["NaN", "Infinity", "-Infinity"]))
        field = draw(st.sampled_from(['"meta": {"x": C}', '"priority": C',
                                      '"meta": {"leased_revisit_after": C}']))
        raw = '{"url": "' + url + '", ' + field.replace("C", constant) + "}"
        return raw.encode(), f"{constant.lstrip('-')} is not a JSON number"
    if kind == "huge_number":
        digits = draw(st.integers(309, 2000))
        raw = '{"url": "' + url + '", "meta": {"x": 1e' + str(digits) + "}}"
        return raw.encode(), "out of range (a double)"
    if kind == "priority":
        value = draw(st.integers(MAX_PRIORITY + 1, 10**40) | st.integers(-(10**40),
                                                                         -MAX_PRIORITY - 1))
        return _obj(url, priority=value), "'priority'"
    if kind == "no_scheme":
        path = draw(ASCII_WORD)
        return _obj(f"{path}/slow/{n}"), "not a URL Scrapy takes"
    if kind == "callback":
        name = draw(ASCII_WORD.map(lambda w: "cb_" + w))
        return _obj(url, callback=name), f"callback '{name}' is not a method of spider"
    if kind == "revisit":
        value = draw(st.sampled_from([1e306, -1, "3600", True, [1], {"s": 1}])
                     | st.floats(min_value=1e300, allow_infinity=False))
        return _obj(url, meta={"leased_revisit_after": value}), "leased_revisit_after"
    depth = draw(st.integers(1500, 4000))
    raw = '{"url": "' + url + '", "meta": {"a": ' + "[" * depth + "]" * depth + "}}"
    return raw.encode(), "nested too deeply"


def collect(strategy_for: Any, count: int) -> list[Any]:
    """``count`` values drawn from ``strategy_for(index)``, one per Hypothesis example
    of a derandomized run: reproducible (the same values on every run), varied (the
    examples of a run are distinct), and never shrunk (nothing fails in here). A crawl
    then uses them all at once."""
    from hypothesis import HealthCheck, Phase, given, settings

    out: list[Any] = []

    @settings(max_examples=count, derandomize=True, database=None, deadline=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(st.data())
    def draw(data: Any) -> None:
        out.append(data.draw(strategy_for(len(out))))

    draw()
    return out
