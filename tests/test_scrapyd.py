"""A fleet under Scrapyd, and runs without scrapy.cfg (issue #27 item 4).

- Without scrapy.cfg (Scrapyd eggs, ``SCRAPY_SETTINGS_MODULE=... scrapy crawl`` from
  another folder, a project installed as a package) the add-on stays on with
  LEASED_REDIS_URL, and 2 workers run one crawl; the embedded Redis's data directory is
  resolved only when it is used, and one that cannot be made is one clear error naming
  LEASED_EMBEDDED_DIR and LEASED_REDIS_URL.
- LEASED_RUN_GRACE: a worker that starts after the last worker of a run closed, within
  the grace, joins that run (start() skipped) instead of crawling the site again; its
  default is 30 s inside a Scrapyd job, 0 elsewhere (tests/test_rerun.py: a new
  ``scrapy crawl`` of a finished crawl starts afresh).
- Real Scrapyd (from PyPI) on a free port with its own eggs, logs and items dirs, the
  test project deployed with scrapyd-deploy (scrapyd-client, from PyPI) as an egg, the
  spider scheduled twice with schedule.json: one crawl, each page fetched once, the
  items of the two jobs add up to the site's pages, the start request sent once; the
  same with the second job scheduled after the first ended, 10 s after the first.

Real processes throughout: redis-server, the local test site, ``scrapy crawl`` workers
(tests/support/workers.py), scrapyd and its jobs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scrapy_leased.frontier.keys import CrawlKeys
from scrapy_leased.settings import LeasedConfig, in_scrapyd_job
from scrapy_leased.settings.defaults import SCRAPYD_RUN_GRACE_SECONDS
from scrapy_leased.testing.site import Site
from tests.support.process import terminate
from tests.support.redis_server import free_port
from tests.support.workers import PROJECT_DIR, REPO_ROOT, WorkerFactory, wait_for

PAGES = 30
WAIT = 120
FAST = {"LEASED_LEASE_SECONDS": 5, "LEASED_SWEEP_INTERVAL": 0.5, "LEASED_WORKER_TTL": 3}
DEFAULT = {"TESTPROJECT_DEFAULT_RESUME": "1"}  # LEASED_RESUME unset: the plugin's default


def page_paths(n: int) -> set[str]:
    return {f"/p/{i}" for i in range(n)}


def fetched(site: Site) -> dict[str, int]:
    """Page path -> times fetched (status 200)."""
    out: dict[str, int] = {}
    for e in site.log:
        if e["status"] == 200:
            path = e["path"].split("?")[0]
            out[path] = out.get(path, 0) + 1
    return out


def project_copy(root: Path, *, cfg: bool) -> Path:
    """A copy of tests/project (its testproject package), with or without scrapy.cfg."""
    shutil.copytree(PROJECT_DIR, root, ignore=shutil.ignore_patterns(".scrapy", "__pycache__"))
    if not cfg:
        (root / "scrapy.cfg").unlink()
    return root


# -- no scrapy.cfg ---------------------------------------------------------------------


def test_two_workers_without_scrapy_cfg_from_another_folder_run_one_crawl(
        redis_server, make_site, tmp_path, crawl_id):
    """``SCRAPY_SETTINGS_MODULE=testproject.settings scrapy crawl`` from an empty folder,
    the project importable from elsewhere and no scrapy.cfg anywhere, LEASED_REDIS_URL
    set: 2 workers run as one fleet (one seeds, the other skips start()), every page is
    fetched once, and nothing is created in either folder (no .scrapy/)."""
    project = project_copy(tmp_path / "installed", cfg=False)
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    factory = WorkerFactory(tmp_path / "logs", project_dir=cwd)
    factory.tmp_path.mkdir()
    site = make_site(pages=PAGES)
    env = {"SCRAPY_SETTINGS_MODULE": "testproject.settings",
           "PYTHONPATH": os.pathsep.join([str(project), str(REPO_ROOT)])}
    try:
        barrier = factory.barrier(2)
        workers = [factory(redis_server.url, crawl_id, site.page_url(0), name=f"w{i}",
                           settings={**FAST, **barrier}, env=env) for i in range(2)]
        for w in workers:
            assert w.wait(WAIT) == 0, w.log_tail(60)
            assert w.close_reason() == "finished", w.log_tail(60)
            log = w.log_text()
            assert "Leased frontier" in log, w.log_tail(60)
            assert "Disabled scrapy_leased" not in log and "scrapy.cfg" not in log
            assert "Start barrier: all 2 workers arrived" in log, w.log_tail(60)
        seeded = [w for w in workers if w.stats().get("leased/seeded")]
        skipped = [w for w in workers if w.stats().get("leased/start_skipped")]
        assert len(seeded) == 1 and len(skipped) == 1, [w.stats() for w in workers]
        assert fetched(site) == dict.fromkeys(page_paths(PAGES), 1)
        assert {it["url"] for it in factory.all_items()} == {
            site.page_url(i) for i in range(PAGES)}
        assert list(cwd.iterdir()) == []
        assert not (project / ".scrapy").exists()
    finally:
        factory.cleanup()


def test_an_embedded_redis_that_cannot_be_placed_is_one_clear_error(tmp_path, make_site):
    """No LEASED_REDIS_URL and a LEASED_EMBEDDED_DIR that cannot be created (under a
    file): the worker exits with status 1 and one CRITICAL line naming the directory,
    LEASED_EMBEDDED_DIR and LEASED_REDIS_URL, without a traceback."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    factory = WorkerFactory(tmp_path / "logs")
    factory.tmp_path.mkdir()
    site = make_site(pages=3)
    try:
        w = factory(None, "embedded-nowhere", site.page_url(0), record=False,
                    settings={"LEASED_EMBEDDED_DIR": str(blocker / "redis")})
        assert w.wait(WAIT) == 1, w.log_tail(40)
        log = w.log_text()
        lines = [line for line in log.splitlines() if "CRITICAL" in line]
        assert len(lines) == 1, w.log_tail(40)
        assert str(blocker / "redis") in lines[0], lines
        assert "LEASED_EMBEDDED_DIR" in lines[0] and "LEASED_REDIS_URL" in lines[0], lines
        assert "Traceback" not in log, w.log_tail(40)
        assert site.log == []
    finally:
        factory.cleanup()


