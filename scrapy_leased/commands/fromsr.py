"""``scrapy leased from-scrapy-redis``: a scrapy-redis crawl's queue moved into a crawl."""


from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from scrapy.settings import Settings

from ..fleet import FleetAdmin
from ..fleet.report import n_of
from ..fleet.seen import mark_seen
from ..frontier import CrawlKeys, NewRequest
from ..settings import LeasedConfig, check_crawl_id
from .common import AddParser, CommandError, connected
from .urls import _packed, _read_urls


def add_parsers(add: AddParser) -> None:
    p = add("from-scrapy-redis", "SPIDER [--pickle] [--seen-urls FILE] [--queue-key K] "
            "[--dupefilter-key K] [--start-urls-key K]",
            "move a stopped scrapy-redis crawl into the crawl")
    p.add_argument("spider", metavar="SPIDER", help="the scrapy-redis spider's name")
    p.add_argument("--pickle", action="store_true",
                   help="read a pickled scrapy-redis queue, scrapy-redis's default "
                        "serializer; unpickling runs code, so only for a trusted Redis")
    p.add_argument("--seen-urls", metavar="FILE", default=None,
                   help="mark these URLs (one a line; '-' = stdin) seen, the pages the "
                        "scrapy-redis crawl fetched already")
    for option, what, setting, default in (
            ("--queue-key", "the scrapy-redis queue", "SCHEDULER_QUEUE_KEY", "requests"),
            ("--dupefilter-key", "the scrapy-redis dupefilter", "SCHEDULER_DUPEFILTER_KEY",
             "dupefilter"),
            ("--start-urls-key", "RedisSpider's start URLs", "REDIS_START_URLS_KEY",
             "start_urls")):
        p.add_argument(option, metavar="KEY", default=None,
                       help=f"{what} (default {setting}, else SPIDER:{default})")
    p.set_defaults(run=run)


async def run(opts: argparse.Namespace, settings: Settings, config: LeasedConfig) -> int:
    """Move a stopped scrapy-redis crawl of SPIDER into the crawl (LEASED_CRAWL_ID, else
    SPIDER): mark --seen-urls seen first, then its queue and RedisSpider start URLs are
    pushed as ``seed`` pushes (dedupe, lanes) and each batch removed from its key once
    the crawl has it; its dupefilter is left alone (its fingerprints are not Scrapy's)."""
    from scrapy.spiderloader import get_spider_loader

    from ..feed import fromscrapyredis as fsr

    spider = opts.spider
    try:
        spidercls = get_spider_loader(settings).load(spider)
    except KeyError:
        raise CommandError(f"no spider named {spider!r} in this project: run this in the "
                           f"project directory of the scrapy-redis spider (its callbacks "
                           f"are found on its class)") from None
    crawl = config.crawl_id or check_crawl_id(spider, "SPIDER")
    source = fsr.SourceKeys.of(spider, settings, queue=opts.queue_key,
                               dupefilter=opts.dupefilter_key, start_urls=opts.start_urls_key)
    seen_lines, seen = _seen_urls(opts, settings, config)
    if opts.pickle:
        print("Warning: --pickle: each queue entry is unpickled, and unpickling runs "
              "whatever code the entry names: do this only with a Redis whose writers you "
              "trust", file=sys.stderr)
    async with connected(opts, config) as (client, where):
        found = {f.role: f for f in await fsr.find(client, source)}
        if not found and not seen:
            raise CommandError(
                f"no scrapy-redis state of spider {spider!r} in Redis at {where}: no "
                f"key {source.queue}, {source.start_urls} or {source.dupefilter} (other "
                f"names: --queue-key, --start-urls-key, --dupefilter-key)")
        admin = FleetAdmin(client, CrawlKeys(crawl), lease_ms=config.lease_ms,
                           max_attempts=config.max_attempts)
        sources, pack = await _checked_sources(client, source, settings, config, opts,
                                               spidercls)
        try:
            if seen:
                added = await mark_seen(
                    admin, [(r.bucket, r.member) for r in seen if r.bucket is not None],
                    config.seen_bucket_bits, config.seen_ttl_ms)
                print(f"crawl {crawl!r}: marked {n_of(len(seen_lines), 'URL')} seen "
                      f"({sum(added):,} new, {len(added) - sum(added):,} seen already)")
            for (key, kind), what in zip(sources, ("queued request", "start URL")):
                if kind != "none":
                    await _move_source(client, admin, config, crawl, (key, kind, what), pack)
        except ValueError as exc:  # a seen-set layout the crawl was started with another
            raise CommandError(str(exc)) from None
        _print_left(found.get("dupefilter"), sources, source)
        return 0


