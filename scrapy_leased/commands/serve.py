"""``scrapy leased metrics`` and ``dashboard``: the HTTP servers of observe/."""


from __future__ import annotations

import argparse
from importlib import import_module
from typing import Any

from scrapy.settings import Settings

from ..settings import CRAWL_ID_RE, Budgets, LeasedConfig, LeasedConfigError
from .common import AddParser, CommandError, _concurrency, _crawl_id, add_crawl, connected

METRICS_PORT = 9410
DASHBOARD_PORT = 8410
BIND = "127.0.0.1"  # metrics and dashboard listen here by default


#: Each server: its usage, what it does, its default port and the option only it takes
SERVERS: dict[str, tuple[str, str, int, tuple[str, str]]] = {
    "metrics": ("[CRAWL | --all-crawls] [--bind HOST] [--port N]",
                "serve Prometheus metrics of the crawl", METRICS_PORT,
                ("--all-crawls", "every crawl in this Redis (default without CRAWL, "
                                 "LEASED_CRAWL_ID or a single project spider)")),
    "dashboard": ("[CRAWL] [--bind HOST] [--port N] [--allow-writes]",
                  "serve a live web page of the crawl", DASHBOARD_PORT,
                  ("--allow-writes", "offer requeue and purge of dead letters")),
}


def add_parsers(add: AddParser) -> None:
    for name, (usage, about, port, (flag, flag_help)) in SERVERS.items():
        p = add(name, usage, about)
        p.add_argument(flag, action="store_true", help=flag_help)
        add_crawl(p)
        p.add_argument("--bind", metavar="HOST", default=BIND,
                       help=f"address to listen on (default {BIND})")
        p.add_argument("--port", type=int, default=port, metavar="N",
                       help=f"port (default {port}; 0 = any free port, printed)")
        p.set_defaults(run=run)


async def run(opts: argparse.Namespace, settings: Settings, config: LeasedConfig) -> int:
    _concurrency(settings)  # a bad setting: before Redis is reached
    async with connected(opts, config) as (client, where):
        return await _serve(opts, settings, config, client, where)


async def _serve(opts: argparse.Namespace, settings: Settings, config: LeasedConfig,
                 client: Any, where: str) -> int:
    sub, crawl_arg = opts.subcommand, opts.crawl
    try:
        from ..observe.reader import FleetReader
        from ..observe.server import dashboard_app, metrics_app, serve
        if sub == "metrics":  # prometheus-client installed?
            import_module("..observe.metrics", __package__)
    except ImportError as exc:
        raise CommandError(str(exc)) from None
    crawl: str | None = crawl_arg
    if crawl is None and not getattr(opts, "all_crawls", False):  # (metrics only)
        try:
            crawl = await _crawl_id(None, settings, config, client)
        except CommandError:
            crawl = None  # no default crawl: every crawl of this Redis
    if crawl is not None and not CRAWL_ID_RE.match(crawl):
        raise CommandError(f"CRAWL ({crawl!r}) must be a crawl id without spaces or braces")
    try:
        budgets = Budgets.from_settings(settings)
    except LeasedConfigError as exc:
        raise CommandError(str(exc)) from None
    only = [crawl] if sub == "metrics" and crawl is not None else None
    reader = FleetReader(client, where, budgets, worker_ttl_ms=int(config.worker_ttl * 1000),
                         lease_ms=config.lease_ms, max_attempts=config.max_attempts,
                         default_capacity=_concurrency(settings), only=only)
    if sub == "metrics":
        app, what = metrics_app(reader), "Prometheus metrics"
    else:
        app, what = dashboard_app(reader, crawl, opts.allow_writes), (
            "Dashboard" + (" (writes allowed)" if opts.allow_writes else " (read-only)"))
    bind, port = opts.bind, opts.port
    try:
        await serve(app, bind, port, what)
    except OSError as exc:
        raise CommandError(f"cannot listen on {bind}:{port}: {exc.strerror}") from None
    return 0