# -- LEASED_RUN_GRACE ------------------------------------------------------------------


def test_run_grace_default_is_30_s_only_inside_a_scrapyd_job(monkeypatch):
    from scrapy.settings import Settings

    for name in ("SCRAPYD_EGG_VERSION", "SCRAPY_JOB"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sys, "argv", ["scrapy", "crawl", "site", "-a", "start_url=x"])
    assert not in_scrapyd_job()
    assert LeasedConfig.from_settings(Settings()).run_grace == 0
    assert LeasedConfig.from_settings(Settings({"LEASED_RUN_GRACE": 7})).run_grace == 7
    monkeypatch.setattr(sys, "argv", ["scrapyd.runner", "crawl", "site", "-a", "_job=ab12"])
    assert in_scrapyd_job()
    assert LeasedConfig.from_settings(Settings()).run_grace == SCRAPYD_RUN_GRACE_SECONDS == 30
    assert LeasedConfig.from_settings(Settings({"LEASED_RUN_GRACE": 0})).run_grace == 0
    monkeypatch.setattr(sys, "argv", ["scrapy"])
    monkeypatch.setenv("SCRAPYD_EGG_VERSION", "1700000000")
    assert in_scrapyd_job()
    from scrapy_leased.settings import LeasedConfigError

    with pytest.raises(LeasedConfigError, match="LEASED_RUN_GRACE"):
        LeasedConfig.from_settings(Settings({"LEASED_RUN_GRACE": -1}))


