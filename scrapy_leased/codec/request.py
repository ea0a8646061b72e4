"""A request as compact tagged JSON and back (``Codec``): only non-default fields,
under short names; meta, cb_kwargs, cookies, flags and a subclass's attributes packed
value by value (tagged where JSON has no type for them)."""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import sys
import uuid
from collections import OrderedDict
from typing import Any

from itemadapter import ItemAdapter
from scrapy import Request, Spider
from scrapy.settings import BaseSettings

from ..meta import PRIVATE_META_PREFIX, revisit_ms, shown
from .callbacks import callable_name, request_class, resolve_callable
from .classes import ItemClasses
from .items import build_item
from .refusal import PayloadError, Unstorable, path_text, refusal, unencodable

TAG = "$leased"
_DIRECT = ("method", "cookies", "meta", "encoding", "dont_filter", "flags", "cb_kwargs")
_DEFAULTS: dict[str, Any] = {
    "method": "GET", "cookies": {}, "meta": {}, "encoding": "utf-8",
    "dont_filter": False, "flags": [], "cb_kwargs": {},
}
_SHORT = {"method": "m", "cookies": "c", "meta": "k", "encoding": "e",
          "dont_filter": "f", "flags": "fl", "cb_kwargs": "kw"}
_LONG = {v: k for k, v in _SHORT.items()}
_PACKED = ("cookies", "meta", "flags", "cb_kwargs")  # may hold more than JSON
_HANDLED = {"url", "headers", "body", "priority", "callback", "errback", *_DIRECT}
_SIMPLE = (str, int, float, bool, type(None))



#: The largest priority a stored request may have (and minus it the smallest): Redis's
#: Lua numbers are doubles, exact up to 2**53 (lua/lib_settle.lua: tier_code).
MAX_PRIORITY = 2**53 - 1
#: Where a field of a payload comes from, for messages (``meta['x']``).
_FIELD_NAMES = {"u": "url", "h": "headers", "b": "body", "cb": "callback", "eb": "errback",
                "x": "attribute", "cls": "class", "p": "priority", **_LONG}


def poet_injected(value: Any) -> bool:
    """Whether a cb_kwargs value is one scrapy-poet injects (a page object, a web-poet
    page input), which it builds again for each download (never imports web_poet)."""
    web_poet = sys.modules.get("web_poet")
    if web_poet is None:
        return False
    injectable = getattr(web_poet, "Injectable", None)
    if isinstance(injectable, type) and isinstance(value, injectable):
        return True
    return type(value).__module__.startswith("web_poet.page_inputs")


