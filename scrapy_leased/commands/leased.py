"""``scrapy leased``: watch and run a leased crawl from the command line.

    scrapy leased status [CRAWL] [--watch [--interval S]] [--json] [--sample S]
    scrapy leased dead   [CRAWL] [--limit N] [--json] [--requeue [URL ...] | --purge [URL ...]]
    scrapy leased seed   [CRAWL] [--scrapy-redis] URL ... | -f FILE | -
    scrapy leased forget [CRAWL] URL ... | -f FILE | -
    scrapy leased reset  [CRAWL] --yes [--records]
    scrapy leased pause | resume | stop [CRAWL]
    scrapy leased metrics   [CRAWL | --all-crawls] [--bind HOST] [--port N]
    scrapy leased dashboard [CRAWL] [--bind HOST] [--port N] [--allow-writes]
    scrapy leased embedded status | stop
    scrapy leased from-scrapy-redis SPIDER [--pickle] [--seen-urls FILE] [--queue-key K] [--dupefilter-key K] [--start-urls-key K]

CRAWL defaults to the project's LEASED_CRAWL_ID, else to the name of the project's
only spider. Redis: ``--redis-url``, else the project's LEASED_REDIS_URL, else the
embedded Redis of the project's ``.scrapy`` directory when one runs there (``seed``
starts it, like a worker would). Errors are one line on stderr, exit status 1.

Synchronous code, not on a reactor: each subcommand is one ``asyncio.run`` over
``FleetAdmin`` (the same code the workers use); waiting with sleep is fine here. This
module holds the options and the dispatch; each subcommand is a module beside it
(``status``, ``dead``, ``urls``: seed and forget, ``control``: pause, resume, stop and
reset, ``serve``: metrics and dashboard, ``embedded``, ``fromsr``), ``common`` what
they share.
"""  # noqa: E501 (a usage line: one line each, tests/test_cli_help.py)

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING, Any, ClassVar

from redis.exceptions import RedisError
from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError

from .._redis.connection import make_client, redact
from ..fleet import FleetAdmin
from ..frontier import CrawlKeys, NewRequest
from ..settings import (
    LeasedConfig,
    LeasedConfigError,
)
from .common import (
    BIND,
    CONTROL,
    DASHBOARD_PORT,
    FROM_SR,
    METRICS_PORT,
    SERVERS,
    SUBCOMMANDS,
    URL_SUBCOMMANDS,
    CommandError,
    _check_options,
    _concurrency,
    _crawl_id,
    _looks_like_source,
    _redis_url,
    check_reached,
)
from .control import _control, _reset
from .dead import _dead
from .embedded import _embedded
from .fromsr import _from_scrapy_redis, _scrapy_redis_hint
from .serve import _serve
from .status import _status
from .urls import _forget, _packed, _read_urls, _seed

if TYPE_CHECKING:
    import argparse

    from scrapy.settings import Settings


