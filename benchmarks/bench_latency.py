"""Latency-bound crawls: pages answer after a delay, so speed is requests in flight.

    python benchmarks/bench_latency.py [--profile fixed100|spread] [--pages 2000]
        [--reps 3] [--setups plain:1,leased_defaults:1,leased_defaults:1:LEASED_PREFETCH=16]

One run is ``bench_e2e.run`` (the same benchmark project, spider and measurements as
the CPU-bound case) against the test site with a latency profile (``--profile`` of
``scrapy_leased/testing/site.py``, :mod:`scrapy_leased.testing.latency`):
each page answers after the delay of its profile (``fixed100``: 100 ms; ``spread``:
20-150 ms on 6 hosts, 200-500 ms on 2 slow ones), on several hosts (127.0.0.x, one
download slot and one lane each), ``CONCURRENT_REQUESTS`` 16 and
``CONCURRENT_REQUESTS_PER_DOMAIN`` 8 (Scrapy's defaults) for every setup.

A setup with N workers crawls a site of N x ``--pages`` pages (so every setup's crawl
lasts about as long, and ramp-up and tail weigh the same); the control ``plain`` with
N > 1 runs N independent plain crawls at once, each of its own ``--pages`` site.

Besides pages/s (distinct pages / first-to-last request served) each run reports:
* in flight at the site: sum over pages of (answer written - request read) / span, the
  time-averaged number of requests the site was answering: the crawl's real
  concurrency;
* per worker, sampled every ``SAMPLE_S`` by ``benchproject.extensions.BenchReport`` and
  averaged over the crawl's span: requests in the downloader (what Scrapy counts
  against CONCURRENT_REQUESTS), on the wire, and for scrapy_leased claims held and
  claims unstarted (leases no other worker can take);
* the site's CPU (cores = its CPU seconds / span: it must stay far below 1).

``benchmarks/run_all.py --only latency,spread`` runs the issue #12 matrix with this
module and writes the tables; this command line is for experiments (``-s`` settings
per setup, e.g. ``LEASED_PREFETCH``), printed as one table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

from bench_e2e import run as e2e_run  # noqa: E402
from mdtable import row  # noqa: E402

from scrapy_leased.testing.latency import profile_summary  # noqa: E402
from scrapy_leased.testing.process import SiteProcess  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402

SAMPLE_S = 0.02  # BenchReport's sampling period
HOSTS = {"fixed100": 4, "spread": 8}


class Setup:
    """``mode:workers[:NAME=VALUE+NAME=VALUE...]``: a mode of bench_e2e, its worker count
    and settings given to every worker with -s."""

    def __init__(self, mode: str, workers: int, settings: dict[str, str] | None = None,
                 label: str | None = None) -> None:
        self.mode = mode
        self.workers = workers
        self.settings = dict(settings or {})
        self.label = label or self.spec

    @property
    def spec(self) -> str:
        extra = "+".join(f"{k}={v}" for k, v in self.settings.items())
        return f"{self.mode}:{self.workers}" + (f":{extra}" if extra else "")

    @classmethod
    def parse(cls, spec: str) -> Setup:
        parts = spec.split(":", 2)
        settings = {}
        if len(parts) == 3 and parts[2]:
            for kv in parts[2].split("+"):
                k, _, v = kv.partition("=")
                settings[k] = v
        return cls(parts[0], int(parts[1]), settings)


def _window(samples: list[list[float]], t0: float, t1: float) -> list[list[float]]:
    return [s for s in samples if t0 <= s[0] <= t1]


def summarize(res: dict[str, Any], site_first: float, site_last: float) -> dict[str, Any]:
    """Per-worker means of the samples over the crawl's span (first to last page served)."""
    per_worker = []
    for rep in res["worker_reports"]:
        if not rep or not rep.get("samples"):
            continue
        rows = _window(rep["samples"], site_first, site_last)
        if not rows:
            continue
        cols = list(zip(*rows))

        def mean(i: int, cols: list[tuple] = cols) -> float | None:
            return statistics.fmean(cols[i]) if cols[i][0] >= 0 else None

        per_worker.append({
            "active": mean(1), "transferring": mean(2), "claims": mean(3),
            "unstarted": mean(4), "handed": mean(5),
            "unstarted_max": max(cols[4]) if cols[4][0] >= 0 else None,
            "claims_max": max(cols[3]) if cols[3][0] >= 0 else None,
        })
    out: dict[str, Any] = {"workers_sampled": len(per_worker)}
    for key in ("active", "transferring", "claims", "unstarted", "handed"):
        vals = [w[key] for w in per_worker if w[key] is not None]
        out[key] = statistics.fmean(vals) if vals else None  # per worker
    for key in ("unstarted_max", "claims_max"):
        vals = [w[key] for w in per_worker if w[key] is not None]
        out[key] = max(vals) if vals else None
    return out