class Codec:
    def __init__(self, classes: ItemClasses | None = None) -> None:
        self.classes = classes or ItemClasses(())

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Codec:
        return cls(ItemClasses.from_settings(settings))

    # -- encode ----------------------------------------------------------------------

    def encode(self, request: Request, spider: Spider | None,
               names: tuple[str | None, str | None] | None = None) -> str:
        """Return the request as JSON; raise PayloadError naming what cannot be stored.
        ``names``: the callback's and errback's method names, for a request made without
        the spider (the feed: feed/format.py), instead of its own (which must be None)."""
        classes = self.classes.with_spider(spider)
        check_request(request)
        try:
            d = self._request_dict(request, spider, classes)
            if names is not None:
                for key, name in zip(("cb", "eb"), names):
                    if name is not None:
                        d[key] = name
            payload = json.dumps(d, separators=(",", ":"), ensure_ascii=False)
        except Unstorable as exc:
            kind = type(exc.value)
            detail = f", {exc.detail}" if exc.detail else ""
            raise PayloadError(
                f"cannot store {request!r}: {path_text(exc.path)} is a "
                f"{kind.__module__}.{kind.__qualname__}{detail}; {exc.fix}") from None
        except PayloadError as exc:  # a callback or errback
            raise PayloadError(f"cannot store {request!r}: {exc}") from None
        except RecursionError:
            raise PayloadError(f"cannot store {request!r}: its meta, cb_kwargs or "
                               "attributes are nested too deeply (or hold themselves)"
                               ) from None
        except ValueError as exc:  # an int of more digits than Python converts
            raise PayloadError(f"cannot store {request!r}: a value in its meta, cb_kwargs or "
                               f"attributes cannot be written as JSON ({exc})") from None
        if not payload.isascii():
            try:
                payload.encode("utf-8")
            except UnicodeEncodeError:
                where = unencodable({_FIELD_NAMES.get(k, k): v for k, v in d.items()})
                raise PayloadError(
                    f"cannot store {request!r}: {where} holds a lone surrogate (half of a "
                    "UTF-16 pair, e.g. a truncated emoji), which is not text Redis can "
                    "store (UTF-8): decode with errors='replace', or drop the value"
                    ) from None
        return payload

    def _request_dict(self, request: Request, spider: Spider | None,
                      classes: ItemClasses, nested: bool = False) -> dict[str, Any]:
        d: dict[str, Any] = {"u": request.url}
        if nested and request.priority:  # a queued request's priority is in its envelope
            d["p"] = request.priority
        for attr in _DIRECT:
            value = getattr(request, attr)
            if attr == "meta":
                value = {k: v for k, v in value.items()
                         if not (isinstance(k, str) and k.startswith(PRIVATE_META_PREFIX))}
            elif attr == "cb_kwargs" and value:
                value = {k: v for k, v in value.items() if not poet_injected(v)}
            if value != _DEFAULTS[attr]:
                if attr in _PACKED:
                    try:
                        value = self._pack(value, classes, spider)
                    except Unstorable as exc:
                        exc.path.insert(0, attr)
                        raise
                d[_SHORT[attr]] = value
        if request.headers:
            d["h"] = {k.decode("latin-1"): [v.decode("latin-1") for v in vs]
                      for k, vs in request.headers.items()}
        if request.body:
            d["b"] = base64.b64encode(request.body).decode("ascii")
        cb = callable_name(spider, request.callback, "callback")
        if cb is not None:
            d["cb"] = cb
        eb = callable_name(spider, request.errback, "errback")
        if eb is not None:
            d["eb"] = eb
        if type(request) is not Request:
            d["cls"] = f"{type(request).__module__}.{type(request).__qualname__}"
            extra = {a: getattr(request, a) for a in request.attributes if a not in _HANDLED}
            if extra:
                try:
                    d["x"] = self._pack(extra, classes, spider)
                except Unstorable as exc:
                    exc.path.insert(0, "attribute")
                    raise
        return d

    def _pack(self, v: Any, classes: ItemClasses, spider: Spider | None) -> Any:
        t = type(v)
        if t in _SIMPLE:
            return v
        if t is list:
            if all(type(x) in _SIMPLE for x in v):
                return v
            out = []
            for i, x in enumerate(v):
                try:
                    out.append(self._pack(x, classes, spider))
                except Unstorable as exc:
                    exc.path.insert(0, f"[{i}]")
                    raise
            return out
        if t is dict:
            if TAG not in v and all(type(k) is str for k in v):
                if all(type(x) in _SIMPLE for x in v.values()):
                    return v  # the usual meta: nothing to tag
                packed = {}
                for k, x in v.items():
                    try:
                        packed[k] = self._pack(x, classes, spider)
                    except Unstorable as exc:
                        exc.path.insert(0, f"[{k!r}]")
                        raise
                return packed
            return {TAG: "dict", "v": self._pairs(v, classes, spider)}
        if t is tuple or t is set or t is frozenset:
            return {TAG: t.__name__, "v": self._pack(list(v), classes, spider)}
        if t is bytes or t is bytearray:
            return {TAG: t.__name__, "v": base64.b64encode(v).decode("ascii")}
        if t is datetime.datetime or t is datetime.date or t is datetime.time:
            return {TAG: t.__name__, "v": v.isoformat()}
        if t is datetime.timedelta:
            return {TAG: "timedelta", "v": [v.days, v.seconds, v.microseconds]}
        if t is decimal.Decimal:
            return {TAG: "decimal", "v": str(v)}
        if t is uuid.UUID:
            return {TAG: "uuid", "v": str(v)}
        if t is OrderedDict:
            return {TAG: "odict", "v": self._pairs(v, classes, spider)}
        if isinstance(v, (str, int, float)) and not isinstance(v, bool):
            return v  # a str/int/float subclass (lxml's text results, enums): as JSON does
        return self._pack_object(v, classes, spider)

    def _pack_object(self, v: Any, classes: ItemClasses, spider: Spider | None) -> Any:
        """A request, an object of LEASED_META_TYPES or an item, tagged; else refused."""
        if isinstance(v, Request):
            try:
                return {TAG: "request", "v": self._request_dict(v, spider, classes, True)}
            except PayloadError as exc:
                raise Unstorable(v, "", str(exc)) from None
        entry = classes.meta_type(v)
        if entry is not None:
            try:
                data = entry.encode(v)
            except Unstorable:
                raise
            except Exception as exc:
                raise Unstorable(v, f"whose encoder ({entry.name}) raised "
                                  f"{type(exc).__name__}: {exc}",
                                  "fix the encoder of LEASED_META_TYPES") from None
            return {TAG: "obj", "c": entry.name, "v": self._pack(data, classes, spider)}
        if ItemAdapter.is_item(v):
            name = classes.name_of(v)
            fields = {}
            for k, x in ItemAdapter(v).items():
                try:
                    fields[k] = self._pack(x, classes, spider)
                except Unstorable as exc:
                    exc.path.insert(0, f"[{k!r}]")
                    raise
            return {TAG: "item", "c": name, "v": fields}
        raise refusal(v)

    def _pairs(self, v: dict[Any, Any], classes: ItemClasses,
               spider: Spider | None) -> list[list[Any]]:
        out = []
        for k, x in v.items():
            try:
                out.append([self._pack(k, classes, spider), self._pack(x, classes, spider)])
            except Unstorable as exc:
                exc.path.insert(0, f"[{k!r}]")
                raise
        return out

    # -- decode ----------------------------------------------------------------------

    def decode(self, payload: str, spider: Spider, priority: int = 0) -> Request:
        """Rebuild a request; raise PayloadError with the reason when impossible."""
        classes = self.classes.with_spider(spider)
        try:
            d = json.loads(payload)
            if not isinstance(d, dict) or not isinstance(d.get("u"), str):
                raise PayloadError("payload is not a JSON object with a 'u' (url) string")
            return self._request(d, spider, priority, classes, TAG in payload)
        except PayloadError:
            raise
        except Exception as exc:  # anything a hand-written or corrupted payload can cause
            raise PayloadError(f"undecodable payload: {type(exc).__name__}: {exc}") from None

    def _request(self, d: dict[str, Any], spider: Spider, priority: int,
                 classes: ItemClasses, tagged: bool) -> Request:
        if tagged:
            kwargs = {_LONG[k]: self._unpack(v, classes, spider, _LONG[k])
                      for k, v in d.items() if k in _LONG}
        else:
            kwargs = {_LONG[k]: v for k, v in d.items() if k in _LONG}
        if "h" in d:
            kwargs["headers"] = d["h"]
        if "b" in d:
            kwargs["body"] = base64.b64decode(d["b"], validate=True)
        kwargs["callback"] = resolve_callable(spider, d.get("cb"), "callback")
        kwargs["errback"] = resolve_callable(spider, d.get("eb"), "errback")
        cls = request_class(d["cls"]) if "cls" in d else Request
        if "x" in d:
            kwargs.update(self._unpack(d["x"], classes, spider, "attribute") if tagged
                          else d["x"])
        if "p" in d:
            priority = d["p"]
        return cls(d["u"], priority=priority, **kwargs)

    def _unpack(self, v: Any, classes: ItemClasses, spider: Spider, where: str) -> Any:
        t = type(v)
        if t is list:
            return [self._unpack(x, classes, spider, where) for x in v]
        if t is not dict:
            return v
        tag = v.get(TAG)
        if tag is None:
            return {k: self._unpack(x, classes, spider, f"{where}[{k!r}]") for k, x in v.items()}
        x = v.get("v")
        try:
            if tag == "dict":
                return {self._unpack(a, classes, spider, where):
                        self._unpack(b, classes, spider, where)
                        for a, b in x}
            if tag == "odict":
                return OrderedDict((self._unpack(a, classes, spider, where),
                                    self._unpack(b, classes, spider, where)) for a, b in x)
            if tag in ("tuple", "set", "frozenset"):
                items = self._unpack(x, classes, spider, where)
                return {"tuple": tuple, "set": set, "frozenset": frozenset}[tag](items)
            if tag == "bytes":
                return base64.b64decode(x, validate=True)
            if tag == "bytearray":
                return bytearray(base64.b64decode(x, validate=True))
            if tag == "datetime":
                return datetime.datetime.fromisoformat(x)
            if tag == "date":
                return datetime.date.fromisoformat(x)
            if tag == "time":
                return datetime.time.fromisoformat(x)
            if tag == "timedelta":
                return datetime.timedelta(days=x[0], seconds=x[1], microseconds=x[2])
            if tag == "decimal":
                return decimal.Decimal(x)
            if tag == "uuid":
                return uuid.UUID(x)
            if tag == "request":
                request = self._request(x, spider, 0, classes, True)
                return request
            if tag == "item":
                cls = classes.resolve(v.get("c"))
                fields = {k: self._unpack(f, classes, spider, f"{where}[{k!r}]")
                          for k, f in x.items()}
                return build_item(cls, fields)
            if tag == "obj":
                entry = classes.meta_type_named(v.get("c"))
                return entry.decode(self._unpack(x, classes, spider, where))
        except PayloadError as exc:
            raise PayloadError(f"{where}: {exc}") from None
        except Exception as exc:
            raise PayloadError(f"{where}: bad {tag!r} value: {type(exc).__name__}: {exc}") \
                from None
        raise PayloadError(f"{where}: unknown tag {tag!r}")


