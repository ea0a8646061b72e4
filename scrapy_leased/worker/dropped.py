"""Requests a spider yields that cannot be stored, kept as dead letters.

A request the codec refuses (codec.PayloadError: an object in its meta or cb_kwargs the
codec cannot write, a lone surrogate, a priority out of range, ...) is never queued. It
is not dropped in silence: the scheduler logs a WARNING naming it, the key and the fix,
and the writer stores it as a dead letter (lua/commit.lua, with the batch it was yielded
in) under ``dropped:<sha1 of method and URL>`` of the crawl's ``dead`` HASH, so that
``scrapy leased dead``, ``status`` (a warning), the metrics and the dashboard show it.

The letter keeps the request as far as it can be: its URL, method, callback and errback
names and the reason, and ``request``, the request encoded without the meta and
cb_kwargs keys that could not be stored (named in ``removed``), or None when even that
cannot be encoded. Such a letter is never requeued (fleet/admin.py ``requeue_dead``
refuses it): what was kept is not the request the spider made, and its callback would
run without what it expects. The operator fixes the spider (the reason names the key
and what to do) and seeds the URL again, then purges the letter.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from scrapy import Request, Spider

from ..codec import Codec, PayloadError
from ..frontier.scripts import safe_text

#: Field prefix of these letters in the ``dead`` HASH
FIELD_PREFIX = "dropped:"
#: The largest request kept in a letter (characters of its JSON); a larger one is left
#: out (``request`` None) and said so in ``note``
MAX_KEPT = 64 * 1024


def _name(func: Any) -> str | None:
    if func is None:
        return None
    return safe_text(str(getattr(func, "__name__", None) or repr(func)))


def _keeps(codec: Codec, spider: Spider | None, url: str, meta: dict[Any, Any] | None = None,
           cb_kwargs: dict[Any, Any] | None = None) -> bool:
    """Whether a plain request with this meta or cb_kwargs could be stored."""
    try:
        codec.encode(Request(url, meta=meta, cb_kwargs=cb_kwargs), spider)
    except (PayloadError, ValueError, TypeError):
        return False
    return True


def _storable(codec: Codec, spider: Spider | None, where: str, values: dict[Any, Any],
              removed: list[str]) -> dict[Any, Any]:
    """The entries of ``values`` (a request's ``where``: meta or cb_kwargs) the codec can
    store; the others are named in ``removed``, as ``meta['key']``."""
    kept: dict[Any, Any] = {}
    for k, v in values.items():
        if _keeps(codec, spider, "http://example.invalid/", **{where: {k: v}}):
            kept[k] = v
        else:
            removed.append(safe_text(f"{where}[{k!r}]"))
    return kept


def salvage(codec: Codec, request: Request, spider: Spider | None
            ) -> tuple[str | None, list[str], str]:
    """(the request encoded without what cannot be stored, or None; the meta and
    cb_kwargs keys removed, as ``meta['key']``; a note when nothing could be kept)."""
    removed: list[str] = []
    meta = _storable(codec, spider, "meta", request.meta, removed)
    cb_kwargs = _storable(codec, spider, "cb_kwargs", request.cb_kwargs, removed)
    try:
        payload = codec.encode(request.replace(meta=meta, cb_kwargs=cb_kwargs), spider)
    except (PayloadError, ValueError, TypeError) as exc:
        return None, removed, safe_text(f"the request itself cannot be encoded: {exc}")
    if len(payload) > MAX_KEPT:
        return None, removed, f"the request is larger than {MAX_KEPT:,} characters: not kept"
    return payload, removed, ""


def dead_letter(codec: Codec, request: Request, spider: Spider | None,
                reason: str) -> tuple[str, str]:
    """(field in the ``dead`` HASH, letter JSON) of a request that cannot be stored
    (lua/commit.lua adds ``attempts`` 0, ``dropped`` true and ``t``)."""
    url, method = safe_text(request.url), safe_text(request.method)
    try:
        payload, removed, note = salvage(codec, request, spider)
    except Exception as exc:  # a Request subclass whose replace() fails, say: the letter
        payload, removed = None, []  # is written all the same, with what is known
        note = safe_text(f"the request could not be kept: {exc!r}")
    letter: dict[str, Any] = {
        "reason": safe_text(reason), "url": url, "method": method,
        "callback": _name(request.callback) or "parse", "errback": _name(request.errback),
        "request": payload, "removed": removed}
    if note:
        letter["note"] = note
    field = FIELD_PREFIX + hashlib.sha1(f"{method} {url}".encode()).hexdigest()
    return field, json.dumps(letter, separators=(",", ":"), ensure_ascii=False)
