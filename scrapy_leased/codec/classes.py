"""The classes a payload may name: item classes of the project's modules and the
registered meta types; nothing else is imported or called because Redis said so."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from itemadapter import ItemAdapter
from scrapy import Spider
from scrapy.settings import BaseSettings

from .items import item_modules
from .metatypes import BUILTIN_TYPES, MetaType, meta_types
from .refusal import PayloadError, Unstorable


class ItemClasses:
    """The modules item classes named in a payload may come from, and the other classes
    a payload may name (``types``: meta_types; the built-in ones when not given)."""

    def __init__(self, modules: Iterable[str],
                 types: Mapping[str, MetaType] | None = None) -> None:
        self.modules = tuple(dict.fromkeys(m for m in modules if m))
        self.types: Mapping[str, MetaType] = BUILTIN_TYPES if types is None else types
        self._with: dict[type, ItemClasses] = {}

    @classmethod
    def from_settings(cls, settings: BaseSettings | None,
                      spider: Spider | None = None) -> ItemClasses:
        modules: list[str] = []
        if settings is not None:
            modules += [m.split(".")[0] for m in settings.getlist("SPIDER_MODULES")]
            modules += item_modules(settings)
        if spider is not None:
            modules.append(type(spider).__module__.split(".")[0])
        return cls(modules, meta_types(settings))

    def with_spider(self, spider: Spider | None) -> ItemClasses:
        """These modules and the spider's own package."""
        if spider is None:
            return self
        found = self._with.get(type(spider))
        if found is None:
            top = type(spider).__module__.split(".")[0]
            found = self if top in self.modules else ItemClasses((*self.modules, top),
                                                                 self.types)
            self._with[type(spider)] = found
        return found

    def meta_type(self, value: Any) -> MetaType | None:
        """The registered type of ``value`` (its exact class), or None."""
        cls = type(value)
        entry = self.types.get(f"{cls.__module__}:{cls.__qualname__}")
        if entry is None:
            return None
        try:
            if entry.load() is not cls:  # a namesake
                return None
        except Exception:
            return None
        return entry

    def meta_type_named(self, name: Any) -> MetaType:
        """The registered type a payload names; raises PayloadError for any other."""
        entry = self.types.get(name) if isinstance(name, str) else None
        if entry is None:
            raise PayloadError(f"class {name!r} is not one of LEASED_META_TYPES")
        return entry

    def allows(self, module: str) -> bool:
        return any(module == m or module.startswith(m + ".") for m in self.modules)

    def name_of(self, item: Any) -> str:
        """``module:qualname`` of an item's class, which payloads may name."""
        cls = type(item)
        module, qual = cls.__module__, cls.__qualname__
        if "<locals>" in qual:
            raise Unstorable(item, "an item class defined inside a function",
                              "a worker finds item classes by name: define it in a module")
        if not self.allows(module):
            raise Unstorable(item, "an item class outside the project's modules "
                              f"({', '.join(self.modules) or 'none'})",
                              f"add {module!r} to LEASED_ITEM_MODULES if it is yours")
        return f"{module}:{qual}"

    def resolve(self, name: Any) -> type:
        module, _, qual = str(name).partition(":")
        if not qual or not self.allows(module):
            raise PayloadError(f"class {name!r} is not in one of the project's modules "
                               f"({self._describe()})")
        try:
            obj: Any = sys.modules.get(module) or importlib.import_module(module)
            for part in qual.split("."):
                obj = getattr(obj, part)
        except Exception as exc:
            raise PayloadError(f"class {name!r} cannot be found: {type(exc).__name__}: {exc}") \
                from None
        if not (isinstance(obj, type) and ItemAdapter.is_item_class(obj)):
            raise PayloadError(f"{name!r} is not an item class")
        return obj

    def _describe(self) -> str:
        names = ", ".join(self.modules) or "none"
        return f"{names}; SPIDER_MODULES and LEASED_ITEM_MODULES add more"
