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
``FleetAdmin`` (the same code the workers use); waiting with sleep is fine here.
"""  # noqa: E501 (a usage line: one line each, tests/test_cli_help.py)

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import time
from collections import deque
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from redis.exceptions import RedisError
from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError

from .._redis.connection import make_client, redact
from ..bootstrap import crawl_redis_url
from ..config import (
    CRAWL_ID_RE,
    LeasedConfig,
    LeasedConfigError,
    check_crawl_id,
    check_redis_url,
    number_setting,
)
from ..fleet import DeadLetter, Diagnosis, FleetAdmin, Snapshot, diagnose
from ..fleet.seen import mark_seen
from ..frontier import PAUSED, RUNNING, STOPPING, CrawlKeys, NewRequest
from ..ratelimit.budgets import Budgets

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

    from scrapy.settings import Settings

SUBCOMMANDS = ("status", "dead", "seed", "forget", "reset", "pause", "resume", "stop",
               "metrics", "dashboard", "embedded", "from-scrapy-redis")
FROM_SR = "from-scrapy-redis"  # fromscrapyredis.py: a scrapy-redis crawl moved into this one
#: ``scrapy leased embedded ACTION``: the project's embedded Redis server itself
EMBEDDED_ACTIONS = ("status", "stop")
#: The subcommands that take URLs (arguments, -f FILE, - for stdin)
URL_SUBCOMMANDS = ("seed", "forget")
#: The fleet control subcommands and the control state each sets (keys.py: control)
CONTROL = {"pause": PAUSED, "resume": RUNNING, "stop": STOPPING}
SERVERS = ("metrics", "dashboard")  # observe/: HTTP servers, reading Redis only
METRICS_PORT = 9410
DASHBOARD_PORT = 8410
BIND = "127.0.0.1"  # metrics and dashboard listen here by default
WATCH_INTERVAL_SECONDS = 2.0  # --watch redraws this often
SAMPLE_SECONDS = 2.0  # one status: two samples this far apart give the trends
WATCH_TREND_SECONDS = 10.0  # --watch: trends against the sample this old
DEAD_LIMIT = 20  # dead letters listed by default
MEMORY_WARN_SHARE = 0.8  # warn when Redis uses this share of its maxmemory
CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear screen: --watch redraws in place


class CommandError(Exception):
    """Printed as one line on stderr; exit status 1."""


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


def _check_options(sub: str, rest: list[str], opts: argparse.Namespace) -> None:
    """A usage error for an option given to a subcommand that does not take it (each
    option of the add-on's group defaults to None or False, so that given is told from
    not given), and for values out of range."""
    misplaced = {
        "--watch": opts.watch and sub != "status",
        "--interval": opts.interval is not None and sub != "status",
        "--sample": opts.sample is not None and sub != "status",
        "--json": opts.json and sub not in ("status", "dead"),
        "--limit": opts.limit is not None and sub != "dead",
        "--requeue": opts.requeue is not None and sub != "dead",
        "--purge": opts.purge is not None and sub != "dead",
        "--file": bool(opts.file) and sub not in URL_SUBCOMMANDS,
        "--yes": opts.yes and sub != "reset",
        "--records": opts.records and sub != "reset",
        "--bind": opts.bind is not None and sub not in SERVERS,
        "--port": opts.port is not None and sub not in SERVERS,
        "--all-crawls": opts.all_crawls and sub != "metrics",
        "--allow-writes": opts.allow_writes and sub != "dashboard",
        "--scrapy-redis": opts.scrapy_redis and sub != "seed",
        "--pickle": opts.pickle and sub != FROM_SR,
        "--seen-urls": opts.seen_urls is not None and sub != FROM_SR,
        "--queue-key": opts.queue_key is not None and sub != FROM_SR,
        "--dupefilter-key": opts.dupefilter_key is not None and sub != FROM_SR,
        "--start-urls-key": opts.start_urls_key is not None and sub != FROM_SR,
    }
    bad = [name for name, wrong in misplaced.items() if wrong]
    if bad:
        raise UsageError(f"{', '.join(bad)} cannot be used with '{sub}'")
    if opts.requeue is not None and opts.purge is not None:
        raise UsageError("use --requeue or --purge, not both")
    if sub not in URL_SUBCOMMANDS and len(rest) > 1:
        raise UsageError(f"'{sub}' takes at most one CRAWL, got {' '.join(rest)}")
    if ((opts.interval is not None and opts.interval <= 0)
            or (opts.sample is not None and opts.sample < 0)
            or (opts.limit is not None and opts.limit < 0)):
        raise UsageError("--interval must be above 0, --sample and --limit at least 0")


# -- resolving the crawl and its Redis -------------------------------------------------


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
        try:
            await client.ping()
        except Exception as exc:
            raise CommandError(f"cannot reach Redis at {redact(url)} ({source}): "
                               f"{type(exc).__name__}: {exc}") from None
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


def _concurrency(settings: Settings) -> int:
    """CONCURRENT_REQUESTS, the capacity of a worker that did not record its own."""
    return int(number_setting(settings, "CONCURRENT_REQUESTS", 16, minimum=1, integer=True,
                              exclusive=False))


def _looks_like_source(arg: str) -> bool:
    return arg == "-" or "://" in arg


def _redis_url(opts: argparse.Namespace, config: LeasedConfig,
               start_embedded: bool) -> tuple[str, str]:
    if opts.redis_url:
        try:
            return check_redis_url(opts.redis_url, "--redis-url"), "--redis-url"
        except LeasedConfigError as exc:
            raise CommandError(str(exc)) from None
    if config.redis_url:
        return config.redis_url, "LEASED_REDIS_URL"
    from .._redis.embedded import EmbeddedRedisError

    source = f"embedded Redis in {config.embedded_dir}"
    try:  # a running one (or restarted from its data), else (seed) start it
        url, _ = crawl_redis_url(config, start=False)
        if url is None and start_embedded:
            url, _ = crawl_redis_url(config)
    except EmbeddedRedisError as exc:
        raise CommandError(str(exc).splitlines()[0]) from None
    if url is None:
        raise CommandError(
            f"no Redis to read: LEASED_REDIS_URL is not set and no embedded Redis runs in "
            f"{config.embedded_dir}; pass --redis-url URL, or run this in the project "
            f"directory of the workers")
    return url, source


async def _crawl_id(arg: str | None, settings: Settings, config: LeasedConfig,
                    client: Any) -> str:
    if arg is not None:
        try:
            return check_crawl_id(arg, "CRAWL")
        except LeasedConfigError as exc:
            raise CommandError(str(exc)) from None
    if config.crawl_id:
        return config.crawl_id
    from scrapy.spiderloader import get_spider_loader

    spiders = sorted(get_spider_loader(settings).list())
    if len(spiders) == 1:
        return spiders[0]
    crawls = await FleetAdmin.list_crawls(client)
    where = (f"this project has {len(spiders)} spiders ({', '.join(spiders)})" if spiders
             else "no project spider to take it from")
    raise CommandError(f"name the crawl: {where} and LEASED_CRAWL_ID is not set; crawls "
                       f"in this Redis: {', '.join(crawls) or 'none'}")


# -- metrics, dashboard ---------------------------------------------------------------


async def _serve(sub: str, crawl_arg: str | None, opts: argparse.Namespace,
                 settings: Settings, config: LeasedConfig, client: Any, where: str) -> int:
    try:
        from ..observe.reader import FleetReader
        from ..observe.server import dashboard_app, metrics_app, serve
        if sub == "metrics":  # prometheus-client installed?
            import_module("..observe.metrics", __package__)
    except ImportError as exc:
        raise CommandError(str(exc)) from None
    crawl: str | None = crawl_arg
    if crawl is None and not opts.all_crawls:
        try:
            crawl = await _crawl_id(None, settings, config, client)
        except CommandError:
            crawl = None  # no default crawl: every crawl of this Redis
    if crawl is not None and not CRAWL_ID_RE.match(crawl):
        raise CommandError(f"CRAWL ({crawl!r}) must be a crawl id without spaces or braces")
    try:
        budgets = Budgets.from_settings(settings)
    except LeasedConfigError as exc:
        raise CommandError(str(exc)) from None
    only = [crawl] if sub == "metrics" and crawl is not None else None
    reader = FleetReader(client, where, budgets, worker_ttl_ms=int(config.worker_ttl * 1000),
                         lease_ms=config.lease_ms, max_attempts=config.max_attempts,
                         default_capacity=_concurrency(settings), only=only)
    if sub == "metrics":
        app, port, what = metrics_app(reader), METRICS_PORT, "Prometheus metrics"
    else:
        app, port, what = dashboard_app(reader, crawl, opts.allow_writes), DASHBOARD_PORT, (
            "Dashboard" + (" (writes allowed)" if opts.allow_writes else " (read-only)"))
    bind = BIND if opts.bind is None else opts.bind
    port = port if opts.port is None else opts.port
    try:
        await serve(app, bind, port, what)
    except OSError as exc:
        raise CommandError(f"cannot listen on {bind}:{port}: {exc.strerror}") from None
    return 0


# -- status ---------------------------------------------------------------------------


async def _status(admin: FleetAdmin, opts: argparse.Namespace, settings: Settings,
                  where: str, budgets: Budgets) -> int:
    default_cap = _concurrency(settings)
    if not opts.watch:
        sample = SAMPLE_SECONDS if opts.sample is None else opts.sample
        prev = None
        if sample > 0:
            prev = await admin.snapshot(workers=False, memory=False)
            await asyncio.sleep(sample)
        cur = await admin.snapshot()
        warnings = status_warnings(cur, prev, default_cap)
        _print_status(cur, prev, warnings, opts.json, where, budgets)
        return 0
    trend = WATCH_TREND_SECONDS if opts.sample is None else opts.sample
    interval = WATCH_INTERVAL_SECONDS if opts.interval is None else opts.interval
    history: deque[Snapshot] = deque()
    # Ctrl-C ends the watch once the redraw in progress is done: handled here rather
    # than by cancelling the task (asyncio.run's way), which a Redis call in flight can
    # lose, leaving the command running after Ctrl-C.
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGINT, stop.set)
    while not stop.is_set():
        started = time.monotonic()
        try:
            cur = await admin.snapshot()
        except Exception as exc:  # keep watching through a Redis restart
            line = f"cannot read Redis at {where}: {type(exc).__name__}: {exc}"
            print(json.dumps({"error": line}) if opts.json else CLEAR + line, flush=True)
        else:
            while len(history) > 1 and (cur.now_ms - history[1].now_ms) / 1000 >= trend:
                history.popleft()  # keep the newest sample at least `trend` old, if any
            prev = history[0] if history and trend > 0 else None
            history.append(cur)
            warnings = status_warnings(cur, prev, default_cap)
            if not opts.json:
                sys.stdout.write(CLEAR)
            _print_status(cur, prev, warnings, opts.json, where, budgets)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(),
                                   max(0.0, interval - (time.monotonic() - started)))
    return 0


def status_warnings(cur: Snapshot, prev: Snapshot | None,
                    default_cap: int) -> list[Diagnosis]:
    """The warnings ``status`` shows (the fleet's, and Redis memory)."""
    out = diagnose(cur, prev, default_cap)
    dropped = cur.totals.get("dropped", 0)
    if dropped:
        out.append(Diagnosis("dropped", (
            f"{_n(dropped, 'request')} dropped: the spider yielded "
            f"{'it' if dropped == 1 else 'them'} but {'it' if dropped == 1 else 'they'} "
            f"could not be stored (an object in meta or cb_kwargs, ...); each is a dead "
            f"letter with the reason and the fix: scrapy leased dead")))
    if cur.maxmemory and cur.used_memory and cur.used_memory > MEMORY_WARN_SHARE * cur.maxmemory:
        out.append(Diagnosis("memory", (
            f"Redis uses {cur.used_memory / cur.maxmemory:.0%} of its maxmemory: the crawl "
            f"stops when it is full")))
    return out


def _budget_text(budgets: Budgets, lane: str) -> str:
    b = budgets.for_lane(lane)
    if not b.interval_ms:
        return "none"
    per_s = 1000 / b.interval_ms
    rate = f"{per_s:,.4g}/s" if per_s >= 1 else f"{per_s * 60:,.4g}/min"
    return f"{rate} burst {b.burst}"


def status_doc(cur: Snapshot, prev: Snapshot | None, warnings: list[Diagnosis], where: str,
               budgets: Budgets) -> dict[str, Any]:
    """What ``status --json`` prints (also served by ``dashboard``)."""
    doc = cur.to_dict()
    doc["redis"] = where
    doc["sample_s"] = round(_dt(prev, cur), 3) if prev else 0
    doc["throughput"]["sample_pages_per_min"] = round(_rate(prev, cur), 1) if prev else None
    doc["budget"] = {"lanes_total": cur.lanes_total, "lanes": [
        {**lane.to_dict(), "budget": _budget_text(budgets, lane.lane)} for lane in cur.lanes]}
    doc["warnings"] = [{"code": d.code, "message": d.message} for d in warnings]
    return doc


def _print_status(cur: Snapshot, prev: Snapshot | None, warnings: list[Diagnosis],
                  as_json: bool, where: str, budgets: Budgets) -> None:
    if as_json:
        print(json.dumps(status_doc(cur, prev, warnings, where, budgets)), flush=True)
        return
    print(render_status(cur, prev, warnings, where, budgets), flush=True)


def _n(count: int, word: str) -> str:
    return f"{count:,} {word}{'' if count == 1 else 's'}"


def _age(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _dt(prev: Snapshot, cur: Snapshot) -> float:
    return (cur.now_ms - prev.now_ms) / 1000


def _rate(prev: Snapshot, cur: Snapshot) -> float:
    """Pages per minute between two samples (done counter delta)."""
    return (cur.done - prev.done) * 60 / _dt(prev, cur) if _dt(prev, cur) > 0 else 0.0


def _control_line(cur: Snapshot) -> str:
    c = cur.control
    line = f"  state          {cur.state:>12}"
    if cur.state == c.state and c.since_ms:
        why = f"; {c.reason}" if c.reason else ""
        line += f"   (since {_age(max(0, cur.now_ms - c.since_ms) / 1000)} ago, by {c.by}{why})"
    return line


def render_status(cur: Snapshot, prev: Snapshot | None, warnings: list[Diagnosis],
                  where: str, budgets: Budgets | None = None) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(cur.now_ms / 1000))
    alive = [w for w in cur.workers if w.alive]
    gone = len(cur.workers) - len(alive)
    capacity = cur.capacity()
    lines = [
        f"crawl {cur.crawl}   redis {where}   {when}",
        "",
        _control_line(cur),
        f"  todo           {cur.todo:>12,}"
        + (f"   (+ {cur.feed:,} in the feed, not queued yet)" if cur.feed else "")
        + (f"   ({cur.feed_batches:,} feed batch{'' if cur.feed_batches == 1 else 'es'} "
           f"being queued)"
           if cur.feed_batches else ""),
        f"  processing     {cur.processing:>12,}"
        + (f"   (capacity of the live workers: {capacity:,})" if capacity is not None else ""),
        f"  done           {cur.done:>12,}",
        f"  dead           {cur.dead:>12,}",
        f"  workers alive  {cur.workers_alive:>12,}"
        + (f"   ({gone} gone: no heartbeat for longer than the worker TTL)" if gone else ""),
        f"  throughput     {cur.pages_per_min:>12,.0f} pages/min   "
        f"({cur.done_last_minute:,} done in the last {cur.window_s:.0f} s"
        + (f"; {_rate(prev, cur):,.0f}/min over the last {_dt(prev, cur):.1f} s)" if prev
           else ")"),
    ]
    if cur.used_memory is not None:
        mem = f"  redis memory   {cur.used_memory_human or cur.used_memory:>12}"
        if cur.maxmemory:
            mem += f"   (maxmemory {cur.maxmemory / 2**20:,.0f}M)"
        lines.append(mem)
    if cur.lanes:
        lines += ["", f"  {'host (lane)':<26} {'queued':>8} {'budget':>22} {'booked':>8} "
                      f"{'ready in':>9} {'blocked':>8} {'slowdown':>9}",]
        for lane in cur.lanes:
            budget = _budget_text(budgets, lane.lane) if budgets else "?"
            extra = f"   Crawl-delay {lane.crawl_delay_s:g} s" if lane.crawl_delay_s else ""
            lines.append(f"  {lane.lane or '(default)':<26} {lane.queued:>8,} {budget:>22} "
                         f"{lane.ahead_s:>7.1f}s {lane.ready_in_s:>8.1f}s "
                         f"{lane.blocked_s:>7.1f}s {lane.slowdown:>8.2f}x{extra}")
        if cur.lanes_total > len(cur.lanes):
            lines.append(f"  ... {cur.lanes_total - len(cur.lanes):,} more hosts with queued "
                         f"requests")
    if cur.stats:
        from ..observe.flush import headline_stats

        lines += ["", "  Scrapy stats of the whole fleet (all workers added up; all: --json)"]
        lines += [f"  {name:<44} {value:>14,}" if isinstance(value, int) else
                  f"  {name:<44} {value:>14,.1f}" for name, value in headline_stats(cur.stats)]
    if alive:
        lines += ["", f"  {'worker':<34} {'heartbeat':>11} {'in flight':>10} {'acked':>10} "
                      f"{'leases':>8}"]
        for w in alive:
            lines.append(f"  {w.id:<34} {_age(w.heartbeat_age_s) + ' ago':>11} "
                         f"{'?' if w.inflight is None else w.inflight:>10} "
                         f"{'?' if w.acked is None else f'{w.acked:,}':>10} "
                         f"{cur.leases_by_worker.get(w.id, 0):>8,}")
    orphans = cur.leases_of_gone_workers()
    if orphans:
        lines += ["", f"  leases of workers not alive, waiting to expire: "
                      f"{sum(orphans.values()):,}"]
        lines += [f"  {wid:<34} {n:>8,}" for wid, n in orphans.items()]
    lines.append("")
    if warnings:
        lines += [f"  WARNING: {d.message}" for d in warnings]
    elif prev is None:
        lines.append("  no warnings (one sample: trends not measured)")
    else:
        lines.append(f"  no warnings (trends over {_dt(prev, cur):.1f} s)")
    return "\n".join(lines)


# -- dead letters ---------------------------------------------------------------------


async def _dead(admin: FleetAdmin, opts: argparse.Namespace) -> int:
    crawl = admin.keys.crawl_id
    action = "requeue" if opts.requeue is not None else "purge" if opts.purge is not None \
        else None
    if action is None:
        limit = DEAD_LIMIT if opts.limit is None else opts.limit
        total, letters = await admin.dead_letters(limit=limit or None)
        if opts.json:
            print(json.dumps({"crawl": crawl, "dead": total,
                              "letters": [d.to_dict() for d in letters]}))
        else:
            print(render_dead(crawl, total, letters))
        return 0
    urls = opts.requeue if action == "requeue" else opts.purge
    for url in urls:
        if "://" not in url:
            raise CommandError(f"not a URL: {url!r} (name the crawl before --{action})")
    if urls:
        _, letters = await admin.dead_letters(urls=urls)
        missing = sorted(set(urls) - {d.url for d in letters})
        if not letters:  # nothing to do: one error, no "purged 0" before it
            raise CommandError(f"not in the dead letters of crawl {crawl!r}: "
                               f"{' '.join(missing)}")
    else:
        _, letters = await admin.dead_letters()
        missing = []
    if action == "requeue":
        result = await admin.requeue_dead(letters)
        print(f"requeued {_n(result.requeued, 'dead letter')} of crawl {crawl!r} "
              f"(attempts reset to 0)"
              + (f"; {result.already_done:,} were done meanwhile (dropped)"
                 if result.already_done else "")
              + (f"; {result.unreadable:,} unreadable kept (--purge them)"
                 if result.unreadable else ""))
        if result.dropped:
            raise CommandError(
                f"{_n(result.dropped, 'dropped request')} of crawl {crawl!r} not requeued: "
                "never queued, they could not be stored (their reason names the meta or "
                "cb_kwargs key and the fix), and what was kept of them is not the request "
                "the spider made. Fix the spider, seed their URLs again (scrapy leased "
                "seed), then --purge them")
    else:
        purged = await admin.purge_dead(letters if urls else None)
        print(f"purged {_n(purged, 'dead letter')} of crawl {crawl!r}")
    if missing:
        raise CommandError(f"not in the dead letters of crawl {crawl!r}: {' '.join(missing)}")
    return 0


def render_dead(crawl: str, total: int, letters: list[DeadLetter]) -> str:
    if not total:
        return f"crawl {crawl}: no dead letters"
    lines = [f"crawl {crawl}: {_n(total, 'dead letter')}"
             + (f", the newest {len(letters):,}:" if len(letters) < total else ":")]
    for d in letters:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(d.t_ms / 1000))
        target = f"{d.method} {d.url}" if d.url else "(unreadable envelope)"
        reason = " ".join(d.reason.split())
        if d.dropped:
            lines.append(f"  {when}  dropped (never queued)  {target}  callback {d.callback}")
        else:
            lines.append(f"  {when}  attempts {d.attempts}  {target}")
        lines.append(f"      {reason[:300]}{'...' if len(reason) > 300 else ''}")
        if d.dropped:
            kept = ("kept without " + ", ".join(d.removed) if d.removed else "kept whole") \
                if d.request is not None else "not kept"
            lines.append(f"      request {kept}; cannot be requeued: fix the spider, seed "
                         f"the URL again, purge the letter")
    return "\n".join(lines)


