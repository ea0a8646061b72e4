"""``scrapy leased metrics`` / ``scrapy leased dashboard`` run as an operator would, in a
subprocess, on a free port (``--port 0``: the URL is read from its first line)::

    with LeasedServer("dashboard", crawl_id, "--redis-url", url, "--allow-writes") as srv:
        srv.url  # http://127.0.0.1:PORT/
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from typing import Any

from .process import terminate
from .redis_server import _pdeathsig_preexec
from .workers import PROJECT_DIR, REPO_ROOT

_URL_RE = re.compile(r"on (http://\S+/)")


class LeasedServer:
    def __init__(self, sub: str, *args: str) -> None:
        self.cmd = [sys.executable, "-m", "scrapy", "leased", sub, "--port", "0", *args]
        self.url = ""
        self.output: list[str] = []
        self.proc: subprocess.Popen[str] | None = None

    def start(self, timeout: float = 60) -> LeasedServer:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SCRAPY_")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(self.cmd, cwd=PROJECT_DIR, env=env, text=True,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, preexec_fn=_pdeathsig_preexec())
        found = threading.Event()

        def read() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                self.output.append(line)
                m = _URL_RE.search(line)
                if m and not found.is_set():
                    self.url = m.group(1)
                    found.set()
            found.set()  # exited

        threading.Thread(target=read, daemon=True).start()
        found.wait(timeout)
        if not self.url:
            self.stop()
            raise RuntimeError(f"{' '.join(self.cmd)} did not start: {''.join(self.output)}")
        return self

    def stop(self) -> None:
        terminate(self.proc, 10)

    def __enter__(self) -> LeasedServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
