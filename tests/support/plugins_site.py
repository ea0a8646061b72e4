"""The local site of tests/test_plugins.py (standard library, one thread per request).

``/js/{i}`` (i < js_pages): a page whose title and links (to ``/js/{2i+1}``,
``/js/{2i+2}``) only exist once its script ran (for scrapy-playwright).

``/list/{k}`` (k < lists): a list page linking the item pages ``/item/{k*per+j}`` and
the next list page; ``/item/{n}``: an item page, ``<p id="state">ready</p>``, except that
two of every three (n % 3 in (0, 1)) answer ``loading`` on their first fetch (for scrapy-poet's
``web_poet.Retry``). ``hits`` counts the fetches of each path (query left out).
"""

from __future__ import annotations

import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class PluginsSite:
    def __init__(self, js_pages: int = 15, lists: int = 3, per: int = 6) -> None:
        self.js_pages, self.lists, self.per = js_pages, lists, per
        self.hits: Counter[str] = Counter()
        self._lock = threading.Lock()
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                with site._lock:
                    site.hits[path] += 1
                    nth = site.hits[path]
                body = site.page(path, nth)
                self.send_response(404 if body is None else 200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                data = (body or "<html><body>not found</body></html>").encode()
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> PluginsSite:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def reset(self) -> None:
        with self._lock:
            self.hits.clear()

    def js_urls(self) -> set[str]:
        return {f"{self.url}/js/{i}" for i in range(self.js_pages)}

    def item_numbers(self) -> range:
        return range(self.lists * self.per)

    def page(self, path: str, nth: int) -> str | None:
        parts = path.strip("/").split("/")
        if len(parts) != 2 or not parts[1].isdigit():
            return None
        kind, n = parts[0], int(parts[1])
        if kind == "js" and n < self.js_pages:
            links = "".join(f'<a href="/js/{c}">page {c}</a>' for c in (2 * n + 1, 2 * n + 2)
                            if c < self.js_pages)
            return ("<html><head><title>js</title></head><body><div id=root></div><script>"
                    "setTimeout(function () { document.getElementById('root').innerHTML = "
                    f"'<h1 id=title>js page {n}</h1>{links}'; }}, 20);"
                    "</script></body></html>")
        if kind == "list" and n < self.lists:
            items = "".join(f'<a class=item href="/item/{n * self.per + j}">item</a>'
                            for j in range(self.per))
            nxt = f'<a class=next href="/list/{n + 1}">next</a>' if n + 1 < self.lists else ""
            return f"<html><body><h1>list {n}</h1>{items}{nxt}</body></html>"
        if kind == "item" and n < self.lists * self.per:
            state = "loading" if n % 3 in (0, 1) and nth == 1 else "ready"
            return (f"<html><body><h1>item {n}</h1><p id=state>{state}</p>"
                    "</body></html>")
        return None
