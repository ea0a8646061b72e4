"""What every subcommand of ``scrapy leased`` shares: its errors, defaults and argument
types, and reaching the crawl's Redis and the crawl itself."""


from __future__ import annotations

import argparse
import contextlib
import sys
from typing import TYPE_CHECKING, Any, Protocol

from redis.exceptions import RedisError

from .._redis.connection import make_client
from .._redis.url import redact
from ..bootstrap import crawl_redis_url
from ..fleet import FleetAdmin
from ..frontier import CrawlKeys
from ..settings import (
    LeasedConfig,
    LeasedConfigError,
    check_crawl_id,
    check_redis_url,
    number_setting,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from scrapy.settings import Settings


class AddParser(Protocol):
    """``add(name, usage, help)``: a new subcommand's parser, with Scrapy's options and
    (unless not ``redis_url``) ``--redis-url`` (leased.py: Command.add_options)."""

    def __call__(self, name: str, usage: str, help: str,
                 redis_url: bool = True) -> argparse.ArgumentParser: ...


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


def add_crawl(parser: argparse.ArgumentParser) -> None:
    """The optional CRAWL positional of a subcommand."""
    parser.add_argument("crawl", nargs="?", metavar="CRAWL",
                        help="the crawl (default LEASED_CRAWL_ID, else the name of the "
                             "project's only spider)")


def number(kind: Callable[[str], float], minimum: float,
           above: bool = False) -> Callable[[str], float]:
    """An argparse ``type``: ``kind`` of the text, at least (or ``above``) ``minimum``."""
    def parse(text: str) -> float:
        value = kind(text)  # ValueError: argparse's "invalid int value"
        if value < minimum or (above and value == minimum):
            raise argparse.ArgumentTypeError(
                f"must be {'above' if above else 'at least'} {minimum:g}, got {text}")
        return value

    parse.__name__ = getattr(kind, "__name__", "number")
    return parse


@contextlib.asynccontextmanager
async def connected(opts: argparse.Namespace, config: LeasedConfig,
                    start_embedded: bool = False) -> AsyncIterator[tuple[Any, str]]:
    """A client of the crawl's Redis (``_redis_url``), reached, and that Redis's URL
    redacted for messages; closed on the way out."""
    url, source = _redis_url(opts, config, start_embedded)
    client = make_client(url)
    try:
        await check_reached(client, url, source)
        yield client, redact(url)
    finally:
        await client.aclose()


async def open_crawl(crawl_arg: str | None, settings: Settings, config: LeasedConfig,
                     client: Any, where: str, *, create: bool = False,
                     warn_scrapy_redis: bool = False) -> FleetAdmin:
    """The crawl named by ``crawl_arg`` (else its default) in this Redis: a CommandError
    naming the crawls there when it does not exist, unless ``create``. With
    ``warn_scrapy_redis``, the warning that its spider has scrapy-redis state here."""
    crawl = await _crawl_id(crawl_arg, settings, config, client)
    admin = FleetAdmin(client, CrawlKeys(crawl), worker_ttl_ms=int(config.worker_ttl * 1000),
                       lease_ms=config.lease_ms, max_attempts=config.max_attempts,
                       half_life_ms=config.budgets.half_life_ms)
    exists = await admin.exists()
    hint = await scrapy_redis_hint(client, crawl, settings, exists) \
        if warn_scrapy_redis else None
    if not create and not exists:
        crawls = await FleetAdmin.list_crawls(client)
        raise CommandError(
            f"unknown crawl {crawl!r} in Redis at {where}: no key "
            f"{admin.keys.prefix}*; crawls there: {', '.join(crawls) or 'none'}"
            + (f". WARNING: {hint}" if hint else ""))
    if hint:  # on stderr: --json keeps stdout one object
        print(f"WARNING: {hint}", file=sys.stderr)
    return admin


async def scrapy_redis_hint(client: Any, crawl: str, settings: Settings,
                            exists: bool) -> str | None:
    """The warning that the crawl's spider (named as the crawl) has scrapy-redis state
    in this Redis (feed/fromscrapyredis.py), or None."""
    from ..feed import fromscrapyredis

    try:
        found = await fromscrapyredis.find(client, fromscrapyredis.SourceKeys.of(crawl, settings))
    except RedisError:
        return None
    return fromscrapyredis.warning(found, crawl, exists)


async def check_reached(client: Any, url: str, where: str) -> None:
    """PING ``client``; a CommandError naming ``url`` (redacted) and where it came from
    when Redis cannot be reached."""
    try:
        await client.ping()
    except Exception as exc:
        raise CommandError(f"cannot reach Redis at {redact(url)} ({where}): "
                           f"{type(exc).__name__}: {exc}") from None
