"""The environments workers start in (issue #24): workers started at once in one project
folder, a project without scrapy.cfg, worker ids that collide, the declared versions.

Real ``scrapy crawl`` processes of tests/project (tests/support/workers.py) against a
private redis-server and the local test site.

- Workers started at the same moment in one fresh project folder all start: none of them
  touches Scrapy's project data dir (``.scrapy/``) unless it uses the embedded Redis
  (Scrapy's ``project_data_dir`` creates it with a check-then-mkdir: FileExistsError for
  the loser of the race), and on the embedded Redis they tolerate that race.
- Without scrapy.cfg (SCRAPY_SETTINGS_MODULE names the settings) and with
  LEASED_REDIS_URL, the add-on stays on.
- A worker whose id is alive in the crawl's registry when it starts takes another one
  (lua/worker_enter.lua): both crawl, nothing shared.
- pyproject.toml, the README and docs/compatibility.md state one version range.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import socket
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis

from scrapy_leased._redis.connection import make_client
from scrapy_leased._redis.embedded import (
    embedded_data_dir,
    ensure_embedded_redis,
    stop_embedded_redis,
)
from scrapy_leased.frontier.keys import CrawlKeys
from scrapy_leased.frontier.workerid import (
    RANDOM_BITS,
    TEST_IDS_ENV,
    WorkerIdTaken,
    enter,
    new_worker_id,
)
from scrapy_leased.testing.site import Site
from tests.support.workers import PROJECT_DIR, REPO_ROOT, Worker, WorkerFactory, wait_for

ROUNDS, AT_ONCE, PAGES = 10, 6, 12
FAST = {"LEASED_LEASE_SECONDS": 5, "LEASED_SWEEP_INTERVAL": 0.5, "CONCURRENT_REQUESTS": 4}
ID_RE = re.compile(r"^(?P<host>[^:]+):(?P<pid>\d+):(?P<rand>[a-z2-7]{13})$")


def fresh_project(root: Path) -> Path:
    """A copy of tests/project (scrapy.cfg + the testproject package) with no .scrapy/."""
    shutil.copytree(PROJECT_DIR, root, ignore=shutil.ignore_patterns(".scrapy", "__pycache__"))
    assert not (root / ".scrapy").exists()
    return root


def stat(r: redis.Redis, crawl_id: str, name: str) -> int:
    return int(r.hget(CrawlKeys(crawl_id).stats, name) or 0)


def fetched(site: Site) -> Counter[str]:
    return Counter(e["path"].split("?")[0] for e in site.log if e["status"] == 200)


def assert_round(workers: list[Worker], r: redis.Redis, crawl_id: str, site: Site,
                 pages: int) -> None:
    for w in workers:
        rc = w.wait(120)
        assert rc == 0 and w.close_reason() == "finished", (rc, w.close_reason(), w.log_tail())
        log = w.log_text()
        assert "Traceback" not in log and "FileExistsError" not in log, w.log_tail()
        assert "Leased frontier" in log, w.log_tail()
    assert stat(r, crawl_id, "done") == pages
    assert set(fetched(site)) == {f"/p/{i}" for i in range(pages)}


# -- the start race ------------------------------------------------------------------


def test_workers_started_at_once_in_a_fresh_folder_all_start(redis_server, make_site,
                                                              tmp_path):
    """10 times, 6 workers started at once in a fresh copy of the project folder (no
    .scrapy/ yet), with LEASED_REDIS_URL: every one starts, joins and ends `finished`,
    every page is done, and none created .scrapy/ (at b7e0046 the config resolved
    LEASED_EMBEDDED_DIR through Scrapy's data_path in every worker: FileExistsError now
    and then for one of them, and a .scrapy/ in every folder). Two rounds run at a time."""
    r = redis_server.client()
    site = make_site(pages=PAGES)

    def one_round(i: int) -> None:
        folder = fresh_project(tmp_path / f"round{i}")
        factory = WorkerFactory(tmp_path / f"logs{i}", project_dir=folder)
        factory.tmp_path.mkdir()
        crawl_id = f"race-{i}-{time.monotonic_ns()}"
        try:
            barrier = factory.barrier(AT_ONCE)
            workers = [factory(redis_server.url, crawl_id, site.page_url(0),
                               settings={**FAST, **barrier}, name=f"w{j}", record=False)
                       for j in range(AT_ONCE)]
            for w in workers:
                rc = w.wait(120)
                assert rc == 0 and w.close_reason() == "finished", \
                    (i, w.name, rc, w.log_tail())
                assert "FileExistsError" not in w.log_text()
                assert "Leased frontier" in w.log_text()
                assert "Start barrier: all 6 workers arrived" in w.log_text(), w.log_tail()
            assert stat(r, crawl_id, "done") == PAGES
            assert not (folder / ".scrapy").exists(), "a worker created .scrapy/"
        finally:
            factory.cleanup()

    with ThreadPoolExecutor(max_workers=2) as pool:
        for future in [pool.submit(one_round, i) for i in range(ROUNDS)]:
            future.result()
    assert set(fetched(site)) == {f"/p/{i}" for i in range(PAGES)}


def test_embedded_redis_workers_started_at_once_in_a_fresh_folder(make_site, tmp_path):
    """On the embedded Redis (no LEASED_REDIS_URL), 4 workers started at once in a fresh
    project folder: all start on one embedded server under the project's
    .scrapy/leased-redis (made with exist_ok, so the race for .scrapy/ is harmless) and
    the crawl ends `finished` with every page done."""
    folder = fresh_project(tmp_path / "project")
    data_dir = folder / ".scrapy" / "leased-redis"
    factory = WorkerFactory(tmp_path, project_dir=folder)
    site = make_site(pages=PAGES)
    try:
        barrier = factory.barrier(4)
        workers = [factory(None, "embedded-race", site.page_url(0),
                           settings={**FAST, **barrier}, name=f"w{j}", record=False)
                   for j in range(4)]
        for w in workers:
            rc = w.wait(120)
            assert rc == 0 and w.close_reason() == "finished", (w.name, rc, w.log_tail())
            assert "FileExistsError" not in w.log_text()
        # the server may have stopped with the workers: ensure_embedded_redis restarts it
        url = ensure_embedded_redis(data_dir)
        client = redis.Redis.from_url(url, socket_timeout=5)
        try:
            assert stat(client, "embedded-race", "done") == PAGES
        finally:
            client.close()
    finally:
        factory.cleanup()
        stop_embedded_redis(data_dir)


def test_no_scrapy_cfg_with_a_redis_url_keeps_the_add_on_on(redis_server, make_site,
                                                            tmp_path, crawl_id):
    """A project folder without scrapy.cfg, its settings named by SCRAPY_SETTINGS_MODULE,
    and LEASED_REDIS_URL: the add-on is on (the crawl runs on the leased frontier) and
    nothing is created in the folder. At b7e0046 Scrapy disabled the add-on ("Unable to
    find scrapy.cfg file to infer project data dir", from data_path at config time) and
    the crawl ran on Scrapy's own scheduler."""
    folder = fresh_project(tmp_path / "nocfg")
    (folder / "scrapy.cfg").unlink()
    before = sorted(p.name for p in folder.iterdir())
    factory = WorkerFactory(tmp_path, project_dir=folder)
    site = make_site(pages=PAGES)
    try:
        w = factory(redis_server.url, crawl_id, site.page_url(0), settings=FAST,
                    env={"SCRAPY_SETTINGS_MODULE": "testproject.settings"}, record=False)
        assert_round([w], redis_server.client(), crawl_id, site, PAGES)
        assert "Disabled scrapy_leased" not in w.log_text()
        assert "Unable to find scrapy.cfg" not in w.log_text()
        assert sorted(p.name for p in folder.iterdir()) == before
    finally:
        factory.cleanup()


def test_embedded_data_dir_is_resolved_like_scrapy_without_creating_anything(
        tmp_path, monkeypatch):
    """LEASED_EMBEDDED_DIR: absolute as is; relative under .scrapy/ next to scrapy.cfg
    (as Scrapy's data_path), under .scrapy/ of the current directory without scrapy.cfg;
    nothing is created by resolving it."""
    folder = fresh_project(tmp_path / "p")
    sub = folder / "testproject"
    monkeypatch.delenv("SCRAPY_SETTINGS_MODULE", raising=False)
    monkeypatch.chdir(sub)
    assert embedded_data_dir("leased-redis") == (folder / ".scrapy" / "leased-redis").resolve()
    assert embedded_data_dir(tmp_path / "abs") == tmp_path / "abs"
    assert not (folder / ".scrapy").exists()
    bare = tmp_path / "bare"
    bare.mkdir()
    monkeypatch.chdir(bare)
    assert embedded_data_dir("leased-redis") == Path(".scrapy") / "leased-redis"
    assert list(bare.iterdir()) == []


# -- worker ids ----------------------------------------------------------------------


def test_worker_ids_are_readable_with_64_random_bits(monkeypatch):
    monkeypatch.setattr("scrapy_leased.frontier.workerid._planned", [])
    ids = {new_worker_id() for _ in range(2000)}
    assert len(ids) == 2000
    for wid in ids:
        m = ID_RE.match(wid)
        assert m, wid
        assert m["host"] == socket.gethostname() and int(m["pid"]) > 0
    assert RANDOM_BITS >= 64
    # 64 bits: two of 10,000 workers on one host and pid draw the same about 3e-12
    assert 10_000 ** 2 / 2 / 2 ** RANDOM_BITS < 1e-11


def test_enter_takes_another_id_when_its_id_is_alive_and_writes_nothing(redis_server,
                                                                        crawl_id,
                                                                        monkeypatch):
    """worker_enter.lua: an id alive in the registry (a heartbeat younger than the worker
    TTL) is refused with nothing written, and the worker draws the next one; an id whose
    heartbeat is older than the TTL (a worker that died) is taken; after MAX_DRAWS ids
    in use, one clear error."""
    keys = CrawlKeys(crawl_id)
    r = redis_server.client()
    sec, usec = r.time()
    now = int(sec) * 1000 + int(usec) // 1000
    r.zadd(keys.workers, {"h:1:alive": now - 1000, "h:1:dead": now - 60_000})
    before = r.zrange(keys.workers, 0, -1, withscores=True)

    async def go(first: str, planned: list[str], draws: int = 8) -> tuple[str, list[str]]:
        monkeypatch.setattr("scrapy_leased.frontier.workerid._planned", planned)
        client = make_client(redis_server.url)
        try:
            return await enter(client, keys, first, 30_000, draws=draws)
        finally:
            await client.aclose()

    assert asyncio.run(go("h:1:alive", ["h:1:alive", "h:2:new"])) == \
        ("h:2:new", ["h:1:alive", "h:1:alive"])
    after = dict(r.zrange(keys.workers, 0, -1, withscores=True))
    assert after[b"h:1:alive"] == dict(before)[b"h:1:alive"]  # untouched
    assert after[b"h:2:new"] >= now
    assert asyncio.run(go("h:1:dead", [])) == ("h:1:dead", [])
    assert dict(r.zrange(keys.workers, 0, -1, withscores=True))[b"h:1:dead"] >= now
    with pytest.raises(WorkerIdTaken, match="alive in the registry"):
        asyncio.run(go("h:1:alive", ["h:1:alive", "h:2:new"], draws=3))


def test_a_worker_drawing_a_live_workers_id_takes_another_and_both_crawl(
        redis_server, make_site, start_worker, crawl_id):
    """Worker w1 runs; worker w2 is made to draw w1's id first (TEST_IDS_ENV, a test-only
    hook of new_worker_id): it finds it alive, takes a new random one, logs it, and both
    crawl the site to `finished` under their own ids: every page fetched and done once,
    each worker's claims and registry entry its own."""
    r = redis_server.client()
    keys = CrawlKeys(crawl_id)
    site = make_site(pages=150)
    barrier = start_worker.barrier(2)
    settings = {**FAST, **barrier}
    w1 = start_worker(redis_server.url, crawl_id, site.page_url(0), settings=settings,
                      name="w1")

    def id_of(pid: int) -> str | None:
        for wid, info in r.hgetall(keys.worker_info).items():
            if json.loads(info).get("pid") == pid:
                return wid.decode()
        return None

    wait_for(lambda: id_of(w1.pid) is not None, 60, "w1 registered", [w1])
    first = id_of(w1.pid)
    assert first is not None and ID_RE.match(first), first
    w2 = start_worker(redis_server.url, crawl_id, site.page_url(0), settings=settings,
                      name="w2", env={TEST_IDS_ENV: first})
    for w in (w1, w2):
        assert w.wait(120) == 0 and w.close_reason() == "finished", w.log_tail()
    # the registry entries are gone (a closing worker leaves it): its id from its log
    found = re.search(r"Leased frontier \S+ on \S+, worker (\S+)", w2.log_text())
    assert found, w2.log_tail()
    second = found.group(1)
    assert second != first
    m = ID_RE.match(second)
    assert m and int(m["pid"]) == w2.pid, second
    assert f"Worker id {first} is alive in crawl {crawl_id} already: this worker is " \
           f"{second}" in w2.log_text()
    assert f"worker {second}" in w2.log_text() and f"worker {first}" in w1.log_text()
    assert "is alive in crawl" not in w1.log_text()
    # each worker claimed under its own id: its call keys, no reply of the other's
    assert r.exists(keys.call(first, "claim")) and r.exists(keys.call(second, "claim"))
    counts = fetched(site)
    assert set(counts) == {f"/p/{i}" for i in range(150)}
    assert set(counts.values()) == {1}, {p: c for p, c in counts.items() if c != 1}
    assert stat(r, crawl_id, "done") == 150 and stat(r, crawl_id, "dead") == 0
    items = start_worker.all_items()
    assert len(items) == 150
    assert {it["worker"] for it in items} == {"w1", "w2"}


# -- versions ------------------------------------------------------------------------


def _ranges(text: str) -> tuple[str, str]:
    scrapy_range = re.search(r"scrapy(>=[0-9.]+,<[0-9.]+)", text)
    redis_range = re.search(r"redis(>=[0-9.]+,<[0-9.]+)", text)
    assert scrapy_range and redis_range, text[:200]
    return scrapy_range.group(1), redis_range.group(1)


def test_pyproject_readme_and_compatibility_doc_state_one_range():
    pyproject = (REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8")
    declared = _ranges(re.search(r"dependencies = \[(.*?)\]", pyproject, re.S).group(1))
    for doc in ("README.md", "docs/compatibility.md"):
        assert _ranges((REPO_ROOT / doc).read_text(encoding="utf-8")) == declared, doc
    low = declared[0].split(",")[0][2:]
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert f"Scrapy {low} to" in readme
    compat = (REPO_ROOT / "docs/compatibility.md").read_text(encoding="utf-8")
    assert f"| {low} (oldest)" in compat
