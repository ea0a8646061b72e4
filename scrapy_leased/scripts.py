"""The Lua scripts, read once from ``lua/`` and registered per client (EVALSHA,
reloaded on NOSCRIPT by redis-py)."""

from __future__ import annotations

from functools import cache
from importlib.resources import files
from typing import Any

# Scripts that use the shared helpers get lib_settle.lua prepended.
_USES_LIB = {"claim", "commit", "recover", "release"}


@cache
def script_source(name: str) -> str:
    lua = files("scrapy_leased").joinpath("lua")
    body = lua.joinpath(f"{name}.lua").read_text(encoding="utf-8")
    if name in _USES_LIB:
        body = lua.joinpath("lib_settle.lua").read_text(encoding="utf-8") + "\n" + body
    return body


def register(client: Any, *names: str) -> dict[str, Any]:
    return {name: client.register_script(script_source(name)) for name in names}
