"""A deterministic local test website, for the tests, the example project and the benchmarks.

Standard library only, so it runs anywhere Python 3 does. Runs in-process (one
background thread per listening port) or as a subprocess::

    python -m scrapy_leased.testing.site --pages 5000 --port 0 --log /tmp/site.jsonl

The subprocess prints one JSON line ``{"urls": [...], "pid": ...}`` on stdout
once it is listening (:class:`scrapy_leased.testing.process.SiteProcess` runs it), then
serves until killed.

Routes (any query string is accepted and ignored unless documented):

``/p/{i}``            page i (0 <= i < pages), else 404.
``/slow/{i}?s=SEC``   sleeps SEC seconds (float, default 1) then serves page i.
``/status/{code}``    answers with that HTTP status code (small HTML body).
``/redirect/{i}``     302 to ``/p/{i}``.
``/goto?to=PATH``     302 to PATH (a path on this site, starting with ``/``).
``/flaky/{key}?fail=N``  503 for the first N requests of that key, then 200.
``/busy/{key}?after=S&times=N``  429 with ``Retry-After: S`` for the first N requests
                      of that key (default 1), then 200.
anything else         404.

The pages and their links: :mod:`scrapy_leased.testing.pages`.

With several listeners and ``spread=True`` (``--spread``), the pages are split
between them: page j lives on listener ``j % ports``, and every link is absolute,
to the listener of its target, so one crawl from ``/p/0`` of the first listener
visits each of the N pages once, spread over several hosts (use distinct hosts,
127.0.0.1, 127.0.0.2, ..., for one download slot and one rate budget per host).
``delay`` (``--delay``) makes every ``/p/`` page take that many seconds; ``profile``
(``--profile``) adds each page's delay of a latency profile
(:mod:`scrapy_leased.testing.latency`).
``redirect`` (``--redirect``) makes every page link point to ``/redirect/{j}`` instead of
``/p/{j}``: each page is reached through one 302 (which takes ``delay`` too).
``nodelay`` (``--nodelay``) sets TCP_NODELAY on the connections: the server writes a
response's headers and its body in two ``send()`` calls, and on a keep-alive connection
Nagle's algorithm holds the body until the client ACKs the headers, which the client
delays (~40 ms a request; the benchmarks measure the crawler, not that).

Every request is logged as a dict::

    {"t": time.time(), "t0": <time.time() when the request was read>, "method": "GET",
     "path": "/p/3?x=1", "host": "<Host header>", "user_agent": "<User-Agent header>",
     "port": <server port>, "server_host": "<bind address>", "status": 200,
     "client_port": <the client's port: one per TCP connection>}

and, for a POST, ``"body"``: the request's body as text; for a request carrying an
``X-Leased-Budget-Taken`` header (sent by scrapy_leased.ratelimit.stamp: when the
request took its rate budget, ms of Redis time), ``"budget_taken"``: that int.

kept in memory (``Site.log``, a list guarded by a lock) and, if ``log_path``
is given, appended as one JSON line per request to that file (flushed per
line, so a test can read it while the site runs).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from socketserver import BaseServer
from typing import IO, Any
from urllib.parse import parse_qs, urlsplit

from .latency import PROFILES, check_profile
from .latency import page_delay as profile_delay
from .pages import page_html

#: The header a request's rate-budget time comes in (the name
#: scrapy_leased.ratelimit.stamp sends; this module imports nothing of scrapy_leased).
BUDGET_TAKEN_HEADER = "X-Leased-Budget-Taken"
HOLD_TIMEOUT = 300.0  # the longest a held page waits for Site.release()
NOT_FOUND = b"<html><head><title>not found</title></head><body>not found</body></html>\n"
Query = dict[str, list[str]]


def _ok(title: str) -> bytes:
    return f"<html><head><title>{title}</title></head><body>ok</body></html>\n".encode()


class _Handler(BaseHTTPRequestHandler):
    # keep-alive: Scrapy uses persistent HTTP/1.1 connections
    protocol_version = "HTTP/1.1"
    # idle keep-alive connections are dropped after this many seconds
    timeout = 60
    server_version = "LeasedTestSite/1.0"
    sys_version = ""
    #: the routes ``/{name}/{arg}``: the method answering each (False: not found)
    ROUTES = {"p": "_page", "slow": "_slow", "redirect": "_redirect", "busy": "_busy",
              "flaky": "_flaky", "status": "_status"}

    # set on the subclass made per Site
    site: Site
    t0: float | None = None  # when the request was read
    body: bytes | None = None  # a POST's body

    def log_message(self, format: str, *args: Any) -> None:
        pass  # we keep our own structured log

    def _send(self, status: int, body: bytes, content_type: str = "text/html; charset=utf-8",
              headers: dict[str, str] | None = None) -> None:
        self.site._record(self, status)
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _page_index(self, s: str) -> int | None:
        try:
            i = int(s)
        except ValueError:
            return None
        if 0 <= i < self.site.pages:
            return i
        return None

    def _route(self) -> None:
        self.t0 = time.time()
        split = urlsplit(self.path)
        parts = split.path.strip("/").split("/")
        query = parse_qs(split.query)
        if len(parts) == 2 and parts[0] in self.ROUTES:
            if getattr(self, self.ROUTES[parts[0]])(parts[1], query):
                return
        elif parts == ["goto"]:
            to = query.get("to", [""])[0]
            if to.startswith("/") and not to.startswith("//"):
                return self._send(302, b"", headers={"Location": to})
        self._send(404, NOT_FOUND)

    def _page(self, arg: str, query: Query) -> bool:
        i = self._page_index(arg)
        if i is None:
            return False
        seconds = self.site.page_delay(i)
        if seconds > 0:
            time.sleep(seconds)
        if not self.site.gate.is_set():  # held: until release() (in-process Site)
            self.site.wait_at_gate(urlsplit(self.path).path)
        self._send(200, page_html(i, self.site.pages, self.site.link_bases, self.site.link_route))
        return True

    def _slow(self, arg: str, query: Query) -> bool:
        i = self._page_index(arg)
        if i is None:
            return False
        try:
            seconds = float(query.get("s", ["1"])[0])
        except ValueError:
            seconds = 1.0
        time.sleep(max(0.0, seconds))
        self._send(200, page_html(i, self.site.pages, self.site.link_bases))
        return True

    def _redirect(self, arg: str, query: Query) -> bool:
        i = self._page_index(arg)
        if i is None:
            return False
        if self.site.redirect and self.site.delay > 0:
            time.sleep(self.site.delay)
        self._send(302, b"", headers={"Location": f"/p/{i}"})
        return True

    def _busy(self, key: str, query: Query) -> bool:
        """/busy/KEY?after=S&times=N: 429 with Retry-After: S for the first N requests."""
        times = int(query.get("times", ["1"])[0])
        if self.site._hit("busy:" + key) <= times:
            after = query.get("after", ["5"])[0]
            self._send(429, b"<html><body>slow down</body></html>\n",
                       headers={"Retry-After": after})
        else:
            self._send(200, _ok("busy ok"))
        return True

    def _flaky(self, key: str, query: Query) -> bool:
        """/flaky/KEY?fail=N: 503 for the first N requests of KEY, then a page."""
        fail = int(query.get("fail", ["1"])[0])
        if self.site._hit(key) <= fail:
            self._send(503, b"<html><body>try again</body></html>\n")
        else:
            self._send(200, _ok("flaky ok"))
        return True

    def _status(self, arg: str, query: Query) -> bool:
        try:
            code = int(arg)
        except ValueError:
            return False
        if not 100 <= code <= 999:
            return False
        body = f"<html><head><title>status {code}</title></head><body>status {code}</body></html>\n"
        self._send(code, body.encode())
        return True

    def do_GET(self) -> None:
        self._route()

    def do_HEAD(self) -> None:
        self._route()

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.body = self.rfile.read(length) if length else b""
        self._route()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # several workers x CONCURRENT_REQUESTS connect at once; the default of 5
    # drops SYNs and costs 1 s retransmits
    request_queue_size = 256

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a crawler killed with kill -9 resets its connections: not the site's error
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def _address(server: BaseServer) -> tuple[str, int]:
    """A listener's (bind address, port)."""
    address = server.server_address
    assert isinstance(address, tuple)  # an AF_INET listener
    return str(address[0]), int(address[1])


