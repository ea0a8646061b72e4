"""HTTP connections a crawl opens per host: one scrapy_leased worker at its defaults
against plain Scrapy, on the CPU-bound test site and on the 100 ms site.

Both crawls run Scrapy's defaults (``CONCURRENT_REQUESTS`` 16,
``CONCURRENT_REQUESTS_PER_DOMAIN`` 8): Scrapy's HTTP/1.1 pool keeps at most 8 idle
connections per host (``maxPersistentPerHost``), so a crawler whose downloads dip and
come back in bursts closes idle connections and opens new ones where plain Scrapy
reuses its 8. The site logs each request's client port; a connection is one distinct
port (bench_e2e.site_summary). Runs alternate between the setups (interleaved), so a
change of the machine's load hits both alike; the figure is the median of ``reps``.

    python benchmarks/bench_connections.py [--reps 5] [--pages 5000] [--latency-pages 2000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_e2e import run as e2e_run
from bench_latency import HOSTS, Setup, run_one

from tests.support.redis_server import RedisServer

MODES = ("plain", "leased_defaults")
SITES = {"cpu": "the CPU-bound test site", "fixed100": "every page answers after 100 ms"}


def hosts_of(site: str) -> int:
    return 1 if site == "cpu" else HOSTS[site]


def one(site: str, mode: str, pages: int, latency_pages: int, redis: RedisServer,
        workdir: Path) -> dict[str, Any]:
    """One crawl by one worker (or one plain process): connections per host, pages/s."""
    if site == "cpu":
        res = e2e_run(mode, 1, pages, redis, workdir)
    else:
        res = run_one(Setup(mode, 1), site, latency_pages, redis, workdir)
    if "error" in res:
        raise RuntimeError(f"{site} {mode}: {res['error']}")
    return {"connections_per_host": res["site"]["connections"] / hosts_of(site),
            "pages_per_s": res["pages_per_s"], "distinct": res["site"]["distinct"]}


def measure(reps: int, pages: int, latency_pages: int,
            sites: tuple[str, ...] = tuple(SITES)) -> dict[str, dict[str, list[dict]]]:
    """``reps`` interleaved runs of every (site, mode); raw results by site and mode."""
    redis = RedisServer(appendonly=False).start()
    workdir = Path(tempfile.mkdtemp(prefix="leased-conn-"))
    out: dict[str, dict[str, list[dict]]] = {s: {m: [] for m in MODES} for s in sites}
    try:
        for rep in range(reps):
            for site in sites:
                modes = MODES if rep % 2 == 0 else tuple(reversed(MODES))
                for mode in modes:
                    r = one(site, mode, pages, latency_pages, redis, workdir)
                    out[site][mode].append(r)
                    print(f"rep {rep + 1}/{reps} {site} {mode}: "
                          f"{r['connections_per_host']:.1f} connections per host, "
                          f"{r['pages_per_s']:.0f} pages/s", file=sys.stderr)
    finally:
        redis.stop()
    return out


def summary(raw: dict[str, dict[str, list[dict]]]) -> dict[str, dict[str, Any]]:
    """Per site: median connections per host of each mode, and leased / plain."""
    out = {}
    for site, by_mode in raw.items():
        med = {m: statistics.median(r["connections_per_host"] for r in rs)
               for m, rs in by_mode.items()}
        spread = {m: (min(r["connections_per_host"] for r in rs),
                      max(r["connections_per_host"] for r in rs)) for m, rs in by_mode.items()}
        out[site] = {"median": med, "range": spread,
                     "ratio": med["leased_defaults"] / med["plain"] if med["plain"] else None}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--pages", type=int, default=5000, help="pages of the CPU-bound site")
    ap.add_argument("--latency-pages", type=int, default=2000, help="pages of the 100 ms site")
    ap.add_argument("--sites", default=",".join(SITES), help="cpu, fixed100 (comma-separated)")
    ns = ap.parse_args()
    raw = measure(ns.reps, ns.pages, ns.latency_pages, tuple(ns.sites.split(",")))
    print(json.dumps(summary(raw), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
