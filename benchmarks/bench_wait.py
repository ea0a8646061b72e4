"""What ``wait_replicas`` costs: the same crawl through a Sentinel group (a master, two
replicas, three sentinels), with and without ``WAIT 1`` after each claim, commit and
upsert, side by side in one run.

    python benchmarks/bench_wait.py [--rounds 3] [--workers 3] [--pages 5000]
    python benchmarks/bench_wait.py --calls 2000      # one call's latency only

Each round runs both variants (in alternating order) with ``bench_e2e.run``: a fresh
test site, the master emptied and its statistics reset, ``--workers`` ``scrapy crawl``
processes of benchmarks/project. Prints pages/s per run, the medians and their ratio,
the round trips per page (the workers' count of writes to their Redis sockets) and the
WAIT calls Redis counted. ``--calls N``: instead, the latency of N commit calls (one
request each) through the same Sentinel group with and without ``wait_replicas=1``,
three alternating rounds, median and 99th percentile.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

from bench_e2e import run  # noqa: E402

from tests.support.redis_ha import SentinelGroup  # noqa: E402


class _Target:
    """What bench_e2e.run needs of a Redis: a URL for the workers, a client of the master."""

    def __init__(self, group: SentinelGroup, wait: int) -> None:
        self.group = group
        self.url = group.url + (f"?wait_replicas={wait}" if wait else "")

    def client(self):
        return self.group.client()


async def _call_latency(url: str, calls: int) -> tuple[float, float]:
    """(median, p99) seconds of one Frontier.commit of one new request."""
    from scrapy_leased._redis.connection import connect
    from scrapy_leased.frontier import Frontier, NewRequest
    from scrapy_leased.frontier.keys import CrawlKeys

    client = await connect(url)
    f = Frontier(client, CrawlKeys(f"wait-{time.monotonic_ns()}"), lease_ms=30_000,
                 max_attempts=4)
    try:
        await f.enqueue([NewRequest('{"u": "http://h/warm"}', 0, 0, 0)])
        times = []
        for i in range(calls):
            t = time.perf_counter()
            await f.enqueue([NewRequest(f'{{"u": "http://h/{i}"}}', 0, i % 64, i)])
            times.append(time.perf_counter() - t)
    finally:
        await client.aclose()
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.99)]


def micro(calls: int) -> int:
    group = SentinelGroup(replicas=2, sentinels=3).start()
    try:
        for r in range(3):
            for wait in ((0, 1) if r % 2 == 0 else (1, 0)):
                url = group.url + (f"?wait_replicas={wait}" if wait else "")
                med, p99 = asyncio.run(_call_latency(url, calls))
                print(f"round {r + 1} wait_replicas={wait}: commit median {med * 1e6:.0f} us, "
                      f"p99 {p99 * 1e6:.0f} us", flush=True)
    finally:
        group.close()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--pages", type=int, default=5000)
    ap.add_argument("--calls", type=int, default=0,
                    help="measure N single commit calls instead of crawls")
    ns = ap.parse_args()
    if ns.calls:
        return micro(ns.calls)
    workdir = Path(tempfile.mkdtemp(prefix="leased-wait-"))
    group = SentinelGroup(replicas=2, sentinels=3).start()
    results: dict[int, list[dict]] = {0: [], 1: []}
    try:
        for r in range(ns.rounds):
            for wait in ((0, 1) if r % 2 == 0 else (1, 0)):
                res = run("leased", ns.workers, ns.pages, _Target(group, wait), workdir)
                if "error" in res:
                    print(res["error"], file=sys.stderr)
                    return 1
                sent = res["commands"]["sent_by_command"]
                res["wait_calls"] = sent.get("wait", 0)
                results[wait].append(res)
                # the workers' own count of writes to their Redis sockets: EVALSHA and
                # its WAIT go in one write (the replicas' REPLCONF ACKs are not clients')
                print(f"round {r + 1} wait_replicas={wait}: {res['pages_per_s']:.0f} pages/s, "
                      f"{res['redis_sends'] / ns.pages:.2f} round trips per page, "
                      f"WAIT calls {res['wait_calls']}, duplicates {res['site']['duplicates']}, "
                      f"misses {res['site']['misses']}", flush=True)
    finally:
        group.close()
    med = {w: statistics.median(x["pages_per_s"] for x in results[w]) for w in results}
    summary = {"workers": ns.workers, "pages": ns.pages, "rounds": ns.rounds,
               "median_pages_per_s": med, "ratio_wait_to_none": med[1] / med[0],
               "round_trips_per_page": {w: [round(x["redis_sends"] / ns.pages, 2)
                                            for x in results[w]] for w in results},
               "runs": {w: [round(x["pages_per_s"], 1) for x in results[w]] for w in results}}
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