class Command(ScrapyCommand):
    requires_project = False  # ignored for entry-point commands anyway
    requires_crawler_process = False
    default_settings: ClassVar[dict[str, Any]] = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return ("status|dead|seed|forget|reset|pause|resume|stop|metrics|dashboard|embedded "
                "[CRAWL] [options]\n\n"
                "  status [CRAWL] [--json] [--sample SECONDS] [--watch [--interval SECONDS]]\n"
                "  dead   [CRAWL] [--limit N] [--json] [--requeue [URL ...] | --purge [URL ...]]\n"
                "  seed   [CRAWL] [--scrapy-redis] URL ... | -f FILE | -\n"
                "  forget [CRAWL] URL ... | -f FILE | -\n"
                "  reset  [CRAWL] --yes [--records]\n"
                "  pause | resume | stop [CRAWL]\n"
                "  metrics   [CRAWL | --all-crawls] [--bind HOST] [--port N]\n"
                "  dashboard [CRAWL] [--bind HOST] [--port N] [--allow-writes]\n"
                "  embedded status | stop\n"
                "  from-scrapy-redis SPIDER [--pickle] [--seen-urls FILE] [--queue-key K] "
                "[--dupefilter-key K] [--start-urls-key K]")

    def short_desc(self) -> str:
        return ("Watch and run a leased crawl: status, dead letters, seeding, forgetting, "
                "reset, pause/resume/stop")

    def long_desc(self) -> str:
        return ("Watch and run a scrapy_leased crawl. CRAWL defaults to LEASED_CRAWL_ID, "
                "else to the project's only spider. Redis: --redis-url, else "
                "LEASED_REDIS_URL, else the project's embedded Redis.")

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        g = parser.add_argument_group("scrapy leased")
        g.add_argument("--redis-url", metavar="URL",
                       help="Redis of the crawl (default LEASED_REDIS_URL, else the "
                            "project's embedded Redis)")
        g.add_argument("--json", action="store_true",
                       help="[status, dead] machine-readable JSON (with --watch, one object "
                            "per line)")
        g.add_argument("--watch", action="store_true",
                       help="[status] redraw every --interval seconds, like top")
        g.add_argument("--interval", type=float, default=None, metavar="SECONDS",
                       help="[status --watch] refresh period (default 2)")
        g.add_argument("--sample", type=float, default=None, metavar="SECONDS",
                       help="[status] trend window of the warnings, one status taking two "
                            "samples this far apart (default 2; 0 = one sample, no trends); "
                            "--watch compares with the sample this old (default 10)")
        g.add_argument("--limit", type=int, default=None, metavar="N",
                       help="[dead] list at most N dead letters, newest first (0 = all)")
        g.add_argument("--requeue", nargs="*", metavar="URL", default=None,
                       help="[dead] requeue these dead letters (all without URL), attempts "
                            "reset to 0")
        g.add_argument("--purge", nargs="*", metavar="URL", default=None,
                       help="[dead] delete these dead letters (all without URL)")
        g.add_argument("-f", "--file", metavar="FILE", action="append", default=[],
                       help="[seed, forget] read URLs from FILE, one a line ('-' = stdin)")
        g.add_argument("--yes", action="store_true",
                       help="[reset] really delete the keys of the crawl")
        g.add_argument("--records", action="store_true",
                       help="[reset] delete UpsertPipeline's records of the crawl too "
                            "(kept without it)")
        g.add_argument("--bind", metavar="HOST", default=None,
                       help=f"[metrics, dashboard] address to listen on (default {BIND})")
        g.add_argument("--port", type=int, default=None, metavar="N",
                       help=f"[metrics, dashboard] port (default {METRICS_PORT}, "
                            f"{DASHBOARD_PORT}; 0 = any free port, printed)")
        g.add_argument("--all-crawls", action="store_true",
                       help="[metrics] every crawl in this Redis (default without CRAWL, "
                            "LEASED_CRAWL_ID or a single project spider)")
        g.add_argument("--allow-writes", action="store_true",
                       help="[dashboard] offer requeue and purge of dead letters")
        g.add_argument("--scrapy-redis", action="store_true",
                       help="[seed] read the lines as RedisSpider start entries, in scrapy-redis's "
                            "JSON (url, method, meta, every other key a form field)")
        g.add_argument("--pickle", action="store_true",
                       help=f"[{FROM_SR}] read a pickled scrapy-redis queue, scrapy-redis's "
                            "default serializer; unpickling runs code, so only for a "
                            "trusted Redis")
        g.add_argument("--seen-urls", metavar="FILE", default=None,
                       help=f"[{FROM_SR}] mark these URLs (one a line; '-' = stdin) seen, the "
                            "pages the scrapy-redis crawl fetched already")
        g.add_argument("--queue-key", metavar="KEY", default=None,
                       help=f"[{FROM_SR}] the scrapy-redis queue (default "
                            "SCHEDULER_QUEUE_KEY, else SPIDER:requests)")
        g.add_argument("--dupefilter-key", metavar="KEY", default=None,
                       help=f"[{FROM_SR}] the scrapy-redis dupefilter (default "
                            "SCHEDULER_DUPEFILTER_KEY, else SPIDER:dupefilter)")
        g.add_argument("--start-urls-key", metavar="KEY", default=None,
                       help=f"[{FROM_SR}] RedisSpider's start URLs (default "
                            "REDIS_START_URLS_KEY, else SPIDER:start_urls)")

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        if not args or args[0] not in SUBCOMMANDS:
            what = f"unknown subcommand {args[0]!r}" if args else "missing subcommand"
            raise UsageError(f"{what}: use one of {', '.join(SUBCOMMANDS)}")
        sub, rest = args[0], args[1:]
        assert self.settings is not None
        if sub == "embedded":
            self.exitcode = _embedded(rest, opts, self.settings)
            return
        _check_options(sub, rest, opts)
        if sub == FROM_SR and len(rest) != 1:
            raise UsageError(f"'{sub}' takes one SPIDER (the scrapy-redis spider's name), "
                             f"got {' '.join(rest) or 'none'}")
        try:
            self.exitcode = asyncio.run(_main(sub, rest, opts, self.settings))
        except (CommandError, LeasedConfigError) as exc:  # a bad setting: its name, no trace
            print(f"Error: {exc}", file=sys.stderr)
            self.exitcode = 1
        except (RedisError, OSError) as exc:  # Redis went away in the middle
            print(f"Error: Redis: {type(exc).__name__}: {exc}", file=sys.stderr)
            self.exitcode = 1
        except KeyboardInterrupt:
            self.exitcode = 0


