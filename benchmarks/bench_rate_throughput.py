"""How close a fleet gets to one host's budget: N `scrapy crawl` workers on one host of
the local test site for 15 s, requests per second in the middle 10 s (from the site's
log), against the budget.

    python benchmarks/bench_rate_throughput.py [RATE] [BURST] [WORKERS]   # default 100/s 10 3
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scrapy_leased.testing.site import Site  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402


def main() -> None:
    rate, burst, n = (sys.argv[1:] + ["100/s", "10", "3"][len(sys.argv) - 1:])[:3]
    with RedisServer() as srv:
        site = Site(pages=5000).start()
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        cmd = [sys.executable, "-m", "scrapy", "crawl", "site", "-a", f"start_url={site.url}/p/0",
               "-s", f"LEASED_REDIS_URL={srv.url}", "-s", "LEASED_CRAWL_ID=rate-bench",
               "-s", f"LEASED_RATE={rate}", "-s", f"LEASED_RATE_BURST={burst}",
               "-s", "LOG_LEVEL=WARNING", "-s", "LEASED_UPSERT_ENABLED=False"]
        procs = [subprocess.Popen(cmd, cwd=ROOT / "tests" / "project", env=env)
                 for _ in range(int(n))]
        time.sleep(15)
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()
        ts = sorted(e["t"] for e in site.entries())
        site.stop()
    middle = [t for t in ts if ts[0] + 3 < t < ts[0] + 13]
    print(f"budget {rate} burst {burst}, {n} workers: {len(middle) / 10:.1f} requests/s to "
          f"the host in the middle 10 s ({len(ts)} in all)")


if __name__ == "__main__":
    main()
