"""Callbacks and errbacks by name (the spider attribute that holds them), and the
Request subclasses a payload may name (only those already loaded)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from scrapy import Request, Spider
from scrapy.http.request import NO_CALLBACK

from .refusal import PayloadError

#: (spider class, function) -> the name of the spider attribute holding it, for methods
#: whose ``__name__`` is not that attribute (found once per class and function)
_ATTR_NAMES: dict[tuple[type, Any], str | None] = {}


def attribute_name(spider: Any, func: Callable[..., Any]) -> str | None:
    """The attribute of ``spider``'s class that holds the function of bound method
    ``func``, found by identity as Scrapy's ``request_to_dict`` does: a callback made by a
    decorator or a factory (scrapy-poet's ``parse_book = callback_for(BookPage)``, whose
    ``__name__`` is ``async_parse``) is stored under the name the spider gives it."""
    target = getattr(func, "__func__", None)
    if target is None:
        return None
    key = (type(spider), target)
    if key not in _ATTR_NAMES:
        found = None
        for cls in type(spider).__mro__:
            for attr, value in vars(cls).items():
                if value is target or getattr(value, "__func__", None) is target:
                    found = attr
                    break
            if found is not None:
                break
        _ATTR_NAMES[key] = found
    return _ATTR_NAMES[key]


def callable_name(spider: Spider | None, func: Callable[..., Any] | None, what: str) -> Any:
    if func is None or func is NO_CALLBACK:
        return None if func is None else "NO_CALLBACK"
    owner = getattr(func, "__self__", None)
    name = getattr(func, "__name__", None)
    if spider is not None and owner is spider and name and getattr(spider, name, None) == func:
        return name
    if spider is not None and owner is spider:
        attr = attribute_name(spider, func)
        if attr is not None and getattr(spider, attr, None) == func:
            return attr
    spider_name = getattr(spider, "name", None)
    raise PayloadError(
        f"{what} {func!r} is not a method of spider {spider_name!r}: scrapy_leased "
        "stores callbacks by the name of the spider attribute that holds them (as Scrapy's "
        "request_to_dict does), so use a spider method, or make the function one "
        "(parse_book = callback_for(BookPage) in the spider's class)"
    )


def resolve_callable(spider: Spider, name: str | None, what: str) -> Any:
    if name is None:
        return None
    if name == "NO_CALLBACK":
        return NO_CALLBACK
    try:
        return getattr(spider, name)
    except AttributeError:
        raise PayloadError(f"{what} {name!r} is not a method of spider {spider.name!r}") from None


def request_class(path: str) -> type[Request]:
    # Never import a module because Redis said so: only classes of modules this
    # process already loaded (Scrapy's own, the project's spiders) are accepted.
    module, _, name = str(path).rpartition(".")
    cls = getattr(sys.modules.get(module), name, None)
    if not (isinstance(cls, type) and issubclass(cls, Request)):
        raise PayloadError(f"class {path!r} is not a loaded scrapy Request class")
    return cls