def _print_left(df: Any, sources: list[tuple[str, str]], source: Any) -> None:
    """What a migration leaves: the scrapy-redis dupefilter, or nothing pending."""
    if df is not None:
        print(f"kept {df.key} ({df.size:,} fingerprints): scrapy-redis's own SHA1 of "
              f"each request, not Scrapy's fingerprints, so it cannot be carried over "
              f"(--seen-urls marks crawled URLs seen instead); delete it once done "
              f"(redis-cli DEL {df.key})")
    if all(kind == "none" for _, kind in sources):
        print(f"nothing pending in {source.queue} or {source.start_urls}")


def _seen_urls(opts: argparse.Namespace, settings: Settings, config: LeasedConfig
               ) -> tuple[list[str], list[NewRequest]]:
    """The URLs of --seen-urls and their requests (fingerprinted), read before Redis is
    reached."""
    if opts.seen_urls is None:
        return [], []
    lines = _read_urls([], [opts.seen_urls])
    if not lines:
        raise CommandError(f"--seen-urls {opts.seen_urls}: no URL in it")
    return lines, _packed(lines, settings, config, "mark seen")


async def _checked_sources(client: Any, source: Any, settings: Settings, config: LeasedConfig,
                           opts: argparse.Namespace, spidercls: type
                           ) -> tuple[list[tuple[str, str]], Callable[[str, list[bytes]],
                                                                      list[NewRequest]]]:
    """The scrapy-redis queue and start-URL keys with their types, and how to pack a
    batch of each; every entry read and checked before anything is written (a batch at
    a time), else CommandError (nothing done)."""
    from ..feed import fromscrapyredis as fsr
    from ..feed.packer import RequestPacker

    packer = RequestPacker.from_settings(settings, config)
    try:
        sources = [(source.queue, await fsr.source_type(client, source.queue)),
                   (source.start_urls, await fsr.source_type(client, source.start_urls))]
        loads: Any = None
        if sources[0][1] != "none":
            loads = fsr.serializer_of(settings, opts.pickle)

        def pack(key: str, raw: list[bytes]) -> list[NewRequest]:
            if key == source.queue:
                return fsr.pack_queue(raw, loads, spidercls, packer, key)
            return fsr.pack_start_urls(raw, packer, key)

        for key, kind in sources:
            if kind != "none":
                async for part in fsr.every_entry(client, key, kind):
                    pack(key, part)
    except fsr.MigrationError as exc:
        raise CommandError(f"{exc}; nothing done") from None
    return sources, pack


async def _move_source(client: Any, admin: FleetAdmin, config: LeasedConfig, crawl: str,
                       what: tuple[str, str, str],
                       pack: Callable[[str, list[bytes]], list[NewRequest]]) -> None:
    """Move the entries of one scrapy-redis key (``what``: key, its type, what an entry
    is) into the crawl, a batch at a time: pushed, then removed from the key."""
    from ..feed import fromscrapyredis as fsr

    key, kind, noun = what
    moved = new = 0
    while True:
        raw = await fsr.next_entries(client, key, kind)
        if not raw:
            break
        try:
            packed = pack(key, raw)
        except fsr.MigrationError as exc:  # written meanwhile: stop here
            raise CommandError(f"{exc}; {moved:,} moved before it, the rest "
                               f"left in {key}") from None
        # the crawl has the batch before it leaves the source (a crash between the two: a
        # re-run pushes this batch again, deduplicated but for its dont_filter requests)
        new += sum(await admin.seed(packed, config.seen_bucket_bits, config.seen_ttl_ms))
        if not await fsr.remove_source(client, key, kind, raw):
            raise CommandError(f"{key}: the entries moved could not be removed from it "
                               f"(changed meanwhile? stop every scrapy-redis worker "
                               f"first); {moved:,} moved")
        moved += len(raw)
    if moved:
        print(f"crawl {crawl!r}: moved {n_of(moved, noun)} from {key} ({new:,} queued, "
              f"{moved - new:,} seen already); removed from {key}")
