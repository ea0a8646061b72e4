"""Redis connections: one asyncio client per worker, retried on connection errors."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError


class LeasedRedisError(RuntimeError):
    """Redis cannot be used for the crawl; the message names the URL."""


def redact(url: str) -> str:
    """The URL without its password, fit for logs and errors."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def check_reachable(url: str, setting: str = "LEASED_REDIS_URL") -> None:
    """Ping once, synchronously: only at start-up, before any crawling runs."""
    client = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=5)
    try:
        client.ping()
    except Exception as exc:
        raise LeasedRedisError(
            f"cannot reach Redis at {redact(url)} ({setting}): {type(exc).__name__}: {exc}"
        ) from None
    finally:
        client.close()


def make_client(url: str) -> Any:
    return aioredis.from_url(
        url,
        socket_connect_timeout=5,
        socket_timeout=30,
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), 3),
        retry_on_error=[RedisConnectionError, RedisTimeoutError, OSError],
        health_check_interval=15,
    )


async def connect(url: str, setting: str = "LEASED_REDIS_URL") -> Any:
    """A client that answered PING and runs Redis 6.2+ (or Valkey)."""
    client = make_client(url)
    try:
        await client.ping()
        info = await client.info("server")
    except Exception as exc:
        await client.aclose()
        raise LeasedRedisError(
            f"cannot reach Redis at {redact(url)} ({setting}): {type(exc).__name__}: {exc}"
        ) from None
    version = str(info.get("valkey_version") or info.get("redis_version") or "0")
    major, minor = (int(x) for x in (version.split(".") + ["0"])[:2])
    if "valkey_version" not in info and (major, minor) < (6, 2):
        await client.aclose()
        raise LeasedRedisError(
            f"Redis at {redact(url)} ({setting}) is version {version}; scrapy_leased needs 6.2+"
        )
    return client
