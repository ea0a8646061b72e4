"""The feed's request format: one JSON object per request (docs/feed.md).

A producer in any language pushes entries to the crawl's feed LIST (``RPUSH
leased:{<crawl id>}:feed <entry>``); ``scrapy leased seed`` reads the same entries as
JSON lines, and ``Crawl.push`` takes them as dicts. An entry is a JSON object::

    {"url": "https://example.com/search", "method": "POST",
     "headers": {"Content-Type": "application/json"}, "body": "{\\"q\\": 1}",
     "meta": {"page": 1}, "priority": 5, "callback": "parse_result",
     "errback": "on_error", "dont_filter": false}

Only ``url`` is required. An entry that is not a JSON object (it does not start with
``{``) is taken as a bare URL, as scrapy-redis reads its start URLs. Anything else
(an unknown field, a value of the wrong type, a URL Scrapy refuses, ``NaN`` or
``Infinity`` or a number too large for a double, which are not JSON, a string escape
of a lone surrogate such as ``"\\ud83d"``, which is not text, a priority beyond
``MAX_PRIORITY``) makes the entry unreadable: ``FeedEntryError`` says why, and the
worker draining the feed puts the entry in the dead letters with that reason.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scrapy import Request
from scrapy.utils.httpobj import urlparse_cached

from ..codec import MAX_PRIORITY, unencodable
from ..frontier.scripts import safe_text
from ..meta import shown

#: The fields of an entry, with the JSON type each must have.
FIELDS: dict[str, tuple[type, ...]] = {
    "url": (str,), "method": (str,), "headers": (dict,), "body": (str,),
    "body_base64": (str,), "meta": (dict,), "cb_kwargs": (dict,), "cookies": (dict,),
    "priority": (int,), "callback": (str,), "errback": (str,), "dont_filter": (bool,),
    "encoding": (str,), "flags": (list,),
}
_KWARGS = ("method", "meta", "cb_kwargs", "cookies", "priority", "dont_filter",
           "encoding", "flags")


class FeedEntryError(ValueError):
    """A feed entry cannot be read; the message says why (safe to store and log:
    codec.safe_text)."""

    def __init__(self, message: str) -> None:
        super().__init__(safe_text(str(message)))


def _no_constant(name: str) -> Any:
    raise FeedEntryError(f"not valid JSON ({name} is not a JSON number)")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise FeedEntryError(f"not valid JSON for a request: the number {text[:50]} is out "
                             "of range (a double)")
    return value


@dataclass(frozen=True)
class FeedRequest:
    """A request read from a feed entry; ``callback``/``errback``: the spider methods it
    names (None: the spider's default, as for any request)."""

    request: Request
    callback: str | None = None
    errback: str | None = None

    @property
    def names(self) -> tuple[str | None, str | None]:
        return self.callback, self.errback


def parse_entry(entry: bytes | str | Mapping[str, Any]) -> FeedRequest:
    """The request an entry describes; raise FeedEntryError naming what is wrong (and
    nothing else, whatever the entry holds)."""
    try:
        return _parse(entry)
    except FeedEntryError:
        raise
    except RecursionError:
        raise FeedEntryError("nested too deeply") from None
    except Exception as exc:  # anything else a hand-written entry can cause
        raise FeedEntryError(f"{type(exc).__name__}: {exc}") from None


def _entry_text(entry: bytes | str) -> str:
    """A feed entry as text, stripped; FeedEntryError when not UTF-8 or empty."""
    if isinstance(entry, bytes):
        try:
            entry = entry.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FeedEntryError(f"not UTF-8 ({exc})") from None
    text = entry.strip()
    if not text:
        raise FeedEntryError("empty entry")
    return text


def _json_object(text: str) -> dict[str, Any]:
    """An entry's JSON object (finite numbers only); FeedEntryError when it is not one."""
    try:
        obj = json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except FeedEntryError:
        raise
    except ValueError as exc:
        raise FeedEntryError(f"not valid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise FeedEntryError("not a JSON object")
    return obj


def _parse(entry: bytes | str | Mapping[str, Any]) -> FeedRequest:
    if isinstance(entry, Mapping):
        return _from_object(entry)
    text = _entry_text(entry)
    if not text.startswith("{"):
        return _from_object({"url": text})
    obj = _json_object(text)
    return _from_object(obj)


def _from_object(obj: Mapping[str, Any]) -> FeedRequest:
    unknown = sorted((k for k in obj if k not in FIELDS), key=repr)
    if unknown:
        raise FeedEntryError(f"unknown field {shown(unknown[0])} (fields: "
                             f"{', '.join(FIELDS)})")
    for name, value in obj.items():
        types = FIELDS[name]
        # JSON has one number type: true/false are not integers here
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise FeedEntryError(f"{name!r} must be a JSON {_json_type(types[0])}, not "
                                 f"{_json_shown(value)}")
    if "url" not in obj:
        raise FeedEntryError("no 'url'")
    where = unencodable(dict(obj))
    if where is not None:
        raise FeedEntryError(f"{where} holds a lone surrogate (a \\ud800-\\udfff escape "
                             "that is half of a UTF-16 pair, e.g. a truncated emoji): not "
                             "text")
    priority = obj.get("priority", 0)
    if not -MAX_PRIORITY <= priority <= MAX_PRIORITY:
        raise FeedEntryError(f"'priority' ({shown(priority)}) is out of range: at most "
                             f"{MAX_PRIORITY} either way")
    if "body" in obj and "body_base64" in obj:
        raise FeedEntryError("both 'body' and 'body_base64': give one")
    kwargs: dict[str, Any] = {k: obj[k] for k in _KWARGS if k in obj}
    if "headers" in obj:
        kwargs["headers"] = _headers(obj["headers"])
    if "body" in obj:
        kwargs["body"] = obj["body"].encode("utf-8")
    elif "body_base64" in obj:
        try:
            kwargs["body"] = base64.b64decode(obj["body_base64"], validate=True)
        except (binascii.Error, ValueError) as exc:
            raise FeedEntryError(f"'body_base64' is not base64 ({exc})") from None
    if not all(isinstance(f, str) for f in kwargs.get("flags", ())):
        raise FeedEntryError("'flags' must be a list of strings")
    names = [obj.get("callback"), obj.get("errback")]
    for what, method in zip(("callback", "errback"), names):
        if method is not None and not method.isidentifier():
            raise FeedEntryError(f"{what} {method!r} is not a method name")
    try:
        request = Request(obj["url"], **kwargs)
    except ValueError as exc:  # Scrapy refuses the URL
        raise FeedEntryError(f"not a URL Scrapy takes: {obj['url'][:300]!r} ({exc})") from None
    except (TypeError, LookupError) as exc:  # LookupError: an unknown encoding
        raise FeedEntryError(f"not a request Scrapy takes ({type(exc).__name__}: {exc})"
                             ) from None
    if not urlparse_cached(request).scheme:  # Scrapy only looks for a ':'
        raise FeedEntryError(f"not a URL Scrapy takes: {shown(obj['url'], 300)} (no scheme)")
    return FeedRequest(request, names[0], names[1])


def _headers(headers: dict[str, Any]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name, value in headers.items():
        values = value if isinstance(value, list) else [value]
        if not all(isinstance(v, str) for v in values):
            raise FeedEntryError(f"header {name!r} must be a string or a list of strings")
        out[name] = values
    return out


def _json_shown(value: Any) -> str:
    try:
        return json.dumps(value)[:100]
    except (TypeError, ValueError, RecursionError):  # not JSON (a dict given to push)
        return shown(value)


def _json_type(t: type) -> str:
    return {str: "string", dict: "object", int: "integer", bool: "boolean",
            list: "array"}[t]


def parse_scrapy_redis_entry(entry: bytes | str) -> FeedRequest:
    """A RedisSpider start entry as scrapy-redis reads it (``make_request_from_data``):
    a JSON object with ``url``, optional ``method`` (default GET) and ``meta``, every
    other key a form field (``FormRequest(url, method=..., formdata=..., meta=...)``: a
    GET's fields in the query string, a POST's as an urlencoded body); or a bare URL.
    Like scrapy-redis, the request is ``dont_filter`` (its start entries are taken off
    the list, never deduplicated). Raise FeedEntryError naming what is wrong."""
    try:
        return _parse_scrapy_redis(entry)
    except FeedEntryError:
        raise
    except RecursionError:
        raise FeedEntryError("nested too deeply") from None
    except Exception as exc:
        raise FeedEntryError(f"{type(exc).__name__}: {exc}") from None


def _parse_scrapy_redis(entry: bytes | str) -> FeedRequest:
    from scrapy import FormRequest

    text = _entry_text(entry)
    if not text.startswith("{"):
        return _from_object({"url": text, "dont_filter": True})
    obj = _json_object(text)
    url, method, meta = obj.pop("url", None), obj.pop("method", "GET"), obj.pop("meta", {})
    if not isinstance(url, str):
        raise FeedEntryError("no 'url' (a string)" if url is None else
                             f"'url' must be a JSON string, not {_json_shown(url)}")
    if not isinstance(method, str):
        raise FeedEntryError(f"'method' must be a JSON string, not {_json_shown(method)}")
    if not isinstance(meta, dict):
        raise FeedEntryError(f"'meta' must be a JSON object, not {_json_shown(meta)}")
    for name, value in obj.items():  # form fields: what FormRequest takes
        values = value if isinstance(value, list) else [value]
        if not all(isinstance(v, str) for v in values):
            raise FeedEntryError(f"form field {shown(name)} must be a string or a list of "
                                 f"strings (scrapy-redis sends it with FormRequest), not "
                                 f"{_json_shown(value)}")
    where = unencodable({"url": url, "meta": meta, "form": obj})
    if where is not None:
        raise FeedEntryError(f"{where} holds a lone surrogate: not text")
    try:
        form = FormRequest(url, method=method.upper(), formdata=obj or None, meta=meta,
                           dont_filter=True)
    except ValueError as exc:
        raise FeedEntryError(f"not a URL Scrapy takes: {shown(url, 300)} ({exc})") from None
    if not urlparse_cached(form).scheme:
        raise FeedEntryError(f"not a URL Scrapy takes: {shown(url, 300)} (no scheme)")
    # a plain Request with what FormRequest made of the fields (URL, body, headers)
    request = Request(form.url, method=form.method, headers=form.headers, body=form.body,
                      meta=dict(form.meta), dont_filter=True)
    return FeedRequest(request)