class Site:
    """The test website.  ``Site(pages=500, log_path=None, ports=1).start()``.

    ``ports``: how many listening sockets (each a full copy of the site, with
    relative links, so a crawl stays on the host:port it started on).
    ``hosts``: bind addresses, one per port (default all ``127.0.0.1``).  Note
    that Scrapy's downloader slots key on the *hostname only*, so to get one
    slot per site use distinct loopback addresses, e.g.
    ``Site(ports=3, distinct_hosts=True)`` -> 127.0.0.1, 127.0.0.2, 127.0.0.3.
    ``port``: fixed port for the first listener (default 0 = free port).
    ``spread``: split the pages between the listeners, with absolute links (see the
    module docstring).  ``delay``: seconds every ``/p/`` page takes.  ``redirect``:
    page links go through ``/redirect/{j}`` (a 302 to ``/p/{j}``, taking ``delay``
    too).  ``nodelay``: TCP_NODELAY on the connections.  ``profile``: a latency profile's
    name (:mod:`scrapy_leased.testing.latency`), each page's delay added to ``delay``.
    :meth:`hold` makes ``/p/`` pages wait until :meth:`release` (at most ``HOLD_TIMEOUT``
    seconds), so a test knows a crawl cannot move on, nor end, in between.
    """

    def __init__(
        self,
        pages: int = 500,
        log_path: str | os.PathLike[str] | None = None,
        ports: int = 1,
        hosts: Iterable[str] | None = None,
        distinct_hosts: bool = False,
        port: int = 0,
        spread: bool = False,
        delay: float = 0.0,
        redirect: bool = False,
        nodelay: bool = False,
        profile: str | None = None,
    ) -> None:
        if pages < 1:
            raise ValueError("pages must be >= 1")
        self.pages = pages
        self.log_path = Path(log_path) if log_path is not None else None
        if hosts is not None:
            self.hosts = list(hosts)
            if len(self.hosts) != ports and ports != 1:
                raise ValueError("len(hosts) must equal ports")
        elif distinct_hosts:
            self.hosts = [f"127.0.0.{k + 1}" for k in range(ports)]
        else:
            self.hosts = ["127.0.0.1"] * ports
        self._first_port = port
        self.spread = spread
        self.delay = delay
        self.redirect = redirect
        self.nodelay = nodelay
        self.profile = None if profile is None else check_profile(profile)
        self.link_route = "redirect" if redirect else "p"
        self.gate = threading.Event()  # set: pages are answered (hold() clears it)
        self.gate.set()
        self.link_bases: list[str] | None = None  # set at start when spread
        self.log: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._hits: Counter[str] = Counter()
        self._held: Counter[str] = Counter()  # path -> requests waiting at the gate
        self._logfile: IO[str] | None = None
        self._servers: list[_Server] = []
        self._threads: list[threading.Thread] = []

    # -- lifecycle ---------------------------------------------------------
    def start(self) -> Site:
        if self._servers:
            return self
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._logfile = open(self.log_path, "a", encoding="utf-8", buffering=1)
        handler = type("Handler", (_Handler,), {"site": self,
                                                "disable_nagle_algorithm": self.nodelay})
        try:
            for k, host in enumerate(self.hosts):
                port = self._first_port if k == 0 else 0
                srv = _Server((host, port), handler)
                self._servers.append(srv)
        except BaseException:
            self.stop()
            raise
        if self.spread and len(self._servers) > 1:
            self.link_bases = self.urls
        for srv in self._servers:
            t = threading.Thread(
                target=srv.serve_forever,
                kwargs={"poll_interval": 0.1},
                name=f"test-site-{_address(srv)[1]}",
                daemon=True,
            )
            t.start()
            self._threads.append(t)
        return self

    def hold(self) -> None:
        """From now on, ``/p/`` pages are answered only after ``release()``."""
        self.gate.clear()

    def release(self) -> None:
        """Answer the held pages, and the next ones at once."""
        self.gate.set()

    def wait_at_gate(self, path: str) -> None:
        """Hold a request for ``path`` until :meth:`release` (counted in ``held``)."""
        with self._lock:
            self._held[path] += 1
        try:
            self.gate.wait(HOLD_TIMEOUT)
        finally:
            with self._lock:
                self._held[path] -= 1

    def held(self) -> set[str]:
        """The paths of the requests waiting for :meth:`release` now."""
        with self._lock:
            return {path for path, n in self._held.items() if n > 0}

    def stop(self) -> None:
        self.gate.set()  # no handler thread stays blocked
        serving = bool(self._threads)  # shutdown() blocks unless serve_forever runs
        for srv in self._servers:
            if serving:
                srv.shutdown()
            srv.server_close()
        for t in self._threads:
            t.join(timeout=5)
        self._servers = []
        self._threads = []
        with self._lock:
            if self._logfile is not None:
                self._logfile.close()
                self._logfile = None

    def __enter__(self) -> Site:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- addresses ---------------------------------------------------------
    @property
    def ports(self) -> list[int]:
        return [_address(srv)[1] for srv in self._servers]

    @property
    def urls(self) -> list[str]:
        return ["http://{}:{}".format(*_address(srv)) for srv in self._servers]

    @property
    def url(self) -> str:
        """Base URL of the first listener, e.g. ``http://127.0.0.1:PORT``."""
        return self.urls[0]

    @property
    def port(self) -> int:
        return self.ports[0]

    def page_url(self, i: int, k: int = 0) -> str:
        return f"{self.urls[k]}/p/{i}"

    def page_delay(self, i: int) -> float:
        """Seconds page i takes: ``delay``, plus the page's delay in ``profile``."""
        if self.profile is None:
            return self.delay
        return self.delay + profile_delay(self.profile, i, len(self.hosts))

    def _hit(self, key: str) -> int:
        """Count one request for ``key``; return the count including this one."""
        with self._lock:
            self._hits[key] += 1
            return self._hits[key]

    # -- log ---------------------------------------------------------------
    def _record(self, handler: _Handler, status: int) -> None:
        entry: dict[str, Any] = {
            "t": time.time(),
            "t0": handler.t0,
            "method": handler.command,
            "path": handler.path,
            "host": handler.headers.get("Host"),
            "user_agent": handler.headers.get("User-Agent"),
            "port": _address(handler.server)[1],
            "server_host": _address(handler.server)[0],
            "status": status,
            # the client's port: one per TCP connection (benchmarks count connections)
            "client_port": handler.client_address[1],
        }
        taken = handler.headers.get(BUDGET_TAKEN_HEADER)
        if taken is not None and taken.isdigit():
            entry["budget_taken"] = int(taken)
        if handler.body is not None:  # a POST: its body, as text
            entry["body"] = handler.body.decode("utf-8", "replace")
        with self._lock:
            self.log.append(entry)
            if self._logfile is not None:
                self._logfile.write(json.dumps(entry) + "\n")
                self._logfile.flush()

    def entries(self) -> list[dict[str, Any]]:
        """A snapshot copy of the log."""
        with self._lock:
            return list(self.log)

    def count_by_path(self, include_query: bool = True, port: int | None = None) -> Counter[str]:
        """Counter of requests per path (with query unless include_query=False),
        optionally only those served on ``port``."""
        c: Counter[str] = Counter()
        for e in self.entries():
            if port is not None and e["port"] != port:
                continue
            path = e["path"] if include_query else e["path"].split("?", 1)[0]
            c[path] += 1
        return c

    def clear_log(self) -> None:
        with self._lock:
            self.log.clear()

    def all_page_paths(self) -> set[str]:
        return {f"/p/{i}" for i in range(self.pages)}


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    ap = argparse.ArgumentParser(prog=prog or "python -m scrapy_leased.testing.site",
                                 description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--pages", type=int, default=500)
    ap.add_argument("--port", type=int, default=0,
                    help="port of the first listener (0 = free port)")
    ap.add_argument("--ports", type=int, default=1, help="number of listeners")
    ap.add_argument("--distinct-hosts", action="store_true",
                    help="bind listener k to 127.0.0.(k+1)")
    ap.add_argument("--host", default=None,
                    help="bind every listener to this address (default 127.0.0.1; 0.0.0.0 in a "
                         "container, for the other containers: deploy/docker-compose.yml)")
    ap.add_argument("--log", default=None, help="append one JSON line per request to this file")
    ap.add_argument("--spread", action="store_true",
                    help="page j on listener j %% ports, absolute links "
                         "(one crawl covers all hosts)")
    ap.add_argument("--delay", type=float, default=0.0, help="seconds each /p/ page takes")
    ap.add_argument("--redirect", action="store_true",
                    help="page links go through /redirect/J (a 302 to /p/J)")
    ap.add_argument("--nodelay", action="store_true", help="TCP_NODELAY on the connections")
    ap.add_argument("--profile", choices=PROFILES, default=None,
                    help="each /p/ page also waits its delay in this latency profile")
    ns = ap.parse_args(argv)
    if ns.host is not None and ns.distinct_hosts:
        ap.error("--host and --distinct-hosts exclude each other")
    site = Site(pages=ns.pages, log_path=ns.log, ports=ns.ports, distinct_hosts=ns.distinct_hosts,
                hosts=None if ns.host is None else [ns.host] * ns.ports,
                port=ns.port, spread=ns.spread, delay=ns.delay, redirect=ns.redirect,
                nodelay=ns.nodelay, profile=ns.profile)
    site.start()
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    print(json.dumps({"urls": site.urls, "pid": os.getpid()}), flush=True)
    while not done.wait(1.0):
        pass
    site.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
