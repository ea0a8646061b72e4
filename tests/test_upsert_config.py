"""LEASED_UPSERT_* settings: parsed once, every bad value stopped with an error naming
the setting and the value; the add-on enables the pipeline and the fence middleware."""

from __future__ import annotations

import pytest
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler

from scrapy_leased import Addon
from scrapy_leased.settings import LeasedConfigError
from scrapy_leased.upsert import UpsertConfig, UpsertFenceMiddleware, UpsertPipeline


def config(**values) -> UpsertConfig:
    return UpsertConfig.from_settings(Settings(values))


def test_defaults():
    c = config()
    assert not c.enabled and c.url is None and c.backend == "redis"  # off unless asked for
    assert config(LEASED_UPSERT_URL="sqlite:///x.db").enabled
    assert config(LEASED_UPSERT_ENABLED=True).enabled  # into the crawl's Redis
    assert not config(LEASED_UPSERT_ENABLED="False", LEASED_UPSERT_URL="sqlite:///x.db").enabled
    assert c.key_fields is None  # per item class, else "url"
    assert c.prefix == "records" and c.batch_size == 500


@pytest.mark.parametrize(("url", "backend"), [
    ("redis://h:6379/3", "redis"), ("rediss://u:p@h:6380/1", "redis"),
    ("unix:///tmp/r.sock", "redis"), ("sqlite:///out/items.db", "sqlite"),
    ("sqlite:////abs/items.db", "sqlite"), ("postgresql://u@h:5432/db", "postgresql"),
    ("postgres://u@h/db", "postgresql"),
])
def test_backend_urls(url, backend):
    c = config(LEASED_UPSERT_URL=url)
    assert c.url == url and c.backend == backend


def test_sqlite_paths_follow_the_three_and_four_slash_convention():
    assert str(config(LEASED_UPSERT_URL="sqlite:///out/items.db").sqlite_path) == "out/items.db"
    assert str(config(LEASED_UPSERT_URL="sqlite:////abs/items.db").sqlite_path) == "/abs/items.db"


def test_key_setting_forms():
    assert config(LEASED_UPSERT_KEY="sku").key_fields == ("sku",)
    assert config(LEASED_UPSERT_KEY="site,sku").key_fields == ("site", "sku")  # -s on the CLI
    assert config(LEASED_UPSERT_KEY=["site", "sku"]).key_fields == ("site", "sku")
    assert config(LEASED_UPSERT_KEY=("a",)).key_fields == ("a",)


def test_values_from_the_command_line_are_strings():
    c = config(LEASED_UPSERT_ENABLED="False", LEASED_UPSERT_BATCH_SIZE="20")
    assert not c.enabled and c.batch_size == 20


def test_addon_enables_pipeline_and_middleware_next_to_the_project_components():
    s = Settings({"LEASED_UPSERT_ENABLED": True,
                  "ITEM_PIPELINES": {"scrapy.pipelines.files.FilesPipeline": 300},
                  "SPIDER_MIDDLEWARES": {"scrapy.spidermiddlewares.depth.DepthMiddleware": 543}})
    Addon().update_settings(s)
    pipelines = s.getdict("ITEM_PIPELINES")
    assert pipelines[UpsertPipeline] == 800 and pipelines["scrapy.pipelines.files.FilesPipeline"] == 300
    mws = s.getdict("SPIDER_MIDDLEWARES")
    assert mws[UpsertFenceMiddleware] == 10 and mws["scrapy.spidermiddlewares.depth.DepthMiddleware"] == 543


def test_addon_leaves_them_out_when_disabled_and_validates_upsert_settings():
    for values in ({}, {"LEASED_UPSERT_ENABLED": False}):  # off by default
        s = Settings(values)
        Addon().update_settings(s)
        assert UpsertPipeline not in s.getdict("ITEM_PIPELINES")
        assert UpsertFenceMiddleware not in s.getdict("SPIDER_MIDDLEWARES")
    with pytest.raises(LeasedConfigError, match="LEASED_UPSERT_URL"):
        Addon().update_settings(Settings({"LEASED_UPSERT_URL": "ftp://x"}))


def test_components_refuse_to_run_when_disabled():
    from scrapy.exceptions import NotConfigured

    crawler = get_crawler(settings_dict={})  # off by default
    with pytest.raises(NotConfigured):
        UpsertPipeline.from_crawler(crawler)
    with pytest.raises(NotConfigured):
        UpsertFenceMiddleware.from_crawler(crawler)
