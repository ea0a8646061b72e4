"""Items in stored requests: the modules their classes may come from
(``LEASED_ITEM_MODULES``) and an item rebuilt from its fields."""

from __future__ import annotations

from typing import Any

from scrapy.settings import BaseSettings

from ..exceptions import LeasedConfigError


def item_modules(settings: BaseSettings) -> list[str]:
    """``LEASED_ITEM_MODULES``: module names (a list, or comma-separated); raises
    LeasedConfigError."""
    extra = settings.get("LEASED_ITEM_MODULES") or []
    if isinstance(extra, str):
        extra = [m.strip() for m in extra.split(",")]
    if not isinstance(extra, (list, tuple)) or not all(
            isinstance(m, str) and m and all(p.isidentifier() for p in m.split("."))
            for m in extra):
        raise LeasedConfigError(
            f"LEASED_ITEM_MODULES ({settings.get('LEASED_ITEM_MODULES')!r}) must be a "
            "list of module names, e.g. ['myproject.items', 'shared_items'].")
    return list(extra)


def build_item(cls: type, fields: dict[str, Any]) -> Any:
    """An item of ``cls`` with these field values (those its constructor does not take
    are set afterwards: dataclass and attrs fields with ``init=False``)."""
    import dataclasses

    if dataclasses.is_dataclass(cls):
        init = {f.name for f in dataclasses.fields(cls) if f.init}
        item = cls(**{k: v for k, v in fields.items() if k in init})
        for k, v in fields.items():
            if k not in init:
                object.__setattr__(item, k, v)
        return item
    attrs_fields = getattr(cls, "__attrs_attrs__", None)
    if attrs_fields is not None:
        by_name = {a.name: a for a in attrs_fields}
        kwargs = {}
        late = {}
        for k, v in fields.items():
            a = by_name.get(k)
            if a is not None and a.init:
                kwargs[getattr(a, "alias", None) or k.lstrip("_")] = v
            else:
                late[k] = v
        item = cls(**kwargs)
        for k, v in late.items():
            object.__setattr__(item, k, v)
        return item
    if issubclass(cls, dict):
        mapping = cls()
        mapping.update(fields)
        return mapping
    return cls(**fields)  # scrapy.Item, pydantic
