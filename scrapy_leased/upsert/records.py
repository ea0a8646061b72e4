"""From an item to the record the stores write: its key, type, JSON and fence token.

The key comes from LEASED_UPSERT_KEY when set; else from the item class (a class
attribute ``upsert_key = "sku"`` or ``("site", "sku")``, or fields whose metadata has
``upsert_key=True``); else the ``url`` field.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from itemadapter import ItemAdapter
from scrapy.utils.serialize import ScrapyJSONEncoder

from ..settings.defaults import UPSERT_DEFAULT_KEY as DEFAULT_KEY

_SNAKE_RE = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_NOT_IDENT_RE = re.compile(r"[^a-z0-9_]+")


class MissingKey(ValueError):
    """The item lacks (a part of) its upsert key; the message names LEASED_UPSERT_KEY."""


@dataclass(frozen=True)
class Record:
    """One upsert. ``fence`` is the claim token of the request that produced the
    item, 0 when unknown (written unfenced)."""

    table: str  # the item type as a name part: snake_case of the class name
    key: str
    type_name: str  # the item's class name, stored with the record
    data: str  # the item as JSON
    fence: int


def type_slug(cls: type) -> str:
    """``ProductItem`` -> ``product_item``; usable in a SQL table or Redis key name."""
    slug = _NOT_IDENT_RE.sub("_", _SNAKE_RE.sub("_", cls.__name__).lower()).strip("_")
    return slug or "item"


def _flagged(meta: Any) -> bool:
    if meta.get("upsert_key"):
        return True
    extra = meta.get("json_schema_extra")  # pydantic: Field(json_schema_extra={...})
    return isinstance(extra, dict) and bool(extra.get("upsert_key"))


def class_key_fields(cls: type) -> tuple[str, ...] | None:
    """The key an item class declares, or None."""
    attr = getattr(cls, "upsert_key", None)
    if isinstance(attr, str) and attr:
        return (attr,)
    if isinstance(attr, (tuple, list)) and attr and all(isinstance(f, str) for f in attr):
        return tuple(attr)
    try:
        names = ItemAdapter.get_field_names_from_class(cls) or []
    except TypeError:
        return None
    flagged = tuple(n for n in names if _flagged(ItemAdapter.get_field_meta_from_class(cls, n)))
    return flagged or None


class _Encoder(ScrapyJSONEncoder):
    """Scrapy's item encoder (dates, decimals, sets, nested items); any other object
    (a pydantic URL, an enum) is stored as its ``str()``."""

    def default(self, o: Any) -> Any:
        try:
            return super().default(o)
        except TypeError:
            return str(o)


def key_string(values: list[Any]) -> str:
    """One text key: a single string value as it is, anything else as compact JSON."""
    if len(values) == 1 and isinstance(values[0], str):
        return values[0]
    value = values[0] if len(values) == 1 else values
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      cls=_Encoder)


class RecordMaker:
    def __init__(self, key_fields: tuple[str, ...] | None) -> None:
        self.setting_fields = key_fields
        self._by_class: dict[type, tuple[tuple[str, ...], str, str, str]] = {}
        self._encoder = _Encoder(ensure_ascii=False, separators=(",", ":"))

    def _describe(self, cls: type) -> tuple[tuple[str, ...], str, str, str]:
        """(key fields, table slug, class name, where the key fields come from)."""
        found = self._by_class.get(cls)
        if found is None:
            if self.setting_fields:
                fields, source = self.setting_fields, "LEASED_UPSERT_KEY"
            elif (declared := class_key_fields(cls)) is not None:
                fields, source = declared, f"declared by {cls.__name__}"
            else:
                fields, source = DEFAULT_KEY, "the default, LEASED_UPSERT_KEY is unset"
            found = self._by_class[cls] = (fields, type_slug(cls), cls.__name__, source)
        return found

    def key_fields(self, item: Any) -> tuple[str, ...]:
        return self._describe(type(item))[0]

    def make(self, item: Any, fence: int | None) -> Record:
        fields, table, type_name, source = self._describe(type(item))
        adapter = ItemAdapter(item)
        values = []
        for name in fields:
            value = adapter.get(name)
            if value is None or value == "":
                raise MissingKey(
                    f"{type_name} item has no value for {name!r}, part of its upsert key "
                    f"{list(fields)} ({source}). Set LEASED_UPSERT_KEY, or upsert_key on "
                    "the item class, to fields every item has.")
            values.append(value)
        return Record(table, key_string(values), type_name,
                      self._encoder.encode(adapter.asdict()), fence or 0)
