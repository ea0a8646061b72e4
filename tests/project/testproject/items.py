"""Item classes of every kind itemadapter supports, each choosing its upsert key in
another way (for the ``upsert_types`` spider and tests/test_upsert_*.py)."""

import dataclasses
from typing import ClassVar

import attrs
import pydantic
import scrapy


class PageItem(scrapy.Item):
    """scrapy.Item, key from field metadata."""

    url = scrapy.Field(upsert_key=True)
    title = scrapy.Field()
    worker = scrapy.Field()


@dataclasses.dataclass
class DataPage:
    """dataclass, key from field metadata."""

    path: str | None = dataclasses.field(default=None, metadata={"upsert_key": True})
    url: str | None = None
    worker: str | None = None


@attrs.define
class AttrsPage:
    """attrs, composite key from a class attribute."""

    upsert_key = ("site", "path")  # not annotated: a plain class attribute, not a field
    site: str | None = None
    path: str | None = None
    worker: str | None = None


class PydanticPage(pydantic.BaseModel):
    """pydantic, no declared key: the default ``url``."""

    url: str | None = None
    n: int = 0
    worker: str | None = None


class KeyedPydanticPage(pydantic.BaseModel):
    """pydantic, key from the ClassVar ``upsert_key``."""

    upsert_key: ClassVar[tuple[str, ...]] = ("sku",)
    sku: str | None = None
    price: float = 0.0


class MetaPydanticPage(pydantic.BaseModel):
    """pydantic, key from Field(json_schema_extra={"upsert_key": True})."""

    code: str | None = pydantic.Field(default=None, json_schema_extra={"upsert_key": True})
    label: str = ""
