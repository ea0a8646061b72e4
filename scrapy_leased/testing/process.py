"""The test site as a subprocess (``python -m scrapy_leased.testing.site``), and its log file.

A subprocess, so serving does not compete with the calling process for the GIL.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

#: where ``python -m scrapy_leased.testing.site`` finds this very package
PACKAGE_PARENT = Path(__file__).resolve().parents[2]


def read_log(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Parse a site log file (JSON lines); a torn last line is skipped."""
    out = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
    except FileNotFoundError:
        pass
    return out


class SiteProcess:
    """Run the site as a subprocess.

    The options are the site's (:class:`scrapy_leased.testing.site.Site`); ``profile``
    is a latency profile's name (:mod:`scrapy_leased.testing.latency`). ``urls`` /
    ``url`` are known after :meth:`start`; the log is only in the file (``log_path``,
    required), read it with :meth:`entries`.
    """

    def __init__(
        self,
        pages: int,
        log_path: str | os.PathLike[str],
        ports: int = 1,
        distinct_hosts: bool = False,
        port: int = 0,
        spread: bool = False,
        delay: float = 0.0,
        nodelay: bool = False,
        profile: str | None = None,
    ) -> None:
        self.pages = pages
        self.log_path = Path(log_path).absolute()
        self.nports = ports
        self.distinct_hosts = distinct_hosts
        self.first_port = port
        self.spread = spread
        self.delay = delay
        self.nodelay = nodelay
        self.profile = profile
        self.proc: subprocess.Popen[str] | None = None
        self.urls: list[str] = []

    def command(self) -> list[str]:
        cmd = [
            sys.executable, "-m", "scrapy_leased.testing.site",
            "--pages", str(self.pages), "--port", str(self.first_port),
            "--ports", str(self.nports), "--log", str(self.log_path),
        ]
        flags = {"--distinct-hosts": self.distinct_hosts, "--spread": self.spread,
                 "--nodelay": self.nodelay}
        cmd += [flag for flag, on in flags.items() if on]
        if self.delay:
            cmd += ["--delay", str(self.delay)]
        if self.profile is not None:
            cmd += ["--profile", self.profile]
        return cmd

    def start(self, timeout: float = 10.0) -> SiteProcess:
        cmd = self.command()
        proc = self.proc = subprocess.Popen(cmd, cwd=str(PACKAGE_PARENT),
                                            stdout=subprocess.PIPE, text=True)
        _register_child(proc)
        result: list[str] = []

        def read_first_line() -> None:
            if proc.stdout is not None:
                result.append(proc.stdout.readline())

        reader = threading.Thread(target=read_first_line, daemon=True)
        reader.start()
        reader.join(timeout)
        if not result or not result[0].strip():
            self.stop()
            raise RuntimeError(f"test site subprocess did not start within {timeout}s: {cmd}")
        self.urls = json.loads(result[0])["urls"]
        return self

    @property
    def url(self) -> str:
        return self.urls[0]

    def entries(self) -> list[dict[str, Any]]:
        return read_log(self.log_path)

    def count_by_path(self, include_query: bool = True) -> Counter[str]:
        return Counter(
            e["path"] if include_query else e["path"].split("?", 1)[0] for e in self.entries()
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        if self.proc is not None and self.proc.stdout:
            self.proc.stdout.close()

    def __enter__(self) -> SiteProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


_children: list[subprocess.Popen[str]] = []


def _register_child(proc: subprocess.Popen[str]) -> None:
    if not _children:
        atexit.register(_kill_children)
    _children.append(proc)


def _kill_children() -> None:
    for p in _children:
        if p.poll() is None:
            try:
                p.kill()
            except OSError:
                pass
