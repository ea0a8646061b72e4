"""Redis connections: one asyncio client per worker, retried on connection errors.

``make_client`` is the one way to build a crawl's Redis client, whatever the URL names:
one server, a Sentinel group's master or a Redis Cluster (``client.py``).

redis-py's retry sends a command again when its reply was lost; the scripts whose
effect must not happen twice (claims, commits) carry a call id for that
(lua/lib_guard.lua), the others are idempotent or err on the safe side (a rate budget
taken twice).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .client import build_client
from .url import parse_redis_url, redact

__all__ = ["LeasedRedisError", "check_reachable", "connect", "make_client", "redact"]

logger = logging.getLogger(__name__)


class _QuietMaintenanceNotifications(logging.Filter):
    """redis-py logs "Failed to enable maintenance notifications" at DEBUG on every new
    connection to a server without them (any Redis before 8.2, Valkey): about 20 lines
    per crawl under Scrapy's default LOG_LEVEL (DEBUG), saying nothing a user can act
    on. Only that message is dropped; the rest of redis-py's logging is untouched."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Failed to enable maintenance notifications")


for _name in ("redis.connection", "redis.asyncio.connection"):
    logging.getLogger(_name).addFilter(_QuietMaintenanceNotifications())

#: Redis is not there yet, or still loading its data (BusyLoadingError is one of these).
_NOT_YET = (RedisConnectionError, RedisTimeoutError, OSError)
CONNECT_RETRY_CAP_SECONDS = 1.0
CONNECT_TIMEOUT_SECONDS = 15.0  # LEASED_CONNECT_TIMEOUT's default


class LeasedRedisError(RuntimeError):
    """Redis cannot be used for the crawl; the message names the URL."""


def check_reachable(url: str, setting: str = "LEASED_REDIS_URL",
                    timeout: float = CONNECT_TIMEOUT_SECONDS) -> None:
    """Synchronously, at start-up only (the add-on, before the engine exists, so that a
    Redis that cannot be used stops the worker with one clear error): wait up to
    ``timeout`` seconds for Redis to answer, then check it like ``connect``.

    Called on a running event loop (a crawl started by an ``AsyncCrawlerRunner`` of a
    running application applies its add-ons there), it only checks that ``url`` can
    name a client: waiting for Redis would block the loop, so the check is left to
    ``connect``, which the scheduler awaits when the spider opens."""
    if _loop_running():
        try:
            parse_redis_url(url)  # no I/O (a sync cluster client connects when built)
        except ValueError as exc:
            raise LeasedRedisError(_unusable(url, setting, exc)) from None
        return
    try:
        client = make_client(url, sync=True, socket_connect_timeout=5, socket_timeout=5)
    except Exception as exc:
        raise LeasedRedisError(_unusable(url, setting, exc)) from None
    deadline = time.monotonic() + timeout
    delay = 0.1
    try:
        while True:
            try:
                client.ping()
                info, memory = client.info("server"), client.info("memory")
                break
            except _NOT_YET as exc:
                if time.monotonic() + delay > deadline:
                    raise LeasedRedisError(_unreachable(url, setting, timeout, exc)) from None
                if delay == 0.1:
                    _log_waiting(url, setting, timeout, exc)
                time.sleep(delay)
                delay = min(delay * 2, CONNECT_RETRY_CAP_SECONDS)
            except Exception as exc:
                raise LeasedRedisError(_unusable(url, setting, exc)) from None
    finally:
        client.close()
    check_server(info, memory, url, setting)


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _unreachable(url: str, setting: str, timeout: float, exc: BaseException) -> str:
    return (f"cannot reach Redis at {redact(url)} ({setting}) within {timeout:g} s "
            f"(LEASED_CONNECT_TIMEOUT): {type(exc).__name__}: {exc}")


def _unusable(url: str, setting: str, exc: BaseException) -> str:
    return f"cannot use Redis at {redact(url)} ({setting}): {type(exc).__name__}: {exc}"


def _log_waiting(url: str, setting: str, timeout: float, exc: BaseException) -> None:
    logger.warning("Redis at %(url)s (%(setting)s) does not answer yet (%(exc)s); trying "
                   "again for up to %(t)g s (LEASED_CONNECT_TIMEOUT)",
                   {"url": redact(url), "setting": setting, "exc": exc, "t": timeout})


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


async def connect(url: str, setting: str = "LEASED_REDIS_URL",
                  timeout: float = CONNECT_TIMEOUT_SECONDS) -> Any:
    """A client that answered PING, runs Redis 7.0+ (or Valkey) and never evicts keys.

    A Redis that cannot be reached (or is still loading its data) is tried again for up
    to ``timeout`` seconds (LEASED_CONNECT_TIMEOUT), so a worker started during a restart
    or a failover joins once Redis is back; then the error names ``setting``."""
    client = make_client(url)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    delay = 0.1
    while True:
        try:
            await client.ping()
            info = await client.info("server")
            memory = await client.info("memory")
            break
        except _NOT_YET as exc:
            if loop.time() + delay > deadline:
                await client.aclose()
                raise LeasedRedisError(_unreachable(url, setting, timeout, exc)) from None
            if delay == 0.1:
                _log_waiting(url, setting, timeout, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, CONNECT_RETRY_CAP_SECONDS)
        except Exception as exc:
            await client.aclose()
            raise LeasedRedisError(_unusable(url, setting, exc)) from None
    try:
        check_server(info, memory, url, setting)
    except LeasedRedisError:
        await client.aclose()
        raise
    return client


def check_server(info: dict[str, Any], memory: dict[str, Any], url: str, setting: str) -> None:
    """Refuse a Redis older than 7.0 (script flags) and one that evicts keys when full."""
    version = str(info.get("valkey_version") or info.get("redis_version") or "0")
    major, minor = (int(x) for x in (version.split(".") + ["0"])[:2])
    if "valkey_version" not in info and (major, minor) < (7, 0):
        raise LeasedRedisError(
            f"Redis at {redact(url)} ({setting}) is version {version}; scrapy_leased needs "
            f"Redis 7.0+ (or Valkey)")
    policy = memory.get("maxmemory_policy", "noeviction")
    policy = policy.decode() if isinstance(policy, bytes) else str(policy)
    if policy != "noeviction":
        raise LeasedRedisError(
            f"Redis at {redact(url)} ({setting}) has maxmemory-policy {policy}: when its "
            f"memory is full it deletes keys, and with them queued requests, leases or seen "
            f"URLs, losing requests for good. Set maxmemory-policy to noeviction (in "
            f"redis.conf, or CONFIG SET maxmemory-policy noeviction), or give the crawl a "
            f"Redis of its own")
