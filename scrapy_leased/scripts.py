"""The Lua scripts, read once from ``lua/`` and registered per client (EVALSHA,
reloaded on NOSCRIPT by redis-py)."""

from __future__ import annotations

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
}


@cache
def script_source(name: str) -> str:
    lua = files("scrapy_leased").joinpath("lua")
    parts = [lua.joinpath(f"{lib}.lua").read_text(encoding="utf-8") for lib in _LIBS.get(name, ())]
    parts.append(lua.joinpath(f"{name}.lua").read_text(encoding="utf-8"))
    return "\n".join(parts)


def register(client: Any, *names: str) -> dict[str, Any]:
    return {name: client.register_script(script_source(name)) for name in names}
