"""redis-py's Sentinel classes made to ask every sentinel, say which ones failed, and
wait for a pooled connection instead of failing past the pool's size."""

from __future__ import annotations

import logging
from typing import Any

import redis
import redis.asyncio as aioredis
import redis.cluster
import redis.sentinel
from redis.asyncio.connection import BlockingConnectionPool
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.asyncio.sentinel import SentinelConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.sentinel import MasterNotFoundError

logger = logging.getLogger(__name__)

def _where(sentinel: Any) -> str:
    kw = sentinel.connection_pool.connection_kwargs
    return f"{kw.get('host')}:{kw.get('port')}"


def _master_not_found(name: str, errors: list[str]) -> MasterNotFoundError:
    why = f" (sentinels: {'; '.join(errors)})" if errors else \
        " (no sentinel names a master in good state by that name)"
    return MasterNotFoundError(f"No master found for {name!r}{why}")


def _found(manager: Any, name: str, i: int, masters: Any) -> tuple[Any, Any] | None:
    """The master's address if sentinel ``i`` names it in good state (that sentinel is
    then asked first next time), as redis-py's discover_master does."""
    state = masters.get(name)
    if not (state and manager.check_master_state(state, name)):
        return None
    manager.sentinels[0], manager.sentinels[i] = manager.sentinels[i], manager.sentinels[0]
    return state["ip"], state["port"]


_SENTINEL_DOWN = (RedisConnectionError, RedisTimeoutError)


class _Discovery:
    """One discovery of a master: the sentinels are asked in turn (``next``, then
    ``answer`` with its SENTINEL MASTERS reply or the connection error it raised) until
    one names the master in good state; ``result`` is its address, or the error naming
    each sentinel by its address and its error in a line."""

    def __init__(self, manager: Any, name: str) -> None:
        self.manager = manager
        self.name = name
        self.i = -1
        self.errors: list[str] = []
        self.found: tuple[Any, Any] | None = None

    def next(self) -> Any:
        """The next sentinel to ask; None when done."""
        if self.found is not None or self.i + 1 >= len(self.manager.sentinels):
            return None
        self.i += 1
        return self.manager.sentinels[self.i]

    def answer(self, reply: Any) -> None:
        if isinstance(reply, _SENTINEL_DOWN):
            sentinel = self.manager.sentinels[self.i]
            self.errors.append(f"{_where(sentinel)} {type(reply).__name__}: {reply}")
        else:
            self.found = _found(self.manager, self.name, self.i, reply)

    def result(self) -> tuple[Any, Any]:
        if self.found is None:
            raise _master_not_found(self.name, self.errors)
        return self.found


class AsyncSentinelGroup(AsyncSentinel):
    """redis-py's Sentinel manager, whose "no master found" error names each sentinel
    by its address and its error in a line (redis-py's prints every client's repr)."""

    async def discover_master(self, service_name: str) -> tuple[Any, Any]:
        step = _Discovery(self, service_name)
        while (sentinel := step.next()) is not None:
            step.answer(await _masters_or_error(sentinel))
        return step.result()


async def _masters_or_error(sentinel: Any) -> Any:
    try:
        return await sentinel.sentinel_masters()
    except _SENTINEL_DOWN as exc:
        return exc


class SentinelGroup(redis.sentinel.Sentinel):
    """Synchronous ``AsyncSentinelGroup``."""

    def discover_master(self, service_name: str) -> tuple[Any, Any]:
        step = _Discovery(self, service_name)
        while (sentinel := step.next()) is not None:
            try:
                step.answer(sentinel.sentinel_masters())
            except _SENTINEL_DOWN as exc:
                step.answer(exc)
        return step.result()


class BlockingSentinelPool(SentinelConnectionPool, BlockingConnectionPool):
    """redis-py's Sentinel pool (the master's address from the sentinels), whose
    commands wait for a free connection past ``max_connections`` (BlockingConnectionPool)
    instead of failing."""


class AsyncSentinelMaster(aioredis.Redis):
    """The master a Sentinel group names, followed through failovers (redis-py's
    SentinelConnectionPool asks the sentinels again whenever a connection to the master
    fails or finds a replica). Closing it also closes the sentinel connections."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        try:
            await super().aclose(close_connection_pool)
        finally:
            pool: Any = self.connection_pool  # a SentinelConnectionPool
            await pool.sentinel_manager.aclose()


class SentinelMaster(redis.Redis):
    """Synchronous ``AsyncSentinelMaster`` (the add-on's start-up check)."""

    def close(self) -> None:
        try:
            super().close()
        finally:
            pool: Any = self.connection_pool  # a SentinelConnectionPool
            for s in pool.sentinel_manager.sentinels:
                s.close()
