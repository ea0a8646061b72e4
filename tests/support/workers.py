"""Scrapy worker processes running the tests/project ``site`` spider.

``WorkerFactory`` is what the ``start_worker`` fixture returns::

    w = start_worker(redis_url, crawl_id, site.url + "/p/0",
                     settings={"CONCURRENT_REQUESTS": 8}, args={"slow_path": "/p/7"},
                     name="w1")
    w.wait(60) == 0; w.close_reason() == "finished"; w.items()

Each worker runs ``python -m scrapy crawl site -s K=V... -a K=V...`` with cwd
tests/project, PYTHONPATH = repo root (+ the existing one), stdout+stderr to
``<tmp>/<name>.log`` and its items (RecordPipeline) in ``<tmp>/<name>.items.jsonl``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from scrapy_leased.testing.process import read_log

from .redis_server import _pdeathsig_preexec

REPO_ROOT = Path(__file__).resolve().parents[2]
PROJECT_DIR = REPO_ROOT / "tests" / "project"

_CLOSE_RE = re.compile(r"Spider closed \((?P<reason>[^)]*)\)")
_STAT_RE = re.compile(r"^ '(?P<key>[^']+)': (?P<val>-?\d+(?:\.\d+)?|'[^']*'|None)[,}]\s*$", re.M)


def setting_to_cli(value: Any) -> str:
    """How a Python value is passed with ``-s K=V``: bools as True/False,
    dicts/lists as JSON (Scrapy json-decodes strings for dict/list settings),
    everything else ``str()``."""
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value)
    return str(value)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Parse a JSON-lines file; a torn (partially written) last line is skipped."""
    return read_log(path)


class Worker:
    def __init__(self, name: str, cmd: list[str], log_path: Path, record_path: Path | None,
                 env: Mapping[str, str], cwd: Path) -> None:
        self.name = name
        self.cmd = cmd
        self.log_path = log_path
        self.record_path = record_path
        self._log_file = open(log_path, "wb")
        self.proc = subprocess.Popen(
            cmd,
            cwd=str(cwd),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # terminal ^C goes to pytest only
            preexec_fn=_pdeathsig_preexec(),
        )
        self.started = time.time()

    # -- process control ---------------------------------------------------
    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def poll(self) -> int | None:
        return self.proc.poll()

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float | None = 120) -> int:
        """Wait for exit and return the returncode (negative = killed by that
        signal); raises subprocess.TimeoutExpired if still running."""
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is not None:
                self._close_log()

    def _signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass

    def kill9(self, wait: bool = True) -> None:
        """SIGKILL (a hard crash); waits for the process to be gone."""
        self._signal(signal.SIGKILL)
        if wait:
            self.wait(30)

    def sigterm(self) -> None:
        """SIGTERM: Scrapy's graceful shutdown (close reason 'shutdown')."""
        self._signal(signal.SIGTERM)

    def sigint(self) -> None:
        self._signal(signal.SIGINT)

    def sigstop(self) -> None:
        """Freeze the process (it holds its leases but does nothing)."""
        self._signal(signal.SIGSTOP)

    def sigcont(self) -> None:
        self._signal(signal.SIGCONT)

    def _close_log(self) -> None:
        if not self._log_file.closed:
            self._log_file.close()

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self._signal(signal.SIGKILL)  # works on SIGSTOPped processes too
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
        self._close_log()

    # -- output ------------------------------------------------------------
    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def close_reason(self) -> str | None:
        """REASON from the last ``Spider closed (REASON)`` log line, or None."""
        found = _CLOSE_RE.findall(self.log_text())
        return found[-1] if found else None

    def stats(self) -> dict[str, Any]:
        """Scalar values (ints, floats, strings, None) from the final
        'Dumping Scrapy stats' block; {} if the worker did not get there."""
        text = self.log_text()
        idx = text.rfind("Dumping Scrapy stats:")
        if idx < 0:
            return {}
        out: dict[str, Any] = {}
        block = text[idx:].split("\n", 1)[-1]
        block = block[: block.find("}") + 1] if "}" in block else block
        for m in _STAT_RE.finditer(" " + block[1:] if block.startswith("{") else block):
            v = m.group("val")
            if v == "None":
                out[m.group("key")] = None
            elif v.startswith("'"):
                out[m.group("key")] = v[1:-1]
            elif "." in v:
                out[m.group("key")] = float(v)
            else:
                out[m.group("key")] = int(v)
        return out

    def items(self) -> list[dict[str, Any]]:
        """Items this worker's RecordPipeline wrote (torn last line skipped)."""
        if self.record_path is None:
            return []
        return read_jsonl(self.record_path)

    # -- waiting helpers (test code; plain polling is fine here) -------------
    def wait_until(self, predicate: Callable[[], bool], timeout: float = 60, interval: float = 0.05,
                   what: str = "condition") -> None:
        """Poll predicate until true; raises TimeoutError (with the log tail)
        on timeout, or RuntimeError if the worker exits first and the
        predicate is still false."""
        deadline = time.monotonic() + timeout
        while True:
            if predicate():
                return
            if self.proc.poll() is not None:
                if predicate():
                    return
                raise RuntimeError(
                    f"worker {self.name} exited ({self.proc.returncode}) before {what}; log tail:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker {self.name}: no {what} within {timeout}s; log tail:\n{self.log_tail()}")
            time.sleep(interval)

    def wait_items(self, n: int, timeout: float = 60) -> list[dict[str, Any]]:
        """Wait until at least n items are recorded; returns them."""
        self.wait_until(lambda: len(self.items()) >= n, timeout, what=f"{n} items")
        return self.items()

    def wait_log(self, text: str, timeout: float = 60) -> None:
        """Wait until ``text`` (substring) appears in the worker log."""
        self.wait_until(lambda: text in self.log_text(), timeout, what=f"log text {text!r}")

    def __repr__(self) -> str:
        return f"<Worker {self.name} pid={self.proc.pid} rc={self.proc.poll()}>"