def test_run_leave_keeps_a_seeded_run_joinable_for_the_grace(redis_server, crawl_id):
    """lua/run_leave.lua with a grace: the last worker of a seeded run leaves it 'ended'
    for the grace; a worker joining it is told SEEDED (skips start()) and the run is on
    again ('seeded'), so no fresh start flushes it; a run left before start() was
    exhausted ends at once (the next worker seeds it); with no grace the run ends.
    Neither a finished crawl's fresh start nor LEASED_FLUSH_ON_START flushes an ended
    run within its grace."""
    import asyncio

    from scrapy_leased._redis.connection import make_client
    from scrapy_leased.frontier.run import ENDED_MARKER, SEED, SEEDED, RunMarker

    r = redis_server.client()
    keys = CrawlKeys(crawl_id)

    async def main() -> None:
        client = make_client(redis_server.url)
        try:
            def marker(worker: str, grace_ms: int) -> RunMarker:
                return RunMarker(client, keys, worker, 30_000, 30_000, grace_ms)

            a = marker("a", 20_000)
            assert await a.join() == SEED and await a.seeded()
            assert await a.leave()
            assert r.get(keys.run) == b"ended" and 0 < r.pttl(keys.run) <= 20_000
            fresh = await marker("b", 20_000).fresh_run("records", only_if_finished=True)
            assert fresh.deleted is None and fresh.alive == [ENDED_MARKER]
            # LEASED_FLUSH_ON_START waits too
            assert await marker("b", 20_000).flush("records") == (None, [ENDED_MARKER])
            b = marker("b", 20_000)
            assert await b.join() == SEEDED
            assert r.get(keys.run) == b"seeded" and r.pttl(keys.run) > 20_000
            assert await b.leave() and r.get(keys.run) == b"ended"
            c = marker("c", 0)  # no grace: the ended run is still joined...
            assert await c.join() == SEEDED
            assert await c.leave() and not r.exists(keys.run)  # ...and ends for good
            d = marker("d", 20_000)  # left while seeding: not kept
            assert await d.join() == SEED
            assert await d.leave() and not r.exists(keys.run)
            assert await marker("e", 20_000).join() == SEED
        finally:
            await client.aclose()

    asyncio.run(main())


