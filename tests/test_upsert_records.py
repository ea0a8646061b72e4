"""From items of every kind itemadapter supports to records: the key (setting, else
declared by the item class, else ``url``), the type, the JSON, the fence token."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import json
from typing import ClassVar

import attrs
import pydantic
import pytest
import scrapy

from scrapy_leased.upsert.records import MissingKey, RecordMaker, class_key_fields, type_slug


class ScrapyPage(scrapy.Item):
    url = scrapy.Field()
    sku = scrapy.Field(upsert_key=True)
    title = scrapy.Field()


@dataclasses.dataclass
class DataPage:
    sku: str | None = dataclasses.field(default=None, metadata={"upsert_key": True})
    url: str | None = None


@attrs.define
class AttrsPage:
    sku: str | None = attrs.field(default=None, metadata={"upsert_key": True})
    url: str | None = None


class PydanticPage(pydantic.BaseModel):
    sku: str | None = pydantic.Field(default=None, json_schema_extra={"upsert_key": True})
    url: str | None = None


@attrs.define
class AttrsComposite:
    upsert_key = ("site", "sku")  # a plain class attribute
    site: str | None = None
    sku: int | None = None


class PydanticComposite(pydantic.BaseModel):
    upsert_key: ClassVar[tuple[str, ...]] = ("site", "sku")
    site: str | None = None
    sku: int | None = None


class ScrapyComposite(scrapy.Item):
    upsert_key = ("site", "sku")
    site = scrapy.Field()
    sku = scrapy.Field()


@dataclasses.dataclass
class PlainData:  # declares nothing: the default key, url
    url: str | None = None
    n: int = 0


def make(item, setting=None, fence=None):
    return RecordMaker(setting).make(item, fence)


@pytest.mark.parametrize("cls", [ScrapyPage, DataPage, AttrsPage, PydanticPage])
def test_key_from_field_metadata_for_every_item_kind(cls):
    r = make(cls(sku="A-1", url="http://x/1"), fence=7)
    assert r.key == "A-1" and r.fence == 7
    assert r.type_name == cls.__name__ and r.table == type_slug(cls)
    assert json.loads(r.data) == {"sku": "A-1", "url": "http://x/1"}


@pytest.mark.parametrize("cls", [AttrsComposite, PydanticComposite, ScrapyComposite])
def test_composite_key_from_a_class_attribute(cls):
    r = make(cls(site="shop", sku=42))
    assert r.key == '["shop",42]'
    assert r.fence == 0  # no token: unfenced


def test_dict_and_undeclared_classes_default_to_url():
    assert make({"url": "http://x/2", "v": 1}).key == "http://x/2"
    assert make(PlainData(url="http://x/3")).key == "http://x/3"
    assert class_key_fields(dict) is None and class_key_fields(PlainData) is None


def test_the_setting_wins_over_the_class_declaration():
    r = make(ScrapyPage(sku="A-1", url="http://x/1"), setting=("url",))
    assert r.key == "http://x/1"
    r = make({"site": "s", "sku": 3}, setting=("site", "sku"))
    assert r.key == '["s",3]'


def test_non_string_single_keys_are_json():
    assert make({"id": 12}, setting=("id",)).key == "12"
    assert make({"id": ["a", 1]}, setting=("id",)).key == '["a",1]'


@pytest.mark.parametrize(("item", "setting", "field"), [
    ({"title": "no url"}, None, "url"),
    ({"url": None}, None, "url"),
    ({"url": ""}, None, "url"),
    (ScrapyPage(url="http://x"), None, "sku"),
    (DataPage(url="http://x"), None, "sku"),
    (AttrsPage(url="http://x"), None, "sku"),
    (PydanticPage(url="http://x"), None, "sku"),
    (AttrsComposite(site="s"), None, "sku"),
    ({"site": "s"}, ("site", "sku"), "sku"),
])
def test_missing_key_names_the_field_and_the_setting(item, setting, field):
    with pytest.raises(MissingKey) as e:
        make(item, setting)
    msg = str(e.value)
    assert repr(field) in msg and "LEASED_UPSERT_KEY" in msg and type(item).__name__ in msg


def test_item_json_handles_dates_decimals_nested_items_and_odd_values():
    class Colour(pydantic.BaseModel):
        name: str

    item = {"url": "u", "when": datetime.datetime(2026, 1, 2, 3, 4, 5),
            "price": decimal.Decimal("9.90"), "tags": {"a"}, "nested": DataPage(sku="n"),
            "model": Colour(name="red"), "text": "é ✓"}
    data = json.loads(make(item).data)
    assert data["when"].replace("T", " ") == "2026-01-02 03:04:05" and data["price"] == "9.90"
    assert data["tags"] == ["a"] and data["nested"] == {"sku": "n", "url": None}
    assert data["text"] == "é ✓" and "red" in json.dumps(data["model"])


def test_type_slugs_are_table_name_parts():
    assert type_slug(dict) == "dict"
    assert type_slug(ScrapyPage) == "scrapy_page"
    assert type_slug(PydanticComposite) == "pydantic_composite"
    assert type_slug(type("HTTPThing2", (), {})) == "httpthing2"
