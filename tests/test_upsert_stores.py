"""UpsertPipeline and its stores against real servers: Redis (the crawl's own), SQLite
files and PostgreSQL (127.0.0.1:5432; skipped with the reason when unreachable, but
failing under CI=true).

Fencing: a write whose claim token is older than the stored one is ignored and
counted, never an error; a newer (or equal) token wins; an unfenced write (no token)
always wins and keeps the stored token."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sqlite3
from typing import Any

import attrs
import pydantic
import pytest
import scrapy
from scrapy import Request, Spider, signals
from scrapy.http import HtmlResponse
from scrapy.utils.test import get_crawler

from scrapy_leased.frontier.keys import CrawlKeys
from scrapy_leased.meta import META_CLAIM
from scrapy_leased.settings.upsert import UpsertConfig
from scrapy_leased.upsert import StoreError, UpsertFenceMiddleware, UpsertPipeline
from scrapy_leased.upsert.records import Record
from scrapy_leased.upsert.stores import make_store
from tests.support.redis_server import RedisServer
from tests.support.upsert import PostgresServer, pg_records, redis_records


def settings_for(target, redis_server, crawl_id, **extra) -> dict[str, Any]:
    return {"LEASED_REDIS_URL": redis_server.url, "LEASED_CRAWL_ID": crawl_id,
            **target.settings, **extra}


async def open_pipeline(settings: dict[str, Any]) -> tuple[UpsertPipeline, Any]:
    crawler = get_crawler(settings_dict={"LEASED_UPSERT_ENABLED": True, **settings})
    crawler.spider = Spider(name="upsert_test")
    pipe = UpsertPipeline.from_crawler(crawler)
    await pipe.open_spider()
    return pipe, crawler


def response_of(url: str, token: int | None) -> HtmlResponse:
    meta = {} if token is None else {META_CLAIM: token}
    return HtmlResponse(url, body=b"<html></html>", request=Request(url, meta=meta))


def from_claim(crawler, item, token: int):
    """What UpsertFenceMiddleware does for an item yielded by a callback of the
    request holding claim ``token``."""
    mw = UpsertFenceMiddleware.from_crawler(crawler)
    return mw.get_processed_item(item, response_of("http://site/x", token))


def through_pipeline(settings: dict[str, Any],
                     items: list[tuple[dict[str, Any], int | None]]) -> tuple[Any, list[Any]]:
    """Open the pipeline, pass each (item, claim token) through it in order (an item
    yielded by a callback of that claim; token None: an item from no claim, e.g. an
    errback's), close it; the crawler, and each item passed with what process_item
    returned for it."""

    async def main() -> tuple[Any, list[Any]]:
        pipe, crawler = await open_pipeline(settings)
        try:
            passed = [item if token is None else from_claim(crawler, item, token)
                      for item, token in items]
            return crawler, [(x, await pipe.process_item(x)) for x in passed]
        finally:
            await pipe.close_spider()

    return asyncio.run(main())


def stat(crawler, name: str) -> int:
    return crawler.stats.get_value(f"leased/upsert/{name}", 0)


def rec(table: str, key: str, fence: int, value: int) -> Record:
    return Record(table, key, "Thing", json.dumps({"key": key, "v": value}), fence)


# -- the stores' fencing rule, one atomic batch at a time -------------------------------

def test_fencing_rule_in_every_backend(target, redis_server, crawl_id):
    async def main():
        config = UpsertConfig.from_settings(get_crawler(settings_dict=target.settings).settings)
        store = make_store(config, crawl_id, redis_server.url)
        await store.open()
        try:
            first = await store.write([
                rec("thing", "a", 5, 1),   # new: written
                rec("thing", "b", 0, 1),   # new, unfenced: written with token 0
                rec("thing", "a", 3, 2),   # older token: stale
                rec("thing", "a", 5, 3),   # same claim again: written
                rec("thing", "a", 7, 4),   # newer claim: written
                rec("thing", "a", 6, 5),   # older than 7: stale
                rec("thing", "a", 0, 6),   # unfenced: written, keeps token 7
            ])
            second = await store.write([rec("thing", "a", 6, 7), rec("thing", "c", 2, 1)])
            return first, second, await store.count("thing"), await store.count("nothing")
        finally:
            await store.close()

    first, second, count, none = asyncio.run(main())
    assert first == [True, True, False, True, True, False, True]
    assert second == [False, True]
    assert count == 3 and none == 0
    records = target.records("thing")
    assert set(records) == {"a", "b", "c"}
    assert records["a"]["item"] == {"key": "a", "v": 6} and records["a"]["fence"] == 7
    assert records["b"]["fence"] == 0 and records["c"]["fence"] == 2
    assert records["a"]["type"] == "Thing"


def test_redis_record_format_and_script_keys(redis_server, crawl_id):
    """upsert.lua stores '{"fence":..,"updated":..,"type":..,"item":..}' in the hash that
    keys.py names, passed in KEYS; updated is Redis server time in ms."""
    async def main():
        config = UpsertConfig.from_settings(get_crawler().settings)
        store = make_store(config, crawl_id, redis_server.url)
        await store.open()
        try:
            return await store.write([rec("thing", "k", 12, 1), rec("other", "k", 3, 2)])
        finally:
            await store.close()

    assert asyncio.run(main()) == [True, True]
    client = redis_server.client()
    keys = CrawlKeys(crawl_id)
    raw = client.hget(keys.records("thing"), "k")
    assert raw.startswith(b'{"fence":12,"updated":')
    value = json.loads(raw)
    server_ms = int(client.time()[0]) * 1000
    assert abs(value["updated"] - server_ms) < 60_000
    assert value["type"] == "Thing" and value["item"] == {"key": "k", "v": 1}
    assert json.loads(client.hget(keys.records("other"), "k"))["fence"] == 3
    assert keys.records("thing") == f"leased:{{{crawl_id}}}:records:thing"


# -- the pipeline ------------------------------------------------------------------------

def test_processed_twice_leaves_one_record_with_the_latest_content(target, redis_server,
                                                                     crawl_id):
    crawler, _ = through_pipeline(settings_for(target, redis_server, crawl_id), [
        ({"url": "http://site/p/1", "worker": "A"}, 41),
        ({"url": "http://site/p/1", "worker": "B"}, 57)])
    records = target.records("dict")
    assert list(records) == ["http://site/p/1"]
    assert records["http://site/p/1"]["item"]["worker"] == "B"
    assert records["http://site/p/1"]["fence"] == 57
    assert stat(crawler, "written") == 2 and stat(crawler, "stale") == 0
    assert stat(crawler, "unfenced") == 0


def test_a_stale_write_is_ignored_and_counted_not_an_error(target, redis_server, crawl_id):
    crawler, processed = through_pipeline(settings_for(target, redis_server, crawl_id), [
        ({"url": "http://site/p/2", "worker": "new"}, 90),
        ({"url": "http://site/p/2", "worker": "old"}, 60)])
    older, returned = processed[1]
    assert returned is older  # passed on to later pipelines
    record = target.records("dict")["http://site/p/2"]
    assert record["item"]["worker"] == "new" and record["fence"] == 90
    assert stat(crawler, "stale") == 1 and stat(crawler, "written") == 1


def test_items_without_a_token_are_written_unfenced_and_counted(target, redis_server,
                                                                 crawl_id):
    crawler, _ = through_pipeline(settings_for(target, redis_server, crawl_id), [
        ({"url": "u1", "v": 1}, 30), ({"url": "u1", "v": 2}, None)])  # None: e.g. an errback
    record = target.records("dict")["u1"]
    assert record["item"]["v"] == 2 and record["fence"] == 30  # the fence is kept
    assert stat(crawler, "unfenced") == 1


@dataclasses.dataclass
class DataThing:
    sku: str | None = dataclasses.field(default=None, metadata={"upsert_key": True})
    name: str = ""


@attrs.define
class AttrsThing:
    upsert_key = ("shop", "sku")
    shop: str | None = None
    sku: int | None = None


class PydanticThing(pydantic.BaseModel):
    url: str | None = None
    price: float = 0.0


class ScrapyThing(scrapy.Item):
    url = scrapy.Field()
    code = scrapy.Field(upsert_key=True)


def test_every_item_kind_gets_its_own_table(target, redis_server, crawl_id):
    items = [{"url": "http://d/1", "k": "dict"}, DataThing(sku="S1", name="dc"),
             AttrsThing(shop="s", sku=5), PydanticThing(url="http://p/1", price=2.5),
             ScrapyThing(url="http://i/1", code="C9")]

    async def main():
        pipe, crawler = await open_pipeline(settings_for(target, redis_server, crawl_id))
        try:
            for n, item in enumerate(items, 1):
                assert await pipe.process_item(from_claim(crawler, item, n)) is item
        finally:
            await pipe.close_spider()

    asyncio.run(main())
    assert target.records("dict")["http://d/1"]["item"] == {"url": "http://d/1", "k": "dict"}
    assert target.records("data_thing")["S1"]["item"] == {"sku": "S1", "name": "dc"}
    assert target.records("attrs_thing")['["s",5]']["item"] == {"shop": "s", "sku": 5}
    p = target.records("pydantic_thing")["http://p/1"]
    assert p["item"] == {"url": "http://p/1", "price": 2.5} and p["type"] == "PydanticThing"
    assert target.records("scrapy_thing")["C9"]["fence"] == 5


def test_an_item_without_its_key_passes_on_unstored_naming_the_setting(
        target, redis_server, crawl_id, caplog):
    items = [{"title": "no url"}, {"title": "no url either"}]

    async def main():
        pipe, crawler = await open_pipeline(settings_for(target, redis_server, crawl_id))
        try:
            for item in items:
                assert await pipe.process_item(item) is item  # never dropped
            assert await pipe.process_item("not an item") == "not an item"
        finally:
            await pipe.close_spider()
        return crawler

    with caplog.at_level("WARNING"):
        crawler = asyncio.run(main())
    assert stat(crawler, "missing_key") == 2 and stat(crawler, "not_an_item") == 1
    assert target.records("dict") == {}
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2, warnings  # one per kind, then only counted
    assert "LEASED_UPSERT_KEY" in warnings[0] and "'url'" in warnings[0]


def test_10000_items_records_equal_distinct_keys(target, redis_server, crawl_id):
    """10,000 items over 7,000 keys, all in flight at once: one record per key, the
    content of each key's latest item, in far fewer round trips than items."""
    n, distinct = 10_000, 7_000

    async def main():
        pipe, crawler = await open_pipeline(settings_for(target, redis_server, crawl_id))
        try:
            items = [from_claim(crawler, {"url": f"http://site/p/{i % distinct}", "i": i}, i + 1)
                     for i in range(n)]
            await asyncio.gather(*(pipe.process_item(item) for item in items))
        finally:
            await pipe.close_spider()
        return crawler

    crawler = asyncio.run(main())
    records = target.records("dict")
    assert len(records) == distinct
    assert records == {k: records[k] for k in (f"http://site/p/{i}" for i in range(distinct))}
    for i in (0, 2999, 3000, 6999):
        latest = i + distinct if i + distinct < n else i
        assert records[f"http://site/p/{i}"]["item"]["i"] == latest
        assert records[f"http://site/p/{i}"]["fence"] == latest + 1
    assert stat(crawler, "written") == n and stat(crawler, "stale") == 0
    assert stat(crawler, "batches") <= n // 10  # batched: 500 per round trip at most


class GatedStore:
    """Wraps a real store; the first write waits for ``gate``: meanwhile items queue."""

    def __init__(self, inner):
        self.inner = inner
        self.description = inner.description
        self.gate = asyncio.Event()
        self.sizes: list[int] = []

    async def write(self, records):
        self.sizes.append(len(records))
        if len(self.sizes) == 1:
            await self.gate.wait()
        return await self.inner.write(records)


def test_items_arriving_during_a_write_go_together_in_the_next_one(redis_server, crawl_id,
                                                                   tmp_path):
    async def main():
        pipe, crawler = await open_pipeline({
            "LEASED_CRAWL_ID": crawl_id, "LEASED_UPSERT_URL": f"sqlite:///{tmp_path}/b.db",
            "LEASED_UPSERT_BATCH_SIZE": 20})
        gated = pipe.batcher.store = GatedStore(pipe.store)
        try:
            first = asyncio.ensure_future(pipe.process_item({"url": "u0"}))
            while not gated.sizes:
                await asyncio.sleep(0)
            rest = [asyncio.ensure_future(pipe.process_item({"url": f"u{i}"}))
                    for i in range(1, 46)]
            await asyncio.sleep(0.05)
            assert not first.done()  # acked only after its write is durable
            gated.gate.set()
            await asyncio.gather(first, *rest)
        finally:
            await pipe.close_spider()
        return gated.sizes

    assert asyncio.run(main()) == [1, 20, 20, 5]


@pytest.mark.integration
def test_a_store_error_raises_from_process_item_then_writes_resume(crawl_id):
    """Redis goes away under the pipeline: a write waits for it (a restart, a failover)
    up to the store's outage retry time and succeeds when Redis is back within it;
    past it, the item's process_item raises (Scrapy then sends item_error and the
    scheduler fails the claim); once Redis is back, writes resume on the same
    pipeline."""
    srv = RedisServer(appendonly=True).start()
    try:
        async def main():
            pipe, crawler = await open_pipeline({"LEASED_REDIS_URL": srv.url,
                                                 "LEASED_CRAWL_ID": crawl_id})
            try:
                await pipe.process_item({"url": "before"})
                srv.stop()
                waiting = asyncio.ensure_future(pipe.process_item({"url": "waits"}))
                await asyncio.sleep(0.3)
                assert not waiting.done()  # retrying, not failed
                await asyncio.to_thread(srv.start)
                await waiting
                srv.stop()
                pipe.store.outage_retry_seconds = 0.5
                with pytest.raises(StoreError, match="cannot write 1 items to Redis"):
                    await pipe.process_item(from_claim(crawler, {"url": "during"}, 3))
                srv.start()
                await pipe.process_item({"url": "after"})
            finally:
                await pipe.close_spider()
            return crawler

        crawler = asyncio.run(main())
        assert stat(crawler, "errors") == 1 and stat(crawler, "written") == 3
        assert stat(crawler, "batches_failed") == 1
        stored = redis_records(srv.client(), CrawlKeys(crawl_id).records("dict"))
        assert set(stored) == {"before", "waits", "after"}
    finally:
        srv.close()


def test_sqlite_error_raises_from_process_item(crawl_id, tmp_path):
    path = tmp_path / "broken.db"

    async def main():
        pipe, crawler = await open_pipeline({"LEASED_CRAWL_ID": crawl_id,
                                             "LEASED_UPSERT_URL": f"sqlite:///{path}"})
        try:
            await pipe.process_item({"url": "ok"})
            other = sqlite3.connect(path)  # someone breaks the table under the pipeline
            other.executescript('DROP TABLE "records_dict"; '
                                'CREATE TABLE "records_dict" (key TEXT PRIMARY KEY);')
            other.close()
            with pytest.raises(StoreError, match="SQLite"):
                await pipe.process_item({"url": "fails"})
        finally:
            await pipe.close_spider()
        return crawler

    assert stat(asyncio.run(main()), "errors") == 1


@pytest.mark.integration
def test_postgresql_down_fails_the_items_and_back_resumes(crawl_id):
    pg = PostgresServer()
    try:
        pg.start()

        async def main():
            pipe, crawler = await open_pipeline({"LEASED_CRAWL_ID": crawl_id,
                                                 "LEASED_UPSERT_URL": pg.url})
            try:
                await pipe.process_item(from_claim(crawler, {"url": "a", "v": 1}, 1))
                pg.stop()  # immediate: a crash
                for url in ("b", "c"):
                    with pytest.raises(StoreError, match="PostgreSQL"):
                        await pipe.process_item(from_claim(crawler, {"url": url}, 2))
                pg.start()
                await pipe.process_item(from_claim(crawler, {"url": "b", "v": 2}, 3))
            finally:
                await pipe.close_spider()
            return crawler

        crawler = asyncio.run(main())
        assert stat(crawler, "errors") == 2 and stat(crawler, "written") == 2
        assert set(pg_records(pg.url, "records_dict")) == {"a", "b"}
    finally:
        pg.close()


@pytest.mark.integration
def test_open_fails_naming_the_setting_when_the_store_is_unreachable(crawl_id):
    from tests.support.redis_server import free_port

    async def main(url):
        with pytest.raises(Exception, match="LEASED_UPSERT_URL") as e:
            await open_pipeline({"LEASED_CRAWL_ID": crawl_id, "LEASED_UPSERT_URL": url})
        return str(e.value)

    port = free_port()
    asyncio.run(main(f"redis://127.0.0.1:{port}/0"))
    pytest.importorskip("psycopg")
    assert ":***@" in asyncio.run(main(f"postgresql://u:secret@127.0.0.1:{port}/db"))


# -- the fence middleware ----------------------------------------------------------------

def test_fence_middleware_sync_and_async_output_and_nothing_leaks():
    crawler = get_crawler(settings_dict={"LEASED_UPSERT_ENABLED": True})
    mw = UpsertFenceMiddleware.from_crawler(crawler)
    registry = mw.registry
    response = response_of("http://site/p/3", 77)
    a, b, c, request = {"url": "a"}, {"url": "b"}, {"url": "c"}, Request("http://site/p/4")

    out = list(mw.process_spider_output(response, iter([a, request])))
    assert out == [a, request] and len(registry) == 1

    async def collect():
        async def gen():
            yield b
            yield c
        return [o async for o in mw.process_spider_output_async(response, gen())]

    assert asyncio.run(collect()) == [b, c] and len(registry) == 3
    assert registry.take(a) == 77 and registry.take(a) is None
    assert registry.take({"url": "b"}) is None  # an equal but different object: no token
    # an item that never reaches the pipeline is forgotten on its item signal
    for sig, item in ((signals.item_dropped, b), (signals.item_error, c)):
        crawler.signals.send_catch_log(sig, item=item, response=response, spider=None,
                                       exception=None, failure=None)
    assert len(registry) == 0

    # no claim (not a leased request, or a start item): nothing noted
    list(mw.process_spider_output(response_of("http://site/p/5", None), iter([{"url": "d"}])))
    assert len(registry) == 0


def test_a_bad_item_fails_alone_not_its_batch_mates(redis_server, crawl_id):
    """PostgreSQL's JSONB refuses \\u0000: the batch is written again one item at a
    time, so only the bad item's process_item raises."""
    from tests.support.upsert import drop_tables, postgres_url

    url = postgres_url()
    prefix = f"t{crawl_id[-8:]}"

    async def main():
        pipe, crawler = await open_pipeline({"LEASED_CRAWL_ID": crawl_id,
                                             "LEASED_UPSERT_URL": url,
                                             "LEASED_UPSERT_PREFIX": prefix})
        try:
            items = [{"url": f"u{i}", "text": "bad \x00" if i == 2 else "ok"} for i in range(5)]
            results = await asyncio.gather(*(pipe.process_item(i) for i in items),
                                           return_exceptions=True)
        finally:
            await pipe.close_spider()
        return crawler, results

    try:
        crawler, results = asyncio.run(main())
        assert isinstance(results[2], StoreError) and "u0000" in str(results[2])
        assert all(isinstance(r, dict) for n, r in enumerate(results) if n != 2)
        assert set(pg_records(url, f"{prefix}_dict")) == {"u0", "u1", "u3", "u4"}
        assert stat(crawler, "errors") == 1 and stat(crawler, "written") == 4
    finally:
        drop_tables(url, prefix)
