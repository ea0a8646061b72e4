"""``scrapy leased embedded status | stop``: the project's embedded Redis."""


from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from scrapy.exceptions import UsageError

from ..settings import (
    LeasedConfig,
    LeasedConfigError,
)
from .common import EMBEDDED_ACTIONS, _check_options

if TYPE_CHECKING:
    import argparse

    from scrapy.settings import Settings


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