async def _main(sub: str, rest: list[str], opts: argparse.Namespace, settings: Settings) -> int:
    config = LeasedConfig.from_settings(settings)  # a bad setting: before Redis is reached
    if sub == "status" or sub in SERVERS:
        _concurrency(settings)
    if sub == FROM_SR:
        return await _from_scrapy_redis(rest[0], opts, settings, config)
    crawl_arg = None
    if rest and not (sub in URL_SUBCOMMANDS and _looks_like_source(rest[0])):
        crawl_arg, rest = rest[0], rest[1:]
    lines: list[str] = []
    requests: list[NewRequest] = []
    if sub in URL_SUBCOMMANDS:  # a bad line or setting: before Redis is reached (or started)
        lines = _read_urls(rest, opts.file)
        requests = _packed(lines, settings, config, sub,
                           scrapy_redis=bool(opts.scrapy_redis))
    url, source = _redis_url(opts, config, start_embedded=sub == "seed")
    client = make_client(url)
    try:
        await check_reached(client, url, source)
        if sub in SERVERS:
            return await _serve(sub, crawl_arg, opts, settings, config, client, redact(url))
        crawl = await _crawl_id(crawl_arg, settings, config, client)
        admin = FleetAdmin(client, CrawlKeys(crawl), worker_ttl_ms=int(config.worker_ttl * 1000),
                           lease_ms=config.lease_ms, max_attempts=config.max_attempts,
                           half_life_ms=config.budgets.half_life_ms)
        exists = await admin.exists()
        hint = await _scrapy_redis_hint(client, crawl, settings, exists) \
            if sub == "status" else None
        if sub != "seed" and not exists:
            crawls = await FleetAdmin.list_crawls(client)
            raise CommandError(
                f"unknown crawl {crawl!r} in Redis at {redact(url)}: no key "
                f"{admin.keys.prefix}*; crawls there: {', '.join(crawls) or 'none'}"
                + (f". WARNING: {hint}" if hint else ""))
        if hint:  # on stderr: --json keeps stdout one object
            print(f"WARNING: {hint}", file=sys.stderr)
        if sub == "status":
            return await _status(admin, opts, settings, redact(url), config.budgets)
        if sub == "dead":
            return await _dead(admin, opts)
        if sub == "seed":
            return await _seed(admin, lines, requests, config)
        if sub == "forget":
            return await _forget(admin, lines, requests, config)
        if sub in CONTROL:
            return await _control(admin, sub, config)
        return await _reset(admin, opts, redact(url), config.upsert.prefix)
    finally:
        await client.aclose()


