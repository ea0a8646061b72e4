"""Requests as compact JSON: never pickle, callbacks and errbacks by name.

Only non-default fields are written, under short names, so a plain GET costs little
more than its URL. ``Request.to_dict`` is not used on the hot path: it finds a
callback's name with ``inspect.getmembers(spider)`` for every request.
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Callable
from typing import Any

from scrapy import Request, Spider
from scrapy.http.request import NO_CALLBACK

# Meta keys starting with this are the plugin's per-process bookkeeping: never stored.
PRIVATE_META_PREFIX = "_leased"
_DIRECT = ("method", "cookies", "meta", "encoding", "dont_filter", "flags", "cb_kwargs")
_DEFAULTS: dict[str, Any] = {
    "method": "GET", "cookies": {}, "meta": {}, "encoding": "utf-8",
    "dont_filter": False, "flags": [], "cb_kwargs": {},
}
_SHORT = {"method": "m", "cookies": "c", "meta": "k", "encoding": "e",
          "dont_filter": "f", "flags": "fl", "cb_kwargs": "kw"}
_LONG = {v: k for k, v in _SHORT.items()}
_HANDLED = {"url", "headers", "body", "priority", "callback", "errback", *_DIRECT}


class PayloadError(ValueError):
    """A request cannot be stored, or a stored payload cannot be turned back."""


def _callable_name(spider: Spider, func: Callable[..., Any] | None, what: str) -> Any:
    if func is None or func is NO_CALLBACK:
        return None if func is None else "NO_CALLBACK"
    owner = getattr(func, "__self__", None)
    name = getattr(func, "__name__", None)
    if owner is spider and name and getattr(spider, name, None) == func:
        return name
    raise PayloadError(
        f"{what} {func!r} is not a method of spider {spider.name!r}: scrapy_leased "
        f"stores callbacks by name, so use a spider method."
    )


def _resolve(spider: Spider, name: str | None, what: str) -> Any:
    if name is None:
        return None
    if name == "NO_CALLBACK":
        return NO_CALLBACK
    try:
        return getattr(spider, name)
    except AttributeError:
        raise PayloadError(f"{what} {name!r} is not a method of spider {spider.name!r}") from None


def encode_request(request: Request, spider: Spider) -> str:
    """Return the request as JSON; raise PayloadError naming what cannot be stored."""
    d: dict[str, Any] = {"u": request.url}
    for attr in _DIRECT:
        value = getattr(request, attr)
        if attr == "meta":
            value = {k: v for k, v in value.items()
                     if not k.startswith(PRIVATE_META_PREFIX)}
        if value != _DEFAULTS[attr]:
            d[_SHORT[attr]] = value
    if request.headers:
        d["h"] = {k.decode("latin-1"): [v.decode("latin-1") for v in vs]
                  for k, vs in request.headers.items()}
    if request.body:
        d["b"] = base64.b64encode(request.body).decode("ascii")
    cb = _callable_name(spider, request.callback, "callback")
    if cb is not None:
        d["cb"] = cb
    eb = _callable_name(spider, request.errback, "errback")
    if eb is not None:
        d["eb"] = eb
    if type(request) is not Request:
        d["cls"] = f"{type(request).__module__}.{type(request).__qualname__}"
        extra = {a: getattr(request, a) for a in request.attributes if a not in _HANDLED}
        if extra:
            d["x"] = extra
    try:
        return json.dumps(d, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise PayloadError(
            f"cannot store {request!r} as JSON ({exc}); meta and cb_kwargs values must be "
            f"JSON types (str, int, float, bool, None, list, dict)"
        ) from None


def _request_class(path: str) -> type[Request]:
    # Never import a module because Redis said so: only classes of modules this
    # process already loaded (Scrapy's own, the project's spiders) are accepted.
    module, _, name = str(path).rpartition(".")
    cls = getattr(sys.modules.get(module), name, None)
    if not (isinstance(cls, type) and issubclass(cls, Request)):
        raise PayloadError(f"class {path!r} is not a loaded scrapy Request class")
    return cls


def decode_request(payload: str, spider: Spider, priority: int = 0) -> Request:
    """Rebuild a request; raise PayloadError with the reason when impossible."""
    try:
        d = json.loads(payload)
        if not isinstance(d, dict) or not isinstance(d.get("u"), str):
            raise PayloadError("payload is not a JSON object with a 'u' (url) string")
        kwargs: dict[str, Any] = {_LONG[k]: v for k, v in d.items() if k in _LONG}
        if "h" in d:
            kwargs["headers"] = d["h"]
        if "b" in d:
            kwargs["body"] = base64.b64decode(d["b"], validate=True)
        kwargs["callback"] = _resolve(spider, d.get("cb"), "callback")
        kwargs["errback"] = _resolve(spider, d.get("eb"), "errback")
        cls = _request_class(d["cls"]) if "cls" in d else Request
        kwargs.update(d.get("x", {}))
        return cls(d["u"], priority=priority, **kwargs)
    except PayloadError:
        raise
    except Exception as exc:  # anything a hand-written or corrupted payload can cause
        raise PayloadError(f"undecodable payload: {type(exc).__name__}: {exc}") from None
