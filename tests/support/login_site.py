"""A local site with a login form, for the session tests (tests/test_cookies_fleet.py).

``LoginSite(pages=100, delay=0.01).start()`` serves on 127.0.0.1 (a free port, one
thread per request):

``GET /login``        the login form (``user``, ``password``).
``POST /login``       any user with the password ``pw``: 200 "welcome <user>" and
                      ``Set-Cookie: session=<token>; Path=/; HttpOnly`` (a token per
                      login); else 403 without a cookie.
``/p/{i}``            page i (0 <= i < pages): ``<p id="user">USER</p>`` with the user
                      of the request's ``session`` cookie, ``<p id="user"></p>`` without
                      a valid one; links to ``/p/{2i+1}`` and ``/p/{2i+2}`` (those <
                      pages), keeping the query string (so two sessions can crawl the
                      same pages as distinct URLs). Each takes ``delay`` seconds.

``requests`` lists ``(path, user or "")`` of every page served.
"""

from __future__ import annotations

import html
import secrets
import threading
import time
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

PASSWORD = "pw"


class LoginSite:
    def __init__(self, pages: int = 100, delay: float = 0.0) -> None:
        self.pages = pages
        self.delay = delay
        self.sessions: dict[str, str] = {}  # token -> user
        self.requests: list[tuple[str, str]] = []
        self.logins: list[str] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> LoginSite:
        site = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def _send(self, status: int, body: str, headers: dict[str, str] | None = None
                      ) -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _user(self) -> str:
                jar = SimpleCookie(self.headers.get("Cookie") or "")
                token = jar["session"].value if "session" in jar else ""
                with site._lock:
                    return site.sessions.get(token, "")

            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                if parts.path == "/login":
                    self._send(200, '<form method="post" action="/login"><input name="user">'
                                    '<input name="password" type="password"></form>')
                    return
                if parts.path.startswith("/p/"):
                    try:
                        i = int(parts.path[3:])
                    except ValueError:
                        i = -1
                    if 0 <= i < site.pages:
                        if site.delay:
                            time.sleep(site.delay)
                        user = self._user()
                        with site._lock:
                            site.requests.append((parts.path, user))
                        q = f"?{parts.query}" if parts.query else ""
                        links = "".join(f'<a class="next" href="/p/{j}{q}">{j}</a>'
                                        for j in (2 * i + 1, 2 * i + 2) if j < site.pages)
                        self._send(200, f"<html><title>page {i}</title><body>"
                                        f'<p id="user">{html.escape(user)}</p>{links}'
                                        "</body></html>")
                        return
                self._send(404, "not found")

            def do_POST(self) -> None:
                parts = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                form = parse_qs(self.rfile.read(length).decode())
                user = (form.get("user") or [""])[0]
                if parts.path != "/login" or not user or \
                        (form.get("password") or [""])[0] != PASSWORD:
                    self._send(403, "bad login")
                    return
                token = secrets.token_hex(8)
                with site._lock:
                    site.sessions[token] = user
                    site.logins.append(user)
                self._send(200, f"welcome {html.escape(user)}",
                           {"Set-Cookie": f"session={token}; Path=/; HttpOnly"})

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