# -- seeding --------------------------------------------------------------------------


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
    print(f"seeded crawl {admin.keys.crawl_id!r}: {_n(len(lines), 'URL')}, {n:,} queued, "
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
    print(f"forgot {n:,} of {_n(len(urls), 'URL')} of crawl {admin.keys.crawl_id!r} "
          f"({len(urls) - n:,} not seen); each is queued again the next time it is sent "
          f"(a new run's start requests, a link, scrapy leased seed). A worker running now "
          f"may still skip one it remembers (LEASED_SEEN_CACHE): start workers afterwards")
    return 0


# -- pause, resume, stop --------------------------------------------------------------


async def _control(admin: FleetAdmin, sub: str, config: LeasedConfig) -> int:
    from ..worker.control import STOP_REASON  # (imports the worker's side: only here)

    crawl = admin.keys.crawl_id
    state = CONTROL[sub]
    by = f"scrapy leased {sub} ({socket.gethostname()}:{os.getpid()})"
    prev, since, now = await admin.set_control(state, by)
    snap = await admin.snapshot(memory=False)
    alive = sum(1 for w in snap.workers if w.alive)
    was = f"was {prev}" + (f" for {_age(max(0, now - since) / 1000)}" if since else "")
    print(f"crawl {crawl!r}: {state} ({was}); {_n(alive, 'worker')} alive")
    heard = (f"each worker sees it at its next claim or heartbeat (within "
             f"{config.renew_interval:g} s, LEASED_RENEW_INTERVAL), and so does a worker "
             f"started later")
    if state == PAUSED:
        print(f"  {heard}: it claims and starts nothing new, finishes what it started and "
              f"keeps its leases; `scrapy leased resume` continues")
    elif state == STOPPING:
        print(f"  {heard}: it finishes and acks what it started, gives back the rest and "
              f"exits with close reason {STOP_REASON!r}; workers started before `scrapy "
              f"leased resume` close at once with it")
    else:
        print("  workers claim again at their next claim or heartbeat; a stopped fleet "
              "continues where it stopped when workers are started again")
    return 0


# -- reset ----------------------------------------------------------------------------


async def _reset(admin: FleetAdmin, opts: argparse.Namespace, where: str,
                 records_prefix: str) -> int:
    crawl = admin.keys.crawl_id
    keys = await admin.crawl_keys()
    records = [] if opts.records else [k for k in keys
                                       if admin.keys.is_records(k, records_prefix)]
    if not opts.yes:
        keeping = (f", keeping {_n(len(records), 'records hash')} of UpsertPipeline "
                   f"(--records deletes them too)" if records else "")
        raise CommandError(f"reset deletes {_n(len(keys) - len(records), 'key')} of crawl "
                           f"{crawl!r} ({admin.keys.prefix}*) in {where}{keeping}: add --yes")
    snap = await admin.snapshot(memory=False)
    alive = [w for w in snap.workers if w.alive and not w.process_gone()]
    if alive:
        youngest = min(w.heartbeat_age_s for w in alive)
        raise CommandError(
            f"{_n(len(alive), 'worker')} of crawl {crawl!r} alive (last heartbeat "
            f"{_age(youngest)} ago): stop them first (a worker killed on another machine "
            f"counts as alive until its heartbeat is older than LEASED_WORKER_TTL)")
    deleted, kept = await admin.reset(records=opts.records, records_prefix=records_prefix)
    print(f"deleted {_n(deleted, 'key')} of crawl {crawl!r} ({admin.keys.prefix}*)"
          + (f"; kept {_n(kept, 'records hash')} of UpsertPipeline "
             f"({admin.keys.prefix}{records_prefix}:*; --records deletes them too)"
             if kept else ""))
    return 0


# -- embedded -------------------------------------------------------------------------


def _embedded(rest: list[str], opts: argparse.Namespace, settings: Settings) -> int:
    """``embedded status | stop``: the project's embedded Redis server (LEASED_EMBEDDED_DIR),
    whatever LEASED_REDIS_URL says. It stops by itself once no worker or command uses
    it; ``stop`` stops it now (its data stays for a later crawl)."""
    if len(rest) != 1 or rest[0] not in EMBEDDED_ACTIONS:
        got = f"got {' '.join(rest)!r}" if rest else "missing"
        raise UsageError(f"embedded takes one of {', '.join(EMBEDDED_ACTIONS)}: {got}")
    _check_options("embedded", [], opts)
    if opts.redis_url:
        raise UsageError("--redis-url cannot be used with 'embedded'")
    from .._redis.embedded import EmbeddedRedisError, embedded_state, stop_embedded_redis

    try:
        config = LeasedConfig.from_settings(settings)
        state = embedded_state(config.embedded_dir)
        where = f"embedded Redis in {state.data_dir}"
        data = "its data stays there" if state.has_data else "no crawl data there"
        if state.url is None:
            print(f"{where}: not running ({data})")
            return 0
        pid = f"pid {state.pid}" if state.pid is not None else "pid unknown"
        used = ("used by an unknown number of processes" if state.users is None else
                f"used by {len(state.users)} process{'' if len(state.users) == 1 else 'es'}"
                + (f" (pids {', '.join(map(str, state.users))})" if state.users else ""))
        if rest[0] == "status":
            print(f"{where}: running at {state.url} ({pid}), {used}; it stops by itself "
                  f"once no worker or command uses it")
            return 0
        if state.users:
            print(f"Warning: stopping it under {len(state.users)} process(es) that use it "
                  f"(pids {', '.join(map(str, state.users))}): they lose their Redis",
                  file=sys.stderr)
        stopped = stop_embedded_redis(config.embedded_dir)
    except (LeasedConfigError, EmbeddedRedisError) as exc:
        print(f"Error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    print(f"Stopped the {where} ({pid}); {data}, a later crawl resumes it" if stopped
          else f"{where}: not running ({data})")
    return 0


# -- from scrapy-redis ----------------------------------------------------------------


async def _scrapy_redis_hint(client: Any, crawl: str, settings: Settings,
                             exists: bool) -> str | None:
    """The warning that the crawl's spider (named as the crawl) has scrapy-redis state
    in this Redis (fromscrapyredis.py), or None."""
    from .. import fromscrapyredis

    try:
        found = await fromscrapyredis.find(client, fromscrapyredis.SourceKeys.of(crawl, settings))
    except RedisError:
        return None
    return fromscrapyredis.warning(found, crawl, exists)


async def _from_scrapy_redis(spider: str, opts: argparse.Namespace, settings: Settings,
                             config: LeasedConfig) -> int:
    """Move a stopped scrapy-redis crawl of SPIDER into the crawl (LEASED_CRAWL_ID, else
    SPIDER): mark --seen-urls seen first, then its queue and RedisSpider start URLs are
    pushed as ``seed`` pushes (dedupe, lanes) and each batch removed from its key once
    the crawl has it; its dupefilter is left alone (its fingerprints are not Scrapy's)."""
    from scrapy.spiderloader import get_spider_loader

    from .. import fromscrapyredis as fsr

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
    url, where = _redis_url(opts, config, start_embedded=False)
    client = make_client(url)
    try:
        try:
            await client.ping()
        except Exception as exc:
            raise CommandError(f"cannot reach Redis at {redact(url)} ({where}): "
                               f"{type(exc).__name__}: {exc}") from None
        found = {f.role: f for f in await fsr.find(client, source)}
        if not found and not seen:
            raise CommandError(
                f"no scrapy-redis state of spider {spider!r} in Redis at {redact(url)}: no "
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
                print(f"crawl {crawl!r}: marked {_n(len(seen_lines), 'URL')} seen "
                      f"({sum(added):,} new, {len(added) - sum(added):,} seen already)")
            for (key, kind), what in zip(sources, ("queued request", "start URL")):
                if kind != "none":
                    await _move_source(client, admin, config, crawl, (key, kind, what), pack)
        except ValueError as exc:  # a seen-set layout the crawl was started with another
            raise CommandError(str(exc)) from None
        _print_left(found.get("dupefilter"), sources, source)
        return 0
    finally:
        await client.aclose()


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
    from .. import fromscrapyredis as fsr
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
    from .. import fromscrapyredis as fsr

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
        print(f"crawl {crawl!r}: moved {_n(moved, noun)} from {key} ({new:,} queued, "
              f"{moved - new:,} seen already); removed from {key}")
