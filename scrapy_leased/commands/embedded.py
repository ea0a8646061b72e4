"""``scrapy leased embedded status | stop``: the project's embedded Redis."""


from __future__ import annotations

import argparse
import sys

from scrapy.settings import Settings

from ..settings import LeasedConfig
from .common import AddParser


def add_parsers(add: AddParser) -> None:
    p = add("embedded", "status | stop", "the project's embedded Redis server itself",
            redis_url=False)
    p.add_argument("action", choices=("status", "stop"),
                   help="whether it runs, and who uses it; or stop it now")
    p.set_defaults(run=run)


async def run(opts: argparse.Namespace, settings: Settings, config: LeasedConfig) -> int:
    """``embedded status | stop``: the project's embedded Redis server (LEASED_EMBEDDED_DIR),
    whatever LEASED_REDIS_URL says. It stops by itself once no worker or command uses
    it; ``stop`` stops it now (its data stays for a later crawl)."""
    from .._redis.embedded import EmbeddedRedisError, embedded_state, stop_embedded_redis

    try:
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
        if opts.action == "status":
            print(f"{where}: running at {state.url} ({pid}), {used}; it stops by itself "
                  f"once no worker or command uses it")
            return 0
        if state.users:
            print(f"Warning: stopping it under {len(state.users)} process(es) that use it "
                  f"(pids {', '.join(map(str, state.users))}): they lose their Redis",
                  file=sys.stderr)
        stopped = stop_embedded_redis(config.embedded_dir)
    except EmbeddedRedisError as exc:
        print(f"Error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    print(f"Stopped the {where} ({pid}); {data}, a later crawl resumes it" if stopped
          else f"{where}: not running ({data})")
    return 0
