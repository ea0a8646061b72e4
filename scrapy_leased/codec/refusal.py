"""Why a request cannot be stored: ``PayloadError`` (its message names the request and
where the value sits, ``meta['item']['when']``), the value refused on the way
(``Unstorable``) with what to do instead, and the text UTF-8 cannot encode."""

from __future__ import annotations

import io
from collections.abc import Iterable
from typing import Any

from ..frontier.scripts import safe_text

SUPPORTED = ("JSON types, bytes, datetime/date/time/timedelta, Decimal, UUID, tuples, sets, "
             "Requests, items of the project's classes, scrapy-playwright PageMethods and "
             "the classes of LEASED_META_TYPES")


def unencodable(value: Any, where: str = "") -> str | None:
    """Where in ``value`` (str, and lists, tuples and dicts of them, keys included) a
    str sits that UTF-8 cannot encode (a lone surrogate), as a path (``['meta']['x']``,
    ``where`` prefixed), or None when there is none."""
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:
        v, path = stack.pop()
        if isinstance(v, str):
            if not v.isascii():
                try:
                    v.encode("utf-8")
                except UnicodeEncodeError:
                    return path or "the text"
        elif isinstance(v, dict):
            for k, x in v.items():
                if isinstance(k, str) and unencodable(k) is not None:
                    return f"{path}[{safe_text(repr(k))}] (the key)"
                stack.append((x, f"{path}[{safe_text(repr(k))}]"))
        elif isinstance(v, (list, tuple)):
            stack.extend((x, f"{path}[{i}]") for i, x in enumerate(v))
    return None


class PayloadError(ValueError):
    """A request cannot be stored, or a stored payload cannot be turned back. The
    message is safe to store and log (safe_text)."""

    def __init__(self, message: str) -> None:
        super().__init__(safe_text(str(message)))


class Unstorable(Exception):
    """A value that cannot be stored; ``path`` is filled in while unwinding. ``detail``
    follows the value's type in the message, ``fix`` says what to do."""

    def __init__(self, value: Any, detail: str = "", fix: str = "") -> None:
        super().__init__(detail)
        self.value = value
        self.detail = detail
        self.fix = fix or (f"meta and cb_kwargs may hold {SUPPORTED}; to store objects "
                           "of another class, name it in LEASED_META_TYPES with an encoder "
                           "and a decoder (docs/plugins.md#objects-in-meta)")
        self.path: list[str] = []


def path_text(path: Iterable[str]) -> str:
    return "".join(path)


def refusal(value: Any) -> Unstorable:
    """Why ``value`` (of no storable type) cannot be stored, with what to do instead."""
    module = type(value).__module__ or ""
    if module.split(".")[0] == "playwright":
        return Unstorable(
            value, "a live Playwright object of this worker's browser",
            "it cannot cross workers (another worker may download the request): leave "
            "'playwright_page' out of the requests you yield and redo the page's steps with "
            "playwright_page_methods, or finish the work in the callback that got the page "
            "(playwright_include_page) and close it there")
    if isinstance(value, type):
        return Unstorable(value, "a class", "store its name, or name the class in "
                           "LEASED_META_TYPES and store an object of it")
    if callable(value):
        return Unstorable(
            value, "a callable", "a worker cannot receive code: store the name of a spider "
            "method (a str) and find it with getattr(self, name) in the callback "
            "(scrapy-playwright takes method names in playwright_page_event_handlers)")
    if isinstance(value, io.IOBase):
        return Unstorable(value, "an open file", "it exists only in this process: store "
                           "its path and open it where it is used")
    return Unstorable(value)