class WorkerFactory:
    """Callable: ``factory(redis_url, crawl_id, start_url, settings={}, args={},
    name='w1', env=None, record=True, spider='site', cli=None) -> Worker`` (``cli``: more
    ``scrapy crawl`` options, e.g. ``["-O", "items.jsonl"]``).  Keeps every worker it
    started (``.workers``) and kills them all in ``cleanup()``."""

    def __init__(self, tmp_path: Path, project_dir: Path = PROJECT_DIR) -> None:
        self.tmp_path = Path(tmp_path)
        self.project_dir = project_dir
        self.workers: list[Worker] = []

    def _unique(self, stem: str, suffix: str) -> Path:
        p = self.tmp_path / f"{stem}{suffix}"
        k = 2
        while p.exists():
            p = self.tmp_path / f"{stem}-{k}{suffix}"
            k += 1
        return p

    def command(self, redis_url: str | None, crawl_id: str | None, start_url: str | list[str] | None,
                settings: Mapping[str, Any] | None = None, args: Mapping[str, Any] | None = None,
                name: str = "w1", record_path: Path | None = None, spider: str = "site",
                cli: list[str] | None = None) -> list[str]:
        s: dict[str, Any] = {}
        if redis_url is not None:
            s["LEASED_REDIS_URL"] = redis_url
        if crawl_id is not None:
            s["LEASED_CRAWL_ID"] = crawl_id
        if record_path is not None:
            s["RECORD_PATH"] = str(record_path)
        s.update(settings or {})
        a: dict[str, Any] = {"worker": name}
        if start_url is not None:
            a["start_url"] = start_url if isinstance(start_url, str) else ",".join(start_url)
        a.update(args or {})
        cmd = [sys.executable, "-m", "scrapy", "crawl", spider, *(cli or [])]
        for k, v in s.items():
            if v is not None:
                cmd += ["-s", f"{k}={setting_to_cli(v)}"]
        for k, v in a.items():
            if v is not None:
                cmd += ["-a", f"{k}={v}"]
        return cmd

    def __call__(self, redis_url: str | None, crawl_id: str | None, start_url: str | list[str] | None,
                 settings: Mapping[str, Any] | None = None, args: Mapping[str, Any] | None = None,
                 name: str = "w1", env: Mapping[str, str] | None = None, record: bool = True,
                 spider: str = "site", cli: list[str] | None = None) -> Worker:
        log_path = self._unique(name, ".log")
        record_path = None
        if record and "RECORD_PATH" not in (settings or {}):
            record_path = log_path.with_name(log_path.name[: -len(".log")] + ".items.jsonl")
        elif settings and settings.get("RECORD_PATH"):
            record_path = Path(settings["RECORD_PATH"])
        cmd = self.command(redis_url, crawl_id, start_url, settings, args, name, record_path, spider,
                           cli)
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("SCRAPY_")}
        full_env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO_ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
        )
        full_env["PYTHONUNBUFFERED"] = "1"
        full_env.pop("TESTPROJECT_NO_ADDON", None)
        if env:
            full_env.update(env)
        w = Worker(name, cmd, log_path, record_path, full_env, self.project_dir)
        self.workers.append(w)
        return w

    def barrier(self, n: int) -> dict[str, Any]:
        """Settings that make the next ``n`` workers started with them wait for each other
        after joining the crawl's run, before crawling (tests/project/testproject/
        extensions.py): workers started together then share one run of the crawl."""
        path = self._unique("barrier", ".d")
        path.mkdir()
        return {"TEST_BARRIER_DIR": str(path), "TEST_BARRIER_SIZE": n}

    def fleet(self, n: int, redis_url: str | None, crawl_id: str | None, start_url: str,
              settings: Mapping[str, Any] | None = None, prefix: str = "w",
              **kwargs: Any) -> list[Worker]:
        """``n`` workers (named ``w0``, ``w1``...) started together: they wait for each
        other at the barrier (``barrier``), so they share one run of the crawl."""
        together = {**(settings or {}), **self.barrier(n)}
        return [self(redis_url, crawl_id, start_url, settings=together, name=f"{prefix}{i}",
                     **kwargs) for i in range(n)]

    def all_items(self) -> list[dict[str, Any]]:
        """Items recorded by every worker started so far."""
        return [it for w in self.workers for it in w.items()]

    def wait_all(self, timeout: float = 120) -> list[int]:
        """Wait for every worker (shared deadline); returns their returncodes."""
        deadline = time.monotonic() + timeout
        return [w.wait(max(0.0, deadline - time.monotonic())) for w in self.workers]

    def cleanup(self) -> None:
        for w in self.workers:
            w.cleanup()

    def report(self, lines: int = 40) -> str:
        return "\n".join(
            f"----- worker {w.name} pid={w.pid} rc={w.proc.poll()} cmd={' '.join(w.cmd)}\n{w.log_tail(lines)}"
            for w in self.workers
        )


def wait_for(pred: Callable[[], bool], timeout: float, what: str, workers=()) -> None:
    """Poll pred (test-side polling). Fails early if a worker in ``workers`` exits."""
    deadline = time.monotonic() + timeout
    while not pred():
        for w in workers:
            if not w.running and not pred():
                raise AssertionError(f"worker {w.name} exited ({w.returncode}) before {what}:\n"
                                     f"{w.log_tail()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout}s")
        time.sleep(0.02)