def run_one(setup: Setup, profile: str, pages: int, redis: RedisServer | None,
            workdir: Path) -> dict[str, Any]:
    """One crawl of the latency site; bench_e2e's result plus the samples' summary."""
    hosts = HOSTS[profile]
    site_pages = pages if setup.mode == "plain" else pages * setup.workers

    def make_site(log_path: Path) -> SiteProcess:
        return SiteProcess(site_pages, log_path, ports=hosts, distinct_hosts=True, spread=True,
                           nodelay=True, profile=profile).start()

    settings = {"BENCH_SAMPLE": SAMPLE_S, **setup.settings}
    res = e2e_run(setup.mode, setup.workers, site_pages, redis, workdir,
                  make_site=make_site, settings=settings)
    if "error" in res:
        return res
    site = res["site"]
    # the control's sites: the union of their spans (all start at once)
    res["probe"] = summarize(res, site["first"], site["last"])
    res["site_cores"] = res["cpu"]["site"] / site["span"] if site["span"] else 0.0
    res["setup"] = setup.spec
    res["profile"] = profile
    for r in res["worker_reports"]:
        if r:
            r.pop("samples", None)  # summarized; too big to keep in the raw results
    return res


def share(r: dict[str, Any], ncpu: int) -> float:
    """Workers (crawl window), Redis and site CPU against ncpu x the crawl window, %."""
    cpu = r["cpu"]
    return 100.0 * (cpu["workers_crawl"] + cpu.get("redis", 0.0) + cpu["site"]) / (
        ncpu * r["crawl_window"]) if r["crawl_window"] else 0.0


def table(results: dict[str, list[dict]], setups: list[Setup], plain_key: str | None) -> list[str]:
    """Markdown rows: one per setup, ratios to the plain single process's median."""
    plain = (statistics.median(r["pages_per_s"] for r in results[plain_key])
             if plain_key and results.get(plain_key) else None)
    import os

    ncpu = os.cpu_count() or 1
    lines = ["| setup | workers | pages/s | vs plain Scrapy (1 process) | per worker vs plain | "
             "in flight at the site | per worker: in downloader / on the wire | "
             "per worker: claims held / unstarted (max) | site CPU, cores (max) | "
             "workers + Redis + site, share of the machine | other processes, cores (max) | "
             "duplicates | misses |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
             "| ---: |"]
    for s in setups:
        rs = results[s.spec]
        pps = [r["pages_per_s"] for r in rs]
        m = statistics.median(pps)
        vs = f"{m / plain:.2f}x" if plain else ""
        per = f"{m / plain / s.workers:.2f}x" if plain else ""
        infl = statistics.median(r["site"]["inflight"] or 0 for r in rs)

        def pm(key: str, digits: int = 1, rs: list[dict] = rs) -> str:
            vals = [r["probe"][key] for r in rs if r["probe"].get(key) is not None]
            return f"{statistics.median(vals):.{digits}f}" if vals else "-"

        umax = [r["probe"]["unstarted_max"] for r in rs
                if r["probe"].get("unstarted_max") is not None]
        claims = (f"{pm('claims')} / {pm('unstarted')} ({max(umax):.0f})" if umax else "-")
        lines.append(row(
            s.label, s.workers, f"{statistics.median(pps):,.0f} ({min(pps):,.0f}-{max(pps):,.0f})",
            vs, per, f"{infl:.1f}", f"{pm('active')} / {pm('transferring')}", claims,
            f"{max(r['site_cores'] for r in rs):.2f}",
            f"{statistics.median(share(r, ncpu) for r in rs):.0f} %",
            f"{max(r['cpu']['others'] / r['wall'] for r in rs):.2f}",
            sum(r["site"]["duplicates"] for r in rs), sum(r["site"]["misses"] for r in rs)))
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", choices=sorted(HOSTS), default="fixed100")
    ap.add_argument("--pages", type=int, default=2000, help="pages per worker")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--setups", default="plain:1,leased_defaults:1",
                    help="comma-separated mode:workers[:NAME=VALUE+NAME=VALUE]")
    ap.add_argument("--json", default=None, help="write the raw results here")
    ns = ap.parse_args()
    setups = [Setup.parse(x) for x in ns.setups.split(",") if x.strip()]
    workdir = Path(tempfile.mkdtemp(prefix="leased-latency-"))
    redis = RedisServer(appendonly=False).start()
    results: dict[str, list[dict]] = {s.spec: [] for s in setups}
    prof = profile_summary(ns.profile, ns.pages, HOSTS[ns.profile])
    print(f"profile {ns.profile}: {HOSTS[ns.profile]} hosts, mean delay "
          f"{prof['mean_s'] * 1000:.0f} ms", file=sys.stderr)
    try:
        for rep in range(ns.reps):
            k = rep % len(setups)
            for s in setups[k:] + setups[:k]:
                res = run_one(s, ns.profile, ns.pages, redis, workdir)
                if "error" in res:
                    print(res["error"], file=sys.stderr)
                    return 1
                results[s.spec].append(res)
                p = res["probe"]
                print(f"rep {rep + 1} {s.spec}: {res['pages_per_s']:.0f} pages/s, in flight "
                      f"{res['site']['inflight'] or 0:.1f}, claims {p.get('claims')}, "
                      f"unstarted {p.get('unstarted')} (max {p.get('unstarted_max')})",
                      file=sys.stderr)
    finally:
        redis.close()
    plain_key = next((s.spec for s in setups if s.mode == "plain" and s.workers == 1
                      and not s.settings), None)
    print("\n".join(table(results, setups, plain_key)))
    if ns.json:
        Path(ns.json).write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
