"""The HTTP side of ``scrapy leased metrics`` and ``scrapy leased dashboard`` (aiohttp).

    metrics:    GET /metrics                      Prometheus text format (metrics.py)
    dashboard:  GET /                             the page (dashboard/index.html, app.js)
                GET /api/crawls                   {"crawls", "default", "allow_writes"}
                GET /api/snapshot?crawl=C         {"status": what status --json prints,
                                                   "history", "dead_letters", ...}
                POST /api/dead                    {"crawl", "action": "requeue"|"purge",
                                                   "rids": [...] or "all": true}

The dashboard's writes (requeue, purge: ``FleetAdmin.requeue_dead``/``purge_dead``,
i.e. lua/requeue_dead.lua and lua/purge_dead.lua) are refused unless it was started with
``--allow-writes``, and need the ``X-Leased-Dashboard`` header (a page of another site
cannot send it without a CORS preflight, which is never allowed).
"""

from __future__ import annotations

import asyncio
import sys
from importlib.resources import files
from typing import Any

from .reader import FleetReader

try:
    from aiohttp import web
except ImportError as exc:  # pragma: no cover - the "observe" extra
    raise ImportError("scrapy leased dashboard/metrics need aiohttp: "
                      "pip install 'scrapy-leased[observe]'") from exc

WRITE_HEADER = "X-Leased-Dashboard"
STATIC = ("index.html", "app.js")


def metrics_app(reader: FleetReader) -> web.Application:
    from .metrics import CONTENT_TYPE_LATEST, render

    async def metrics(request: web.Request) -> web.Response:
        readings = [await reader.read(crawl) for crawl in await reader.crawls()]
        return web.Response(body=render(readings),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def index(request: web.Request) -> web.Response:
        raise web.HTTPFound("/metrics")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/", index)
    return app


def _static(name: str) -> tuple[bytes, str]:
    body = files("scrapy_leased.observe").joinpath("dashboard").joinpath(name).read_bytes()
    return body, "text/html" if name.endswith(".html") else "text/javascript"


class _Dashboard:
    """The dashboard's handlers: its page, the crawl list, a crawl's snapshot, and the
    dead letters' requeue and purge (only with ``allow_writes``)."""

    def __init__(self, reader: FleetReader, default: str | None, allow_writes: bool) -> None:
        self.reader, self.default, self.allow_writes = reader, default, allow_writes

    async def page(self, request: web.Request) -> web.Response:
        name = request.match_info.get("name", "index.html")
        if name not in STATIC:
            raise web.HTTPNotFound()
        body, ctype = _static(name)
        return web.Response(body=body, content_type=ctype, charset="utf-8",
                            headers={"Cache-Control": "no-cache"})

    async def crawls(self, request: web.Request) -> web.Response:
        default = self.default
        if default is not None:
            await self.reader.known(default)  # started after the list was read
        names = await self.reader.crawls()
        return web.json_response({"crawls": names, "allow_writes": self.allow_writes,
                                  "default": default if default in names or not names
                                  else names[0]})

    async def crawl_of(self, crawl: Any) -> str:
        if not isinstance(crawl, str) or not await self.reader.known(crawl):
            raise web.HTTPNotFound(text=f"no crawl {crawl!r} here")
        return crawl

    async def snapshot(self, request: web.Request) -> web.Response:
        crawl = await self.crawl_of(request.query.get("crawl"))
        reading = await self.reader.read(crawl)
        letters = await self.reader.dead_letters(crawl)
        return web.json_response({
            "status": reading.doc, "history": self.reader.history(crawl),
            "dead_letters": [{**d.to_dict(), "lane": d.lane} for d in letters],
            "allow_writes": self.allow_writes})

    async def dead(self, request: web.Request) -> web.Response:
        if not self.allow_writes:
            raise web.HTTPForbidden(text="read-only: start the dashboard with --allow-writes")
        if request.headers.get(WRITE_HEADER) != "1":
            raise web.HTTPForbidden(text=f"missing header {WRITE_HEADER}: 1")
        try:
            body = await request.json()
        except ValueError:
            raise web.HTTPBadRequest(text="a JSON body is needed") from None
        crawl = await self.crawl_of(body.get("crawl"))
        admin = self.reader.admin(crawl)
        if body.get("all") is True:
            _, letters = await admin.dead_letters()
        else:
            rids = body.get("rids")
            if not isinstance(rids, list) or not all(isinstance(r, str) for r in rids):
                raise web.HTTPBadRequest(text="rids: a list of dead letter ids")
            letters = await self.reader.letters(crawl, rids)
        action = body.get("action")
        if action == "requeue":
            result = await admin.requeue_dead(letters)
            return web.json_response({"requeued": result.requeued, "missing": result.missing,
                                      "already_done": result.already_done,
                                      "unreadable": result.unreadable,
                                      "dropped": result.dropped})
        if action == "purge":
            return web.json_response({"purged": await admin.purge_dead(letters)})
        raise web.HTTPBadRequest(text="action: requeue or purge")


def dashboard_app(reader: FleetReader, default: str | None, allow_writes: bool) -> web.Application:
    handlers = _Dashboard(reader, default, allow_writes)
    app = web.Application()
    app.router.add_get("/", handlers.page)
    app.router.add_get("/{name}", handlers.page)
    app.router.add_get("/api/crawls", handlers.crawls)
    app.router.add_get("/api/snapshot", handlers.snapshot)
    app.router.add_post("/api/dead", handlers.dead)
    return app


async def serve(app: web.Application, host: str, port: int, what: str) -> None:
    """Serve until cancelled; prints ``<what> on http://host:port/`` once listening
    (port 0: a free port, the one printed)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    try:
        bound = runner.addresses[0][1] if runner.addresses else port  # port 0: the one chosen
        shown = f"[{host}]" if ":" in host else host
        print(f"{what} on http://{shown}:{bound}/", flush=True)
        sys.stdout.flush()
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
