"""``scrapy leased seed`` and ``forget``: URLs read, checked and fingerprinted before Redis
is reached, then queued or forgotten."""


from __future__ import annotations

import argparse
import sys
from pathlib import Path

from scrapy.settings import Settings

from ..fleet import FleetAdmin
from ..fleet.report import n_of
from ..frontier import NewRequest
from ..settings import LeasedConfig
from .common import AddParser, CommandError, _looks_like_source, connected, open_crawl


def add_parsers(add: AddParser) -> None:
    seed = add("seed", "[CRAWL] [--scrapy-redis] URL ... | -f FILE | -",
               "queue URLs or requests, deduplicated as a worker's")
    seed.add_argument("--scrapy-redis", action="store_true",
                      help="read the lines as RedisSpider start entries, in scrapy-redis's "
                           "JSON (url, method, meta, every other key a form field)")
    forget = add("forget", "[CRAWL] URL ... | -f FILE | -",
                 "remove URLs from the seen set, to be queued again")
    for p, run in ((seed, run_seed), (forget, run_forget)):
        p.add_argument("sources", nargs="*", metavar="[CRAWL] URL",
                       help="the crawl (when the first is not a URL or -), then URLs or "
                            "JSON requests ('-' = stdin)")
        p.add_argument("-f", "--file", metavar="FILE", action="append", default=[],
                       help="read URLs from FILE, one a line ('-' = stdin)")
        p.set_defaults(run=run)


async def run_seed(opts: argparse.Namespace, settings: Settings, config: LeasedConfig) -> int:
    crawl_arg, lines, requests = _requests(opts, settings, config, "seed",
                                            scrapy_redis=opts.scrapy_redis)
    async with connected(opts, config, start_embedded=True) as (client, where):
        admin = await open_crawl(crawl_arg, settings, config, client, where, create=True)
        return await _seed(admin, lines, requests, config)


async def run_forget(opts: argparse.Namespace, settings: Settings, config: LeasedConfig) -> int:
    crawl_arg, lines, requests = _requests(opts, settings, config, "forget")
    async with connected(opts, config) as (client, where):
        admin = await open_crawl(crawl_arg, settings, config, client, where)
        return await _forget(admin, lines, requests, config)


def _requests(opts: argparse.Namespace, settings: Settings, config: LeasedConfig,
              what: str, scrapy_redis: bool = False
              ) -> tuple[str | None, list[str], list[NewRequest]]:
    """The CRAWL argument (the first, unless a URL or -), the lines read and their
    requests: a bad line or setting is told before Redis is reached (or started)."""
    crawl_arg, rest = None, list(opts.sources)
    if rest and not _looks_like_source(rest[0]):
        crawl_arg, rest = rest[0], rest[1:]
    lines = _read_urls(rest, opts.file)
    return crawl_arg, lines, _packed(lines, settings, config, what, scrapy_redis)


def _read_urls(sources: list[str], files: list[str]) -> list[str]:
    lines: list[str] = []
    for name in files + [s for s in sources if s == "-"]:
        try:
            text = sys.stdin.read() if name == "-" else Path(name).read_text(encoding="utf-8")
        except OSError as exc:
            raise CommandError(f"cannot read {name}: {exc.strerror}") from None
        lines += text.splitlines()
    lines += [s for s in sources if s != "-"]
    return [u.strip() for u in lines if u.strip() and not u.lstrip().startswith("#")]


def _packed(lines: list[str], settings: Settings, config: LeasedConfig,
            what: str, scrapy_redis: bool = False) -> list[NewRequest]:
    """Each line (a URL, or a JSON request in the feed's format: feed/format.py; with
    ``scrapy_redis``, in RedisSpider's: format.py parse_scrapy_redis_entry) as the
    frontier queues it: its seen-set entry is Scrapy's fingerprint
    (REQUEST_FINGERPRINTER_CLASS), as a worker computes it."""
    from ..feed.crawl import to_feed_request
    from ..feed.format import FeedEntryError, parse_scrapy_redis_entry
    from ..feed.packer import RequestPacker

    if not lines:
        raise CommandError(f"nothing to {what}: give URLs, -f FILE or - (stdin)")
    packer = RequestPacker.from_settings(settings, config)
    requests = []
    for i, line in enumerate(lines):
        try:
            if scrapy_redis:
                try:
                    fed = parse_scrapy_redis_entry(line)
                except FeedEntryError as exc:
                    raise FeedEntryError(f"request {i + 1}: {exc}") from None
            else:
                fed = to_feed_request(line, i + 1)
            requests.append(packer.pack(fed.request, fed.names))
        except ValueError as exc:  # FeedEntryError, PayloadError
            raise CommandError(f"{exc}; nothing done") from None
        except RecursionError:
            raise CommandError(f"request {i + 1}: nested too deeply; nothing done") from None
    return requests


async def _seed(admin: FleetAdmin, lines: list[str], requests: list[NewRequest],
                config: LeasedConfig) -> int:
    try:
        queued = await admin.seed(requests, config.seen_bucket_bits, config.seen_ttl_ms)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    n = sum(queued)
    print(f"seeded crawl {admin.keys.crawl_id!r}: {n_of(len(lines), 'URL')}, {n:,} queued, "
          f"{len(lines) - n:,} already seen")
    return 0


async def _forget(admin: FleetAdmin, urls: list[str], requests: list[NewRequest],
                  config: LeasedConfig) -> int:
    entries = [(r.bucket, r.member) for r in requests
               if r.bucket is not None]  # (dont_filter: never in the seen set)
    try:
        await admin.frontier.check_layout(config.seen_bucket_bits, config.seen_ttl_ms)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    forgotten = await admin.forget(entries)
    n = sum(forgotten)
    print(f"forgot {n:,} of {n_of(len(urls), 'URL')} of crawl {admin.keys.crawl_id!r} "
          f"({len(urls) - n:,} not seen); each is queued again the next time it is sent "
          f"(a new run's start requests, a link, scrapy leased seed). A worker running now "
          f"may still skip one it remembers (LEASED_SEEN_CACHE): start workers afterwards")
    return 0