def check_request(request: Request) -> None:
    """Raise PayloadError when what is sent beside a request's payload cannot be stored:
    a priority that is not an integer (bool included: redis-py refuses it) within
    ``MAX_PRIORITY``, a ``leased_revisit_after`` that is not a number of seconds
    (meta.revisit_ms)."""
    priority = request.priority
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise PayloadError(f"cannot store {request!r}: its priority ({shown(priority)}) is "
                           "not an integer")
    if not -MAX_PRIORITY <= priority <= MAX_PRIORITY:
        raise PayloadError(f"cannot store {request!r}: its priority ({shown(priority)}) is "
                           f"out of range: at most {MAX_PRIORITY} either way (2**53 - 1, "
                           "as far as Redis's Lua numbers are exact)")
    try:
        revisit_ms(request, 0)
    except ValueError as exc:
        raise PayloadError(f"cannot store {request!r}: {exc}") from None


_default = Codec()


def encode_request(request: Request, spider: Spider | None,
                   classes: ItemClasses | None = None) -> str:
    """Return the request as JSON (see Codec.encode)."""
    return (Codec(classes) if classes is not None else _default).encode(request, spider)


def decode_request(payload: str, spider: Spider, priority: int = 0,
                   classes: ItemClasses | None = None) -> Request:
    """Rebuild a request (see Codec.decode)."""
    return (Codec(classes) if classes is not None else _default).decode(payload, spider, priority)
