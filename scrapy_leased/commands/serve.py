"""``scrapy leased metrics`` and ``dashboard``: the HTTP servers of observe/."""


from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from ..settings import (
    CRAWL_ID_RE,
    Budgets,
    LeasedConfig,
    LeasedConfigError,
)
from .common import BIND, DASHBOARD_PORT, METRICS_PORT, CommandError, _concurrency, _crawl_id

if TYPE_CHECKING:
    import argparse

    from scrapy.settings import Settings


async def _serve(sub: str, crawl_arg: str | None, opts: argparse.Namespace,
                 settings: Settings, config: LeasedConfig, client: Any, where: str) -> int:
    try:
        from ..observe.reader import FleetReader
        from ..observe.server import dashboard_app, metrics_app, serve
        if sub == "metrics":  # prometheus-client installed?
            import_module("..observe.metrics", __package__)
    except ImportError as exc:
        raise CommandError(str(exc)) from None
    crawl: str | None = crawl_arg
    if crawl is None and not opts.all_crawls:
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
        app, port, what = metrics_app(reader), METRICS_PORT, "Prometheus metrics"
    else:
        app, port, what = dashboard_app(reader, crawl, opts.allow_writes), DASHBOARD_PORT, (
            "Dashboard" + (" (writes allowed)" if opts.allow_writes else " (read-only)"))
    bind = BIND if opts.bind is None else opts.bind
    port = port if opts.port is None else opts.port
    try:
        await serve(app, bind, port, what)
    except OSError as exc:
        raise CommandError(f"cannot listen on {bind}:{port}: {exc.strerror}") from None
    return 0
