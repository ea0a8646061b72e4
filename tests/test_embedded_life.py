"""The embedded Redis server's life, with real processes: real ``scrapy crawl`` workers and
``scrapy leased`` commands in a fresh copy of tests/project, no LEASED_REDIS_URL, a local
site, the server under the folder's ``.scrapy/leased-redis``.

- It stops once the last process that used it is gone (within 5 s), kill -9 included, and
  not while one still runs.
- A failed command in a fresh folder leaves no server behind.
- ``scrapy leased embedded stop`` stops it; ``embedded status`` says who uses it.
- Its data persists (AOF): a later crawl resumes where the stopped one left off.

The test process itself never uses the server (it reads the address file with
``running_embedded_redis``, which does not make it a user).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from scrapy_leased._redis.embedded import GRACE_SECONDS, running_embedded_redis
from scrapy_leased.frontier.keys import CrawlKeys
from tests.support.workers import PROJECT_DIR, REPO_ROOT, Worker, WorkerFactory, wait_for
from tests.test_embedded import _cleanup, server_pids  # live processes working in the data dir

pytestmark = [pytest.mark.integration, pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="finds server processes via /proc")]

GONE_WITHIN = 5.0  # seconds after the last user exits
HANG_GUARD = 60.0  # polls give up after this long (a failure, not a measure)
FAST = {"LEASED_LEASE_SECONDS": 3, "LEASED_SWEEP_INTERVAL": 0.5, "CONCURRENT_REQUESTS": 2,
        "LEASED_WORKER_TTL": 3}
SLOW = {"slow_path": "/p/", "slow_seconds": "0.1"}  # each page's callback takes 0.1 s


def _live(pid_dir: Path) -> bool:
    try:
        return (pid_dir / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def watchdog_pids(data_dir: Path) -> list[int]:
    target = os.path.realpath(data_dir).encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"scrapy_leased._redis.watchdog" in argv and target in argv and _live(entry):
            pids.append(int(entry.name))
    return pids


def wait_gone(data_dir: Path, since: float) -> float:
    """Seconds from ``since`` until no server (nor its watchdog) runs in data_dir."""
    wait_for(lambda: not server_pids(data_dir) and not watchdog_pids(data_dir),
             HANG_GUARD, f"the embedded Redis in {data_dir} to stop")
    return time.monotonic() - since


class Folder:
    """A fresh project folder, its embedded data dir, workers and commands run in it."""

    def __init__(self, tmp_path: Path) -> None:
        import shutil

        self.root = tmp_path / "project"
        shutil.copytree(PROJECT_DIR, self.root,
                        ignore=shutil.ignore_patterns(".scrapy", "__pycache__"))
        self.data_dir = self.root / ".scrapy" / "leased-redis"
        self.workers = WorkerFactory(tmp_path, project_dir=self.root)
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith("SCRAPY_") and k != "LEASED_REDIS_URL"}
        self.env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(REPO_ROOT), self.env.get("PYTHONPATH")]))

    def worker(self, crawl_id: str, start_url: str, name: str, **settings: object) -> Worker:
        return self.workers(None, crawl_id, start_url, settings={**FAST, **settings},
                            args=SLOW, name=name, record=False)

    def leased(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "scrapy", "leased", *args],
                              cwd=self.root, env=self.env, capture_output=True, text=True,
                              timeout=120)

    def done(self, crawl_id: str) -> int:
        url = running_embedded_redis(self.data_dir)  # not a user: the test never holds it
        if url is None:
            return -1
        client = redis.Redis.from_url(url, socket_timeout=5)
        try:
            return int(client.hget(CrawlKeys(crawl_id).stats, "done") or 0)
        except redis.ConnectionError:
            return -1
        finally:
            client.close()

    def cleanup(self) -> None:
        self.workers.cleanup()
        _cleanup(self.data_dir, lambda d: server_pids(d) + watchdog_pids(d))


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Folder]:
    f = Folder(tmp_path)
    yield f
    f.cleanup()


def test_the_server_stops_within_5_s_of_the_last_worker_exiting(folder, make_site, crawl_id):
    site = make_site(pages=40)
    barrier = folder.workers.barrier(2)
    workers = [folder.worker(crawl_id, site.page_url(0), f"w{i}", **barrier) for i in range(2)]
    wait_for(lambda: bool(server_pids(folder.data_dir) and watchdog_pids(folder.data_dir)),
             HANG_GUARD, "the server and its watchdog to start", workers)
    assert len(server_pids(folder.data_dir)) == 1
    assert len(watchdog_pids(folder.data_dir)) == 1
    for w in workers:
        assert w.wait(120) == 0, w.log_tail()
        assert w.close_reason() == "finished"
    exited = time.monotonic()
    took = wait_gone(folder.data_dir, exited)
    print(f"\nthe embedded Redis stopped {took:.2f} s after the last worker exited")
    assert took <= GONE_WITHIN
    assert not (folder.data_dir / "address").exists()
    assert (folder.data_dir / "appendonlydir").is_dir()  # its data stays


def test_a_worker_killed_with_kill_9_leaves_the_server_to_the_other_then_it_stops(
        folder, make_site, crawl_id):
    pages = 150
    site = make_site(pages=pages)
    barrier = folder.workers.barrier(2)
    a, b = (folder.worker(crawl_id, site.page_url(0), name, **barrier) for name in ("a", "b"))
    wait_for(lambda: folder.done(crawl_id) >= 20, HANG_GUARD, "20 pages done", [a, b])
    (pid,) = server_pids(folder.data_dir)
    a.kill9()
    killed = time.monotonic()
    # b still uses it: the server stays past the grace (2 s) and a few watchdog rounds
    while time.monotonic() - killed < GRACE_SECONDS + 2.0:
        assert b.running, "b ended too soon for this test: give it more pages"
        assert server_pids(folder.data_dir) == [pid]
        time.sleep(0.1)
    assert b.wait(120) == 0, b.log_tail()
    assert b.close_reason() == "finished"
    exited = time.monotonic()
    assert folder.done(crawl_id) >= pages  # b finished the crawl on the same server
    took = wait_gone(folder.data_dir, exited)
    print(f"\nthe embedded Redis stayed while b ran; it stopped {took:.2f} s after b exited")
    assert took <= GONE_WITHIN


def test_a_failed_command_in_a_fresh_folder_leaves_no_server(folder, crawl_id):
    # a line that is not a request: refused before the server is started at all
    seed = folder.leased("seed", crawl_id, "not a url")
    assert seed.returncode == 1, (seed.stdout, seed.stderr)
    assert "not a URL" in seed.stderr
    assert not folder.data_dir.exists() and not server_pids(folder.data_dir)
    # a seed that fails once the server runs (it started it: a fresh folder; the crawl
    # was started with another seen-set layout) leaves no server
    assert folder.leased("seed", crawl_id, "http://example.com/1").returncode == 0
    assert wait_gone(folder.data_dir, time.monotonic()) <= GONE_WITHIN
    seed = folder.leased("seed", crawl_id, "http://example.com/2", "-s",
                         "LEASED_SEEN_BUCKET_BITS=12")
    exited = time.monotonic()
    assert seed.returncode == 1 and "LEASED_SEEN_BUCKET_BITS" in seed.stderr, seed.stderr
    assert wait_gone(folder.data_dir, exited) <= GONE_WITHIN
    # an unknown crawl: the command restarts the server from the seed's AOF, fails, and
    # leaves no server either
    status = folder.leased("status", "no-such-crawl", "--sample", "0")
    exited = time.monotonic()
    assert status.returncode == 1 and "unknown crawl 'no-such-crawl'" in status.stderr, \
        status.stderr
    assert wait_gone(folder.data_dir, exited) <= GONE_WITHIN
    # a fresh folder with no data: status starts nothing at all
    other = folder.root / ".scrapy" / "other"
    status = folder.leased("status", "--sample", "0", "-s", f"LEASED_EMBEDDED_DIR={other}")
    assert status.returncode == 1 and "no Redis to read" in status.stderr, status.stderr
    assert not other.exists()


def test_embedded_stop_stops_a_running_server(folder):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys\n"
         "from scrapy_leased._redis.embedded import ensure_embedded_redis\n"
         f"print(ensure_embedded_redis({str(folder.data_dir)!r}), flush=True)\n"
         "sys.stdin.read()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=folder.env)
    try:
        assert holder.stdout is not None
        url = holder.stdout.readline().strip()
        (pid,) = server_pids(folder.data_dir)
        status = folder.leased("embedded", "status")
        assert status.returncode == 0, status.stderr
        assert f"running at {url} (pid {pid}), used by 1 process (pids {holder.pid})" \
            in status.stdout, status.stdout

        stop = folder.leased("embedded", "stop")
        assert stop.returncode == 0, stop.stderr
        assert f"Stopped the embedded Redis in {folder.data_dir.resolve()} (pid {pid})" \
            in stop.stdout, stop.stdout
        assert f"(pids {holder.pid}): they lose their Redis" in stop.stderr
        assert server_pids(folder.data_dir) == []  # stop waits for the exit
        wait_gone(folder.data_dir, time.monotonic())  # its watchdog follows

        again = folder.leased("embedded", "stop")
        assert again.returncode == 0 and "not running (its data stays there)" in again.stdout
        assert folder.leased("embedded", "status").stdout.strip().endswith(
            "not running (its data stays there)")
    finally:
        holder.communicate(timeout=60)


def test_a_later_crawl_resumes_from_the_persisted_data(folder, make_site, crawl_id):
    """A crawl stopped (SIGTERM) half way; the server stops with its worker; a new worker
    later restarts it from its AOF and fetches only what the first one had not."""
    pages = 80
    site = make_site(pages=pages)
    first = folder.worker(crawl_id, site.page_url(0), "first")
    wait_for(lambda: folder.done(crawl_id) >= 20, HANG_GUARD, "20 pages done", [first])
    first.sigterm()
    assert first.wait(120) == 0, first.log_tail()
    assert first.close_reason() == "shutdown"
    wait_gone(folder.data_dir, time.monotonic())
    before = site.count_by_path()
    assert 20 <= len(before) < pages

    second = folder.worker(crawl_id, site.page_url(0), "second")
    assert second.wait(120) == 0, second.log_tail()
    assert second.close_reason() == "finished"
    fetched = site.count_by_path()
    assert set(fetched) == {f"/p/{i}" for i in range(pages)}
    again = {path: n for path, n in fetched.items() if n > 1}
    # only the start request, re-sent with dont_filter=True by every run, came back
    assert set(again) <= {"/p/0"}, again
    wait_gone(folder.data_dir, time.monotonic())
