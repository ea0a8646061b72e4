#!/usr/bin/env python3
"""The demo: a fleet of three workers surviving a kill -9, in one command.

    python example_project/demo.py            # 5,000 pages, 3 workers, one kill -9

1. Starts the test site (scrapy_leased.testing.site: 5,000 pages, spread over 3 hosts
   127.0.0.1-3 on Linux; every request logged with its time and User-Agent).
2. Starts three `scrapy crawl pages` workers of this project, each with its own
   User-Agent, on one crawl in Redis (LEASED_REDIS_URL, else the embedded Redis).
3. Shows live progress; at 30% done kills worker w2 with kill -9, notes the leases it
   held, and restarts it a second later.
4. Waits until the fleet drained the crawl and every worker exited, then reports:
   done == 5,000 exactly; the killed worker's in-flight requests came back after their
   lease expired (with the times); no page fetched twice except those in flight at the
   kill; the highest request rate per host in any window.

Exit status 0 when every check passed. `--report FILE` writes the report as JSON.

How the killed worker's leases are told apart: each live worker renews all its leases
at every heartbeat (LEASED_RENEW_INTERVAL, 1 s here), setting their deadline to the
renewal time + the lease. Once every survivor has renewed after the kill (T), the
leases whose deadline is still at most T + lease are exactly those of the dead worker.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
try:
    import scrapy_leased  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO))

import redis.asyncio as aioredis  # noqa: E402

from scrapy_leased._redis.embedded import (  # noqa: E402
    ensure_embedded_redis,
    running_embedded_redis,
    stop_embedded_redis,
)
from scrapy_leased.fleet import FleetAdmin, Lease, Snapshot  # noqa: E402
from scrapy_leased.frontier.keys import CrawlKeys  # noqa: E402
from scrapy_leased.ratelimit.stamp import BUDGET_STAMP_MIDDLEWARES  # noqa: E402
from scrapy_leased.settings import parse_rate  # noqa: E402
from scrapy_leased.testing.process import SiteProcess, read_log  # noqa: E402

RENEW_SECONDS = 1.0  # LEASED_RENEW_INTERVAL of the workers (heartbeat)
POLL_SECONDS = 0.2  # how often the driver reads Redis
FAST_POLL_SECONDS = 0.01  # ... around the killed worker's lease deadlines
IDENTIFY_AFTER_MS = int(RENEW_SECONDS * 2000) + 500  # every survivor renewed by then
MAX_FREEZES = 20  # a frozen victim holding no lease is thawed and frozen again later
PRINT_SECONDS = 1.0  # one progress line per second


def plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def ts(ms_or_s: float) -> str:
    """Local wall-clock time with milliseconds (ms if the value looks like ms)."""
    s = ms_or_s / 1000 if ms_or_s > 1e11 else ms_or_s
    return time.strftime("%H:%M:%S", time.localtime(s)) + f".{int(s * 1000) % 1000:03d}"


@dataclass
class Worker:
    name: str
    user_agent: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    started: float = field(default_factory=time.time)


@dataclass
class Victim:
    worker: Worker
    frozen_ms: int | None = None  # Redis time just after its SIGSTOP
    killed_ms: int | None = None  # Redis time just after its kill -9
    tries: int = 0  # freezes (a freeze that finds it holding nothing is undone)
    refreeze_at: float = 0.0
    held_at_heartbeat: int | None = None  # its in-flight count at its last renewal
    last_heartbeat_ms: int | None = None
    leases: list[Lease] = field(default_factory=list)
    recovered_ms: dict[int, int] = field(default_factory=dict)  # token -> first seen gone


class Demo:
    def __init__(self, opts: argparse.Namespace) -> None:
        self.opts = opts
        self.out = Path(opts.out or HERE / ".demo" / time.strftime("%Y%m%d-%H%M%S"))
        self.out.mkdir(parents=True, exist_ok=True)
        self.lease_ms = int(opts.lease * 1000)
        self.workers: list[Worker] = []
        self.site: SiteProcess | None = None
        self.victim: Victim | None = None
        self.restarted = False
        self.embedded_dir: Path | None = None
        self.started_redis = False
        self.url = ""

    # -- setup -----------------------------------------------------------------------

    def redis_url(self) -> str:
        url = self.opts.redis_url or os.environ.get("LEASED_REDIS_URL")
        if url:
            return url
        self.embedded_dir = Path(self.opts.embedded_dir or HERE / ".scrapy" / "leased-redis")
        self.started_redis = running_embedded_redis(self.embedded_dir) is None
        url = ensure_embedded_redis(self.embedded_dir)
        print(f"Redis: embedded, {url} ({'started' if self.started_redis else 'running'}; "
              f"LEASED_REDIS_URL is not set)")
        return url

    def start_worker(self, name: str) -> Worker:
        ua = f"leased-demo-{name}"
        settings = {
            "USER_AGENT": ua,
            "LEASED_CRAWL_ID": self.opts.crawl_id,
            "LEASED_LEASE_SECONDS": self.opts.lease,
            "LEASED_RENEW_INTERVAL": RENEW_SECONDS,
            "LEASED_LOGSTATS_INTERVAL": 5,
            "CONCURRENT_REQUESTS": self.opts.concurrency,
            # each request carries when it took its rate budget: the report checks the
            # budget on those times (Redis's clock), not on arrivals at the site
            "DOWNLOADER_MIDDLEWARES": json.dumps(BUDGET_STAMP_MIDDLEWARES),
        }
        settings["LEASED_RATE"] = self.opts.rate or ""  # "": no budget
        settings["LEASED_RATE_BURST"] = self.opts.burst
        if self.embedded_dir is None:
            settings["LEASED_REDIS_URL"] = self.url
        else:
            settings["LEASED_EMBEDDED_DIR"] = str(self.embedded_dir)
        assert self.site is not None
        cmd = [sys.executable, "-m", "scrapy", "crawl", "pages", "-a", f"site={self.site.url}"]
        for key, value in settings.items():
            cmd += ["-s", f"{key}={value}"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("SCRAPY_")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        log_path = self.out / f"{name}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(cmd, cwd=HERE, env=env, stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        worker = Worker(name, ua, proc, log_path)
        self.workers.append(worker)
        return worker

    # -- the run ---------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        opts = self.opts
        url = self.url = self.redis_url()
        client = aioredis.from_url(url, socket_connect_timeout=5, socket_timeout=30)
        admin = FleetAdmin(client, CrawlKeys(opts.crawl_id), lease_ms=self.lease_ms)
        try:
            await self.fresh_crawl(admin)
            self.site = SiteProcess(pages=opts.pages, log_path=self.out / "site.jsonl",
                                    ports=opts.hosts, distinct_hosts=opts.hosts > 1,
                                    spread=opts.hosts > 1, delay=opts.delay).start()
            print(f"Site: {opts.pages:,} pages on {', '.join(self.site.urls)} "
                  f"(log {self.site.log_path})")
            for i in range(opts.workers):
                w = self.start_worker(f"w{i + 1}")
                print(f"Started worker {w.name} (pid {w.proc.pid}, User-Agent {w.user_agent})")
            print(f"Crawl {opts.crawl_id!r}: lease {opts.lease:g} s, heartbeat "
                  f"{RENEW_SECONDS:g} s; kill -9 of w2 at {opts.kill_at:.0%} done\n")
            final = await self.watch(admin)
            return self.report(final)
        finally:
            self.cleanup()
            await client.aclose()
            if self.started_redis and not opts.keep_redis and self.embedded_dir is not None:
                stop_embedded_redis(self.embedded_dir)
                print("Stopped the embedded Redis this run started (--keep-redis keeps it).")

    async def fresh_crawl(self, admin: FleetAdmin) -> None:
        if not await admin.exists():
            return
        snap = await admin.snapshot(memory=False)
        alive = [w for w in snap.workers if w.alive and not w.process_gone()]
        if alive:
            raise SystemExit(f"crawl {self.opts.crawl_id!r} has {len(alive)} live workers "
                             f"({', '.join(w.id for w in alive)}): stop them, or pass another "
                             f"--crawl-id")
        deleted, _ = await admin.reset()
        print(f"Reset crawl {self.opts.crawl_id!r}: deleted {deleted:,} keys of a previous run")

    async def watch(self, admin: FleetAdmin) -> Snapshot:
        opts = self.opts
        t0 = time.monotonic()
        last_print, last_done, last_t = 0.0, 0, t0
        while True:
            now = time.monotonic()
            if now - t0 > opts.timeout:
                raise SystemExit(f"timed out after {opts.timeout:.0f} s; logs in {self.out}")
            snap = await admin.snapshot(memory=False)
            if self.victim is None and snap.done >= opts.kill_at * opts.pages:
                await self.freeze(admin, snap)
            elif self.victim is not None:
                await self.follow_victim(admin, snap)
            running = [w for w in self.workers if w.proc.poll() is None]
            if now - last_print >= PRINT_SECONDS or not running:
                rate = (snap.done - last_done) / max(now - last_t, 1e-6)
                print(f"{now - t0:6.1f} s  todo {snap.todo:>5,}  processing {snap.processing:>3}"
                      f"  done {snap.done:>5,}/{opts.pages:,}  dead {snap.dead}  workers "
                      f"{snap.workers_alive}  {rate:>5.0f} pages/s", flush=True)
                last_print, last_done, last_t = now, snap.done, now
            if not running and self.restarted:
                return await admin.snapshot(memory=False)
            if not running and (self.victim is None or self.victim.killed_ms is None):
                raise SystemExit(f"the crawl ended before the kill at {opts.kill_at:.0%} done; "
                                 f"see {self.out}")
            for w in self.workers:
                if w.proc.poll() not in (None, 0) and w is not getattr(self.victim, "worker", None):
                    raise SystemExit(f"worker {w.name} failed (exit {w.proc.returncode}); "
                                     f"see {w.log_path}")
            await asyncio.sleep(self.poll_delay())

    def poll_delay(self) -> float:
        """Poll often around the killed worker's lease deadlines, to time their return."""
        v = self.victim
        pending = [le.deadline_ms for le in v.leases if le.token not in v.recovered_ms] \
            if v is not None else []
        if pending and time.time() * 1000 >= min(pending) - 500:
            return FAST_POLL_SECONDS
        return POLL_SECONDS

    async def freeze(self, admin: FleetAdmin, snap: Snapshot) -> None:
        """SIGSTOP the victim: from now on it does nothing, exactly as if it had died."""
        v = self.victim
        if v is None:
            v = self.victim = Victim(self.workers[1])
        pid = v.worker.proc.pid
        os.kill(pid, signal.SIGSTOP)
        sec, usec = await admin.client.time()
        v.frozen_ms = int(sec) * 1000 + int(usec) // 1000
        v.tries += 1
        for state in snap.workers:
            if f":{pid}:" in state.id:
                v.held_at_heartbeat = state.inflight
                v.last_heartbeat_ms = state.heartbeat_ms

    async def follow_victim(self, admin: FleetAdmin, snap: Snapshot) -> None:
        v = self.victim
        assert v is not None
        if v.killed_ms is None:
            if v.frozen_ms is None:
                if time.monotonic() >= v.refreeze_at:
                    await self.freeze(admin, snap)
                return
            if snap.now_ms < v.frozen_ms + IDENTIFY_AFTER_MS:
                return
            # Every survivor renewed its leases since the freeze: the leases whose
            # deadline is still at most freeze time + lease are the victim's.
            _, leases = await admin.leases()
            mine = [le for le in leases if le.deadline_ms <= v.frozen_ms + self.lease_ms]
            if not mine and v.tries < MAX_FREEZES:
                os.kill(v.worker.proc.pid, signal.SIGCONT)  # holds nothing: try again
                v.frozen_ms, v.refreeze_at = None, time.monotonic() + 0.3
                return
            v.worker.proc.kill()  # kill -9
            v.worker.proc.wait()
            sec, usec = await admin.client.time()
            v.killed_ms = int(sec) * 1000 + int(usec) // 1000
            v.leases = mine
            deadlines = [le.deadline_ms for le in mine] or [v.killed_ms]
            print(f"  >>> kill -9 {v.worker.name} (pid {v.worker.proc.pid}) at "
                  f"{ts(v.killed_ms)}, holding {plural(len(mine), 'lease')} (frozen since "
                  f"{ts(v.frozen_ms)}; lease deadlines {ts(min(deadlines))} - "
                  f"{ts(max(deadlines))})", flush=True)
            return
        if not self.restarted and snap.now_ms - v.killed_ms >= self.opts.restart_after * 1000:
            w = self.start_worker(f"{v.worker.name}-restarted")
            self.restarted = True
            print(f"  >>> restarted {v.worker.name} as {w.name} (pid {w.proc.pid})", flush=True)
        pending = [le.token for le in v.leases if le.token not in v.recovered_ms]
        if pending:
            redis_now, left = await admin.lease_deadlines(pending)
            gone = [t for t, d in zip(pending, left) if d is None]
            for token in gone:
                v.recovered_ms[token] = redis_now
            if gone:
                print(f"  >>> {len(gone)} of {v.worker.name}'s leases expired and were "
                      f"requeued (seen at {ts(redis_now)})", flush=True)

    def cleanup(self) -> None:
        for w in self.workers:
            if w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait()
        if self.site is not None:
            self.site.stop()

    # -- the report ------------------------------------------------------------------

    def report(self, final: Snapshot) -> dict[str, Any]:
        opts = self.opts
        v = self.victim
        assert v is not None and self.site is not None
        assert v.killed_ms is not None and v.frozen_ms is not None
        entries = read_log(self.site.log_path)
        ua_name = {w.user_agent: w.name for w in self.workers}
        fetches: dict[str, list[tuple[float, str]]] = defaultdict(list)
        for e in entries:
            path = e["path"].split("?", 1)[0]
            if path.startswith("/p/") and e["status"] == 200:
                fetches[path].append((e["t"], ua_name.get(e["user_agent"], e["user_agent"])))
        twice = {p: len(f) for p, f in fetches.items() if len(f) > 1}
        victim_paths = {}
        for le in v.leases:
            url = json.loads(le.envelope.payload)["u"] if le.envelope else None
            if url:
                victim_paths[urlsplit(url).path] = le
        unexpected = sorted(set(twice) - set(victim_paths))

        returned = []
        for path, le in sorted(victim_paths.items(), key=lambda kv: kv[1].deadline_ms):
            recovered = v.recovered_ms.get(le.token)
            fetched = sorted(fetches.get(path, []))
            after = [f for f in fetched if f[0] * 1000 >= le.deadline_ms]
            returned.append({
                "url": path, "token": le.token, "deadline": le.deadline_ms / 1000,
                "recovered": recovered / 1000 if recovered else None,
                "fetches": [{"t": t, "worker": name} for t, name in fetched],
                "refetched_after_deadline": bool(after),
                "ok": bool(recovered and recovered >= le.deadline_ms and after),
            })

        rates = per_host_rates(entries, opts.window)
        budget = None
        if opts.rate:
            b = parse_rate(opts.rate, opts.burst, "--rate")
            budget = {"rate": opts.rate, "burst": b.burst, "interval_ms": b.interval_ms,
                      "allowed_in_window": b.burst + int(opts.window * 1000 // b.interval_ms)}
        checks = {
            "done_exact": final.done == opts.pages,
            "every_page_fetched": len(fetches) == opts.pages,
            "no_dead_letters": final.dead == 0,
            "killed_worker_held_leases": bool(v.leases),
            "leases_came_back_after_expiry": bool(returned) and all(r["ok"] for r in returned)
            and final.totals.get("recovered", 0) == len(returned),
            "no_page_twice_except_in_flight_at_kill": not unexpected,
            "rate_within_budget": budget is None or all(
                x["unstamped"] == 0 and x["max_taken_in_window"] <= budget["allowed_in_window"]
                for x in rates.values()),
        }
        report = {
            "pages": opts.pages, "done": final.done, "pages_fetched": len(fetches),
            "dead": final.dead, "requests_logged": len(entries),
            "recovered_total": final.totals.get("recovered", 0),
            "lease_seconds": opts.lease,
            "killed": {"worker": v.worker.name, "pid": v.worker.proc.pid,
                       "at": v.killed_ms / 1000, "frozen_at": v.frozen_ms / 1000,
                       "last_heartbeat": (v.last_heartbeat_ms or 0) / 1000 or None,
                       "inflight_at_last_heartbeat": v.held_at_heartbeat,
                       "leases": len(v.leases)},
            "returned": returned,
            "fetched_twice": twice, "unexpected_twice": unexpected,
            "rate_window_s": opts.window, "rates": rates,
            "budget": budget,
            "checks": checks, "ok": all(checks.values()),
            "out": str(self.out),
        }
        print_report(report)
        if opts.report:
            Path(opts.report).write_text(json.dumps(report, indent=1))
        return report


def per_host_rates(entries: list[dict[str, Any]], window: float) -> dict[str, dict[str, Any]]:
    """Per host (Host header): requests, the most in any `window`-second and any
    60-second sliding window by the time they took their budget (Redis time, as the
    workers' BudgetStamp sent it; ``unstamped``: requests that came without it) and the
    most in any `window` seconds by their arrival at the site."""
    arrived: dict[str, list[float]] = defaultdict(list)
    taken: dict[str, list[float]] = defaultdict(list)
    for e in entries:
        host = e.get("host") or f"{e['server_host']}:{e['port']}"
        arrived[host].append(e["t"])
        if "budget_taken" in e:
            taken[host].append(e["budget_taken"] / 1000)
    out = {}
    for host, times in sorted(arrived.items()):
        times.sort()
        stamped = sorted(taken[host])
        out[host] = {"requests": len(times), "unstamped": len(times) - len(stamped),
                     "max_taken_in_window": _max_in(stamped, window),
                     "max_taken_in_60s": _max_in(stamped, 60.0),
                     "max_arrived_in_window": _max_in(times, window)}
    return out


def _max_in(times: list[float], window: float) -> int:
    best = 0
    for i, t in enumerate(times):
        best = max(best, bisect.bisect_left(times, t + window, lo=i) - i)
    return best


def print_report(r: dict[str, Any]) -> None:
    def mark(ok: bool) -> str:
        return "OK  " if ok else "FAIL"

    c = r["checks"]
    k = r["killed"]
    print("\n=== Report ===")
    print(f"[{mark(c['done_exact'])}] done == {r['pages']:,}: done is {r['done']:,} "
          f"(Redis done counter); {r['pages_fetched']:,} distinct pages fetched, "
          f"{r['dead']} dead letters")
    print(f"[{mark(c['leases_came_back_after_expiry'] and c['killed_worker_held_leases'])}] "
          f"the killed worker's in-flight requests came back after their lease expired:")
    print(f"       {k['worker']} (pid {k['pid']}) killed with kill -9 at {ts(k['at'])} holding "
          f"{plural(k['leases'], 'lease')} (lease {r['lease_seconds']:g} s); frozen with "
          f"SIGSTOP since {ts(k['frozen_at'])} to tell its leases apart; its last renewal "
          f"showed {k['inflight_at_last_heartbeat']} in flight")
    print(f"       Redis counter 'recovered' (leases expired and requeued): "
          f"{r['recovered_total']}")
    for x in r["returned"]:
        before = [f for f in x["fetches"] if f["t"] < x["deadline"]]
        after = [f for f in x["fetches"] if f["t"] >= x["deadline"]]
        again = ", ".join(f"{ts(f['t'])} by {f['worker']}" for f in after) or "NEVER"
        first = (f" (fetched by {before[0]['worker']} at {ts(before[0]['t'])}, before the kill)"
                 if before else " (not fetched before the kill)")
        print(f"       {x['url']:<8} lease deadline {ts(x['deadline'])} -> fetched {again}"
              f"{first}")
    print(f"[{mark(c['no_page_twice_except_in_flight_at_kill'])}] no page fetched twice except "
          f"those in flight at the kill: {len(r['fetched_twice'])} fetched twice "
          f"({', '.join(sorted(r['fetched_twice'])) or 'none'}), all in flight at the kill"
          if not r["unexpected_twice"] else
          f"[FAIL] pages fetched twice that were not in flight at the kill: "
          f"{', '.join(r['unexpected_twice'])}")
    b = r["budget"]
    if b:
        print(f"[{mark(c['rate_within_budget'])}] the request rate per host never exceeded the "
              f"shared budget of {b['rate']} (burst {b['burst']}): at most {b['burst']} + "
              f"{r['rate_window_s']:g} s / {b['interval_ms']} ms = {b['allowed_in_window']} "
              f"requests started in any {r['rate_window_s']:g} s (by the Redis time each took "
              f"its budget, sent to the site by the workers):")
        for host, x in r["rates"].items():
            missing = f", {x['unstamped']:,} WITHOUT their budget time" if x["unstamped"] else ""
            print(f"       {host:<22} {x['requests']:>6,} requests, at most "
                  f"{x['max_taken_in_window']:,} started in any {r['rate_window_s']:g} s "
                  f"(sliding), {x['max_taken_in_60s']:,} in any 60 s; at most "
                  f"{x['max_arrived_in_window']:,} arrived at the site in any "
                  f"{r['rate_window_s']:g} s{missing}")
    else:
        print("       no budget (--rate ''); highest request rate per host at the site:")
        for host, x in r["rates"].items():
            print(f"       {host:<22} {x['requests']:>6,} requests, at most "
                  f"{x['max_arrived_in_window']:,} in any {r['rate_window_s']:g} s (sliding)")
    print(f"\n{'All checks passed.' if r['ok'] else 'SOME CHECKS FAILED.'} "
          f"Logs: {r['out']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pages", type=int, default=5000, help="pages of the test site (5000)")
    ap.add_argument("--workers", type=int, default=3, help="scrapy crawl workers (3)")
    ap.add_argument("--hosts", type=int, default=3 if sys.platform.startswith("linux") else 1,
                    help="hosts the pages are spread over: 127.0.0.1, .2, ... (3 on Linux)")
    ap.add_argument("--delay", type=float, default=0.05,
                    help="seconds each page takes at the site (0.05)")
    ap.add_argument("--concurrency", type=int, default=16, help="CONCURRENT_REQUESTS (16)")
    ap.add_argument("--lease", type=float, default=6.0, help="LEASED_LEASE_SECONDS (6)")
    ap.add_argument("--kill-at", type=float, default=0.3,
                    help="kill -9 worker w2 when this share of the pages is done (0.3)")
    ap.add_argument("--restart-after", type=float, default=1.0,
                    help="seconds between the kill and the restart (1)")
    ap.add_argument("--rate", default="100/s",
                    help="LEASED_RATE: the shared budget of each host ('100/s'; '' for none)")
    ap.add_argument("--burst", type=int, default=10, help="LEASED_RATE_BURST (10)")
    ap.add_argument("--window", type=float, default=1.0,
                    help="window of the per-host rate report, seconds (1)")
    ap.add_argument("--crawl-id", default="pages", help="LEASED_CRAWL_ID (pages: the "
                    "spider's name; reset at the start)")
    ap.add_argument("--redis-url", help="Redis (default: LEASED_REDIS_URL, else embedded)")
    ap.add_argument("--embedded-dir", help="embedded Redis data directory "
                    "(default example_project/.scrapy/leased-redis)")
    ap.add_argument("--keep-redis", action="store_true",
                    help="do not stop the embedded Redis at the end (it then stops by "
                         "itself 2 s after the demo exits; its data stays either way, and "
                         "`scrapy leased status` in example_project/ reads it)")
    ap.add_argument("--out",
                    help="directory for the logs (default example_project/.demo/<time>)")
    ap.add_argument("--report", help="also write the report as JSON to this file")
    ap.add_argument("--timeout", type=float, default=600.0, help="give up after (600 s)")
    opts = ap.parse_args(argv)
    if opts.workers < 2:
        ap.error("--workers must be at least 2 (one is killed)")
    try:
        report = asyncio.run(Demo(opts).run())
    except KeyboardInterrupt:
        print("\ninterrupted")
        return 130
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
