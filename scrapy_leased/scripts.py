"""The Lua scripts, read once from ``lua/`` and registered per client (EVALSHA,
reloaded on NOSCRIPT by redis-py)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from importlib.resources import files
from typing import Any

# The shared helper files (lib_*.lua) each script gets prepended, in this order.
_LIBS: dict[str, tuple[str, ...]] = {
    "claim": ("lib_time", "lib_settle", "lib_rate"),
    "commit": ("lib_time", "lib_settle"),
    "expired": ("lib_time",),
    "recover": ("lib_time", "lib_settle"),
    "release": ("lib_settle",),
    "acquire": ("lib_time", "lib_rate"),
    "penalize": ("lib_time", "lib_rate"),
    "requeue_dead": ("lib_settle",),  # admin.py (scrapy leased dead --requeue)
    # read: several reads with the server time, atomically (read_atomic below)
}


@cache
def script_source(name: str) -> str:
    lua = files("scrapy_leased").joinpath("lua")
    parts = [lua.joinpath(f"{lib}.lua").read_text(encoding="utf-8") for lib in _LIBS.get(name, ())]
    parts.append(lua.joinpath(f"{name}.lua").read_text(encoding="utf-8"))
    return "\n".join(parts)


def register(client: Any, *names: str) -> dict[str, Any]:
    return {name: client.register_script(script_source(name)) for name in names}


def pairs(flat: Sequence[Any]) -> list[tuple[Any, Any]]:
    """[a, b, c, d] -> [(a, b), (c, d)]: an HGETALL or WITHSCORES reply of a script."""
    return list(zip(flat[::2], flat[1::2]))


async def read_atomic(script: Any, *commands: tuple[Any, ...]) -> tuple[int, list[Any]]:
    """(Redis time in ms, the replies of ``commands``), each ``(name, key, *args)`` of a
    read-only command, all read in one run of lua/read.lua: a consistent view like
    MULTI/EXEC, which also works on Redis Cluster."""
    keys: list[str] = []
    index: dict[str, int] = {}
    args: list[Any] = [len(commands)]
    for name, key, *rest in commands:
        if key not in index:
            keys.append(key)
            index[key] = len(keys)
        args += [name, index[key], len(rest), *rest]
    out = await script(keys=keys, args=args)
    return int(out[0]) * 1000 + int(out[1]) // 1000, list(out[2:])
