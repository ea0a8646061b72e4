"""What every subcommand of ``scrapy leased`` shares: its errors, the subcommand names and
defaults, and finding the crawl and its Redis."""


from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy.exceptions import UsageError

from .._redis.url import redact
from ..bootstrap import crawl_redis_url
from ..fleet import FleetAdmin
from ..frontier import PAUSED, RUNNING, STOPPING
from ..settings import (
    LeasedConfig,
    LeasedConfigError,
    check_crawl_id,
    check_redis_url,
    number_setting,
)

if TYPE_CHECKING:
    import argparse

    from scrapy.settings import Settings


SUBCOMMANDS = ("status", "dead", "seed", "forget", "reset", "pause", "resume", "stop",
               "metrics", "dashboard", "embedded", "from-scrapy-redis")


FROM_SR = "from-scrapy-redis"  # feed/fromscrapyredis.py: a scrapy-redis crawl moved into this one


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


CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear screen: --watch redraws in place


class CommandError(Exception):
    """Printed as one line on stderr; exit status 1."""


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


async def check_reached(client: Any, url: str, where: str) -> None:
    """PING ``client``; a CommandError naming ``url`` (redacted) and where it came from
    when Redis cannot be reached."""
    try:
        await client.ping()
    except Exception as exc:
        raise CommandError(f"cannot reach Redis at {redact(url)} ({where}): "
                           f"{type(exc).__name__}: {exc}") from None
