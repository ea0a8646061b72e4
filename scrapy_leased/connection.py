"""Redis connections: one asyncio client per worker, retried on connection errors.

``make_client`` is the one way to build a crawl's Redis client, whatever the URL names:
one server, a Sentinel group's master or a Redis Cluster (``topology.py``)."""

from __future__ import annotations

from typing import Any

from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .topology import build_client, redact

__all__ = ["LeasedRedisError", "check_reachable", "connect", "make_client", "redact"]


class LeasedRedisError(RuntimeError):
    """Redis cannot be used for the crawl; the message names the URL."""


def check_reachable(url: str, setting: str = "LEASED_REDIS_URL") -> None:
    """Ping once, synchronously: only at start-up, before any crawling runs."""
    client = None
    try:
        client = make_client(url, sync=True, socket_connect_timeout=5, socket_timeout=5)
        client.ping()
    except Exception as exc:
        raise LeasedRedisError(
            f"cannot reach Redis at {redact(url)} ({setting}): {type(exc).__name__}: {exc}"
        ) from None
    finally:
        if client is not None:
            client.close()


def make_client(url: str, *, sync: bool = False, **options: Any) -> Any:
    """A Redis client for a crawl: asyncio (``sync`` for start-up checks), for a
    redis://, rediss://, unix://, redis+sentinel:// or redis+cluster:// URL; ``options``
    override the defaults below."""
    defaults: dict[str, Any] = {"socket_connect_timeout": 5, "socket_timeout": 30}
    if not sync:
        defaults.update(
            retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), 3),
            retry_on_error=[RedisConnectionError, RedisTimeoutError, OSError],
            health_check_interval=15,
        )
    return build_client(url, {**defaults, **options}, sync=sync)


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