def test_a_run_that_ends_between_a_workers_check_and_its_join(redis_server, crawl_id):
    """Without a grace: worker b finds a's run on (no fresh start), then a, the last
    worker, closes and the run ends before b joins; b begins a new run (SEED), and its
    second fresh-start check (the scheduler's, after a SEED where a run was on) may now
    start the finished crawl afresh: run_flush.lua takes a marker naming its caller for
    no run on. Another live worker still keeps it from flushing."""
    import asyncio

    from scrapy_leased._redis.connection import make_client
    from scrapy_leased.frontier.run import SEED, RunMarker

    r = redis_server.client()
    keys = CrawlKeys(crawl_id)

    async def main() -> None:
        client = make_client(redis_server.url)
        try:
            def marker(worker: str) -> RunMarker:
                return RunMarker(client, keys, worker, 30_000, 30_000, 0)

            a, b = marker("a"), marker("b")
            assert await a.join() == SEED and await a.seeded()
            r.hset(keys.stats, "done", 5)
            on = await b.fresh_run("records", only_if_finished=True)
            assert on.deleted is None and on.alive == ["a"]
            assert await a.leave() and not r.exists(keys.run)
            assert await b.join() == SEED  # a new run; b is its seeder
            c = marker("c")
            now_s, now_us = r.time()
            r.zadd(keys.workers, {"c": now_s * 1000 + now_us // 1000})  # c alive
            held = await b.fresh_run("records", only_if_finished=True)
            assert held.deleted is None and held.alive == ["c"]
            r.zrem(keys.workers, "c")
            fresh = await b.fresh_run("records", only_if_finished=True)
            assert fresh.deleted is not None and fresh.done_before == 5
            assert r.get(keys.run) == b"b" and not r.hget(keys.stats, "done")
            assert await c.join() != SEED  # b seeds the fresh run
        finally:
            await client.aclose()

    asyncio.run(main())


def test_a_worker_starting_within_the_grace_joins_the_run_that_ended(
        redis_server, make_site, start_worker, crawl_id):
    """LEASED_RUN_GRACE = 60: a second worker started after the first one finished (no
    overlap) joins its run: start() skipped, nothing fetched again, `finished`; with the
    grace over (the marker's expiry cut short), the next one starts afresh (issue 25's
    rule) and crawls the site again."""
    site = make_site(pages=PAGES)
    grace = {**FAST, "LEASED_RUN_GRACE": 60}
    first = start_worker(redis_server.url, crawl_id, site.page_url(0), name="first",
                         settings=grace, env=DEFAULT)
    assert first.wait(WAIT) == 0 and first.close_reason() == "finished", first.log_tail(60)
    r = redis_server.client()
    run = CrawlKeys(crawl_id).run
    assert r.get(run) == b"ended" and r.pttl(run) > 0
    assert fetched(site) == dict.fromkeys(page_paths(PAGES), 1)
    second = start_worker(redis_server.url, crawl_id, site.page_url(0), name="second",
                          settings=grace, env=DEFAULT)
    assert second.wait(WAIT) == 0 and second.close_reason() == "finished", \
        second.log_tail(60)
    assert second.stats().get("leased/start_skipped") == 1, second.stats()
    assert not second.stats().get("leased/seeded")
    assert "joining its run that ended" in second.log_text(), second.log_tail(60)
    assert "afresh" not in second.log_text()
    assert fetched(site) == dict.fromkeys(page_paths(PAGES), 1)  # nothing again
    assert second.items() == []
    assert r.get(run) == b"ended"  # the grace counts again from its close
    r.pexpire(run, 1)  # the grace over
    wait_for(lambda: not r.exists(run), 10, "the run marker expired")
    third = start_worker(redis_server.url, crawl_id, site.page_url(0), name="third",
                         settings=grace, env=DEFAULT)
    assert third.wait(WAIT) == 0 and third.close_reason() == "finished", third.log_tail(60)
    assert third.stats().get("leased/seeded") == 1
    assert fetched(site) == dict.fromkeys(page_paths(PAGES), 2)  # a new crawl


# -- real Scrapyd ----------------------------------------------------------------------


def _bin(name: str) -> str:
    path = Path(sys.executable).parent / name
    found = str(path) if path.exists() else shutil.which(name)
    if not found:
        pytest.fail(f"{name} not installed: pip install -e '.[test]'")
    return found


class Scrapyd:
    """A scrapyd process on a free port, everything under ``root``; the test project
    deployed to it as an egg by scrapyd-deploy."""

    PROJECT = "testproject"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.items_dir = root / "items"
        self.logs_dir = root / "logs"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Scrapyd:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "scrapyd.conf").write_text(f"""[scrapyd]
bind_address = 127.0.0.1
http_port = {self.port}
eggs_dir = {self.root / "eggs"}
logs_dir = {self.logs_dir}
items_dir = {self.items_dir}
dbs_dir = {self.root / "dbs"}
max_proc = 4
poll_interval = 1.0
jobs_to_keep = 100
""")
        env = {k: v for k, v in os.environ.items() if not k.startswith("SCRAPY")}
        env["PYTHONPATH"] = str(REPO_ROOT)
        env.update(DEFAULT)
        self.out = open(self.root / "scrapyd.out", "wb")  # closed in stop()
        # cwd: the scrapyd folder, where no scrapy.cfg is (as on a Scrapyd server)
        self.proc = subprocess.Popen([_bin("scrapyd")], cwd=self.root, env=env,
                                     stdout=self.out, stderr=subprocess.STDOUT)
        wait_for(self._up, 60, "scrapyd answering daemonstatus.json")
        return self

    def _up(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"scrapyd exited: {self.output()}")
        try:
            return self.get("daemonstatus.json")["status"] == "ok"
        except (OSError, urllib.error.URLError):
            return False

    def output(self) -> str:
        return (self.root / "scrapyd.out").read_text(errors="replace")[-4000:]

    def get(self, path: str, **params: str) -> Any:
        url = self.url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        with urllib.request.urlopen(url, timeout=30) as resp:
            return json.loads(resp.read())

    def post(self, path: str, fields: list[tuple[str, str]]) -> Any:
        data = urllib.parse.urlencode(fields).encode()
        with urllib.request.urlopen(self.url + path, data=data, timeout=30) as resp:
            out = json.loads(resp.read())
        assert out.get("status") == "ok", out
        return out

    def deploy(self) -> None:
        """scrapyd-deploy of a copy of tests/project (its scrapy.cfg gets a [deploy]
        target): builds the egg (setup.py written by scrapyd-deploy) and uploads it."""
        folder = project_copy(self.root / "build" / "project", cfg=True)
        (folder / "scrapy.cfg").write_text(
            "[settings]\ndefault = testproject.settings\n\n"
            f"[deploy]\nurl = {self.url}\nproject = {self.PROJECT}\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("SCRAPY")}
        env["PYTHONPATH"] = str(REPO_ROOT)
        done = subprocess.run([_bin("scrapyd-deploy")], cwd=folder, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        spiders = self.get("listspiders.json", project=self.PROJECT)
        assert "site" in spiders["spiders"], spiders

    def schedule(self, settings: dict[str, Any], **args: str) -> str:
        fields = [("project", self.PROJECT), ("spider", "site")]
        fields += [("setting", f"{k}={v}") for k, v in settings.items()]
        fields += list(args.items())
        return str(self.post("schedule.json", fields)["jobid"])

    def jobs(self) -> dict[str, dict[str, Any]]:
        """job id -> its listjobs.json entry, with its "state"."""
        out: dict[str, dict[str, Any]] = {}
        listing = self.get("listjobs.json", project=self.PROJECT)
        for state in ("pending", "running", "finished"):
            for job in listing[state]:
                out[job["id"]] = {**job, "state": state}
        return out

    def wait_finished(self, *job_ids: str, timeout: float = WAIT) -> dict[str, dict[str, Any]]:
        def done() -> bool:
            jobs = self.jobs()
            return all(jobs.get(j, {}).get("state") == "finished" for j in job_ids)

        wait_for(done, timeout, f"scrapyd jobs {job_ids} finished")
        return self.jobs()

    def log(self, job_id: str) -> str:
        return (self.logs_dir / self.PROJECT / "site" / f"{job_id}.log").read_text(
            errors="replace")

    def items(self, job_id: str) -> list[dict[str, Any]]:
        path = self.items_dir / self.PROJECT / "site" / f"{job_id}.jl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def stop(self) -> None:
        terminate(self.proc, 30)
        if self.proc is not None:
            self.out.close()


@pytest.fixture(scope="module")
def scrapyd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scrapyd]:
    server = Scrapyd(tmp_path_factory.mktemp("scrapyd")).start()
    try:
        server.deploy()
        yield server
    finally:
        server.stop()


STAT_RE = re.compile(r"'(?P<key>[^']+)': (?P<val>'[^']*'|-?\d+(?:\.\d+)?)[,}]")


def job_stats(log: str) -> dict[str, Any]:
    """The scalar stats (numbers, strings) of the final stats dump in a job's log."""
    head = "Dumping Scrapy stats:"
    assert head in log, log[-3000:]
    block = log.rsplit(head, 1)[1]
    block = block[: block.find("}") + 1]
    out: dict[str, Any] = {}
    for m in STAT_RE.finditer(block):
        v = m.group("val")
        out[m.group("key")] = v[1:-1] if v.startswith("'") else float(v) if "." in v else int(v)
    return out


def url_paths(items: list[dict[str, Any]]) -> list[str]:
    return sorted(urllib.parse.urlsplit(it["url"]).path for it in items)


def plain_items(start_worker: WorkerFactory, make_site: Any) -> list[str]:
    """The item URL paths of a plain Scrapy run (no add-on) of the same spider on a site
    like the test's."""
    site = make_site(pages=PAGES)
    w = start_worker(None, None, site.page_url(0), name="plain",
                     env={"TESTPROJECT_NO_ADDON": "1"})
    assert w.wait(WAIT) == 0 and w.close_reason() == "finished", w.log_tail(40)
    assert "Leased frontier" not in w.log_text()
    return url_paths(w.items())


def check_one_crawl(scrapyd: Scrapyd, site: Site, jobs: list[str],
                    plain: list[str] | None = None) -> list[dict[str, Any]]:
    """Both jobs `finished` on the leased frontier, one crawl: each page fetched once,
    the start request once, the items of all jobs add up to the site's pages once each
    (and to ``plain``, a plain run's items), exactly one job seeded the run. Returns the
    jobs' stats."""
    stats = []
    for job in jobs:
        log = scrapyd.log(job)
        assert "Leased frontier" in log, log[-3000:]
        assert "Disabled scrapy_leased" not in log, log[-3000:]
        assert "Traceback" not in log, log[-3000:]
        s = job_stats(log)
        assert s.get("finish_reason") == "finished", s
        stats.append(s)
    assert fetched(site) == dict.fromkeys(page_paths(PAGES), 1)
    items = [it for job in jobs for it in scrapyd.items(job)]
    assert sorted(it["url"] for it in items) == sorted(site.page_url(i) for i in range(PAGES))
    if plain is not None:
        assert url_paths(items) == plain
    assert sum(1 for s in stats if s.get("leased/seeded")) == 1, stats
    return stats


def test_scrapyd_schedule_twice_is_one_crawl(scrapyd, redis_server, make_site, crawl_id,
                                             start_worker):
    """schedule.json twice at once: 2 jobs, one crawl, start request sent once, the
    items of the two jobs add up to the plain run's item set (every page once)."""
    plain = plain_items(start_worker, make_site)
    assert plain == sorted(page_paths(PAGES))
    site = make_site(pages=PAGES, delay=0.05)
    settings = {"LEASED_REDIS_URL": redis_server.url, "LEASED_CRAWL_ID": crawl_id,
                "CONCURRENT_REQUESTS": 4, **FAST}
    jobs = [scrapyd.schedule(settings, start_url=site.page_url(0), worker=f"job{i}")
            for i in range(2)]
    scrapyd.wait_finished(*jobs)
    check_one_crawl(scrapyd, site, jobs, plain)
    # inside Scrapyd's jobs the run's grace is 30 s by default: the last job to close
    # leaves the run joinable that long
    said = [line for job in jobs for line in scrapyd.log(job).splitlines()
            if "Last worker of this run of the crawl: the run ended" in line]
    # (both jobs, when the second started after the first had closed)
    assert said and all("LEASED_RUN_GRACE (30s)" in line for line in said), said
    r = redis_server.client()
    assert r.get(CrawlKeys(crawl_id).run) == b"ended"
    assert 0 < r.pttl(CrawlKeys(crawl_id).run) <= 30_000


def test_scrapyd_second_job_after_the_first_ended_joins_its_run(scrapyd, redis_server,
                                                                 make_site, crawl_id):
    """The second job scheduled 10 s after the first, once the first has ended (no
    overlap: the case where workers used to make a run each and crawl the site twice):
    it joins the run within the grace, skips start(), fetches nothing again; one crawl.
    The grace is set to 120 s here, not left at Scrapyd's default of 30 s (checked by
    the test above), so that a slow start of the second job on a loaded machine cannot
    outlast it."""
    site = make_site(pages=PAGES)
    settings = {"LEASED_REDIS_URL": redis_server.url, "LEASED_CRAWL_ID": crawl_id, **FAST,
                "LEASED_RUN_GRACE": 120}
    scheduled = time.monotonic()
    first = scrapyd.schedule(settings, start_url=site.page_url(0), worker="first")
    scrapyd.wait_finished(first)
    wait_for(lambda: time.monotonic() - scheduled >= 10, 30, "10 s since the first job")
    second = scrapyd.schedule(settings, start_url=site.page_url(0), worker="second")
    jobs = scrapyd.wait_finished(first, second)
    assert jobs[first]["end_time"] <= jobs[second]["start_time"], jobs  # no overlap
    stats = check_one_crawl(scrapyd, site, [first, second])
    assert stats[0].get("leased/seeded") == 1 and stats[1].get("leased/start_skipped") == 1
    assert "joining its run that ended less than LEASED_RUN_GRACE (120s)" in \
        scrapyd.log(second), scrapyd.log(second)[-3000:]
    assert scrapyd.items(second) == []
