"""CI's version check: a short real fleet on the Scrapy and redis-py of this interpreter.

    python tests/versions/fleet_check.py [--pages N]
    python tests/versions/fleet_check.py --oldest-pins   # scrapy==X redis==Y, for pip

Plain Python (no pytest): .ci/run runs it in a virtualenv with the oldest Scrapy and
redis-py that pyproject.toml allows, and in the main one (the newest). It starts a
private redis-server on a free port (tests/support/redis_server.py) and the local test
site (scrapy_leased/testing/site.py), then two ``scrapy crawl site`` workers of
tests/project (tests/support/workers.py). The second one sits on some of its claims
(their callbacks sleep) until it is killed with SIGKILL; a replacement is started, and the crawl
must end with every page done once in Redis and fetched, no dead letter, no lease or
queued request left, the killed worker's claims recovered, and both live workers closed
``finished`` with exit status 0. Exits 0 when all of that holds, else 1 with the reason
and the workers' log tails. Takes about 15 s.

The project's RecordPipeline is Scrapy 2.14+ style (no spider argument), so the workers
run with the add-on's UpsertPipeline only (every item stored once in the crawl's Redis).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import redis  # noqa: E402
import scrapy  # noqa: E402

from scrapy_leased.frontier.keys import CrawlKeys  # noqa: E402
from scrapy_leased.testing.site import Site  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402
from tests.support.workers import WorkerFactory, wait_for  # noqa: E402

LEASE = 2.0
SETTINGS: dict[str, Any] = {
    "LEASED_LEASE_SECONDS": LEASE, "LEASED_SWEEP_INTERVAL": 0.5, "CONCURRENT_REQUESTS": 4,
    # the project's RecordPipeline is Scrapy 2.14+ style; the add-on's UpsertPipeline
    # stores every item in the crawl's Redis (LEASED_UPSERT_*)
    "ITEM_PIPELINES": {}, "LEASED_UPSERT_ENABLED": True,
}
TIMEOUT = 90.0


class CheckFailed(AssertionError):
    pass


def check(ok: bool, what: str) -> None:
    if not ok:
        raise CheckFailed(what)


def worker_id(r: redis.Redis, keys: CrawlKeys, pid: int) -> str | None:
    for wid, info in r.hgetall(keys.worker_info).items():
        if json.loads(info).get("pid") == pid:
            return wid.decode()
    return None


def stat(r: redis.Redis, keys: CrawlKeys, name: str) -> int:
    return int(r.hget(keys.stats, name) or 0)


def run(pages: int, tmp: Path) -> str:
    srv = RedisServer(appendonly=False).start()
    site = Site(pages=pages).start()
    factory = WorkerFactory(tmp)
    try:
        r, keys, crawl = srv.client(), CrawlKeys("versions"), "versions"
        start = site.url + "/p/0"
        barrier = factory.barrier(2)
        w1 = factory(srv.url, crawl, start, settings={**SETTINGS, **barrier}, name="w1",
                     record=False)
        # the victim's callbacks of pages /p/1, /p/10-19, /p/100-199 sleep (not /p/0: it
        # may seed the crawl): it holds those claims until it is killed
        victim = factory(srv.url, crawl, start, settings={**SETTINGS, **barrier},
                         name="victim", record=False,
                         args={"slow_path": "/p/1", "slow_seconds": 120})
        wait_for(lambda: worker_id(r, keys, victim.pid) is not None, TIMEOUT,
                 "the victim registered", [w1, victim])
        vid = worker_id(r, keys, victim.pid)

        def held() -> int:
            return sum(1 for w in r.hvals(keys.owners) if w.decode() == vid)

        wait_for(lambda: held() >= 1 and stat(r, keys, "done") >= pages // 5, TIMEOUT,
                 "the victim holding claims while w1 crawls", [w1, victim])
        victim.kill9()
        check(victim.returncode == -9, f"victim exit status {victim.returncode}, not -9")
        held_at_kill = held()
        w2 = factory(srv.url, crawl, start, settings=SETTINGS, name="w2", record=False)
        for w in (w1, w2):
            rc = w.wait(TIMEOUT)
            check(rc == 0, f"worker {w.name} exited with {rc}")
            check(w.close_reason() == "finished",
                  f"worker {w.name} closed {w.close_reason()!r}, not 'finished'")
            log = w.log_text()
            check("Traceback" not in log and "] ERROR: " not in log,
                  f"worker {w.name} logged an error")
            check("Upserting items into" in log, f"worker {w.name}: no UpsertPipeline")
        fetched = {e["path"].split("?")[0] for e in site.log if e["status"] == 200}
        missing = {f"/p/{i}" for i in range(pages)} - fetched
        check(not missing, f"pages never fetched: {sorted(missing)[:10]}")
        done, dead = stat(r, keys, "done"), stat(r, keys, "dead")
        recovered = stat(r, keys, "recovered")
        check(done == pages, f"done {done}, not {pages}")
        check(dead == 0 and r.hlen(keys.dead) == 0, f"{dead} dead letters")
        check(r.zcard(keys.leases) == 0, f"{r.zcard(keys.leases)} leases left")
        records = {k.decode(): r.hlen(k) for k in r.scan_iter(match=keys.records("*"))}
        check(sum(records.values()) == pages, f"records {records}, not {pages} items")
        check(recovered >= held_at_kill > 0,
              f"recovered {recovered}, the victim held {held_at_kill} at the kill")
        return (f"{pages} pages done, {pages} records, 0 lost, 0 dead; the killed worker's {held_at_kill} "
                f"claims recovered ({recovered}); w1 and w2 finished")
    except (AssertionError, TimeoutError, RuntimeError):
        print(factory.report(), file=sys.stderr)
        raise
    finally:
        factory.cleanup()
        site.stop()
        srv.close()


def oldest_pins(pyproject: Path = REPO / "pyproject.toml") -> list[str]:
    """``scrapy==<lower bound>``, ``redis==<lower bound>`` and ``hiredis==<lower bound>``
    from pyproject.toml's dependencies: the oldest releases the package allows
    (``redis==8.1`` is 8.1.0)."""
    text = pyproject.read_text(encoding="utf-8")
    pins = []
    for name in ("scrapy", "redis", "hiredis"):
        found = re.search(rf'^\s*"{name}>=([0-9][0-9.]*)[,"]', text, re.M)
        if found is None:
            raise SystemExit(f"pyproject.toml: no lower bound for {name}")
        pins.append(f"{name}=={found.group(1)}")
    return pins


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=300)
    ap.add_argument("--oldest-pins", action="store_true",
                    help="print the pip requirements of the oldest Scrapy, redis-py and hiredis "
                         "pyproject.toml allows, and exit")
    opts = ap.parse_args(argv)
    if opts.oldest_pins:
        print(" ".join(oldest_pins()))
        return 0
    versions = (f"Scrapy {scrapy.__version__}, redis-py {redis.__version__}, hiredis "
                f"{importlib.metadata.version('hiredis')}")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="leased-fleet-check-") as tmp:
        try:
            summary = run(opts.pages, Path(tmp))
        except (CheckFailed, AssertionError, TimeoutError, RuntimeError) as exc:
            print(f"fleet check FAILED with {versions}: {exc}", file=sys.stderr)
            return 1
    print(f"fleet check passed with {versions} in {time.monotonic() - t0:.1f} s: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
