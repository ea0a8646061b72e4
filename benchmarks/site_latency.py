"""A latency-bound local site: the test site's pages, each answered after a delay.

    python benchmarks/site_latency.py --pages 2000 --hosts 4 --profile fixed100 --log F

The pages and links are the test site's (``example_project/testsite.py``: page i links
to 10i+1..10i+10 and two cross links), spread over ``--hosts`` listeners on distinct
loopback addresses (127.0.0.1, 127.0.0.2, ...: one Scrapy download slot and one
scrapy_leased lane each), page j on host ``j % hosts``, every link absolute. A page is
answered after the delay its profile gives it, the same for every crawler and every run
(a hash of the page number, not a random draw):

* ``fixed100``: every page 100 ms;
* ``spread``: pages of the first ``hosts - SLOW_HOSTS`` hosts take 20-150 ms
  (log-uniform), pages of the last ``SLOW_HOSTS`` hosts (the slow ones) 200-500 ms
  (uniform).

The handler sleeps in its own thread (``ThreadingHTTPServer``: one thread per
connection, each sleeping costs no CPU), with TCP_NODELAY (see ``site_nodelay.py``).
Every request is logged as the test site does, plus ``t0``: when the request line was
read (``t`` is when the answer is written), so the time-averaged number of requests
being answered, sum(t - t0) / span, is the crawl's downloads in flight as the site saw
them. ``LatencySite`` runs it as a subprocess (``SiteProcess``).
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from example_project import testsite  # noqa: E402

SCRIPT = Path(__file__).resolve()
PROFILES = ("fixed100", "spread")
SLOW_HOSTS = 2  # the last two hosts of the spread profile are the slow ones
FAST_MS = (20.0, 150.0)  # log-uniform
SLOW_MS = (200.0, 500.0)  # uniform


def _unit(i: int) -> float:
    """A number in [0, 1) fixed by i (the same in every run and process)."""
    h = hashlib.blake2b(i.to_bytes(8, "little"), digest_size=8).digest()
    return int.from_bytes(h, "little") / 2 ** 64


def page_delay(profile: str, page: int, hosts: int) -> float:
    """Seconds page ``page`` waits before its answer."""
    if profile == "fixed100":
        return 0.100
    if profile == "spread":
        u = _unit(page)
        if hosts > SLOW_HOSTS and page % hosts >= hosts - SLOW_HOSTS:
            lo, hi = SLOW_MS
            return (lo + (hi - lo) * u) / 1000
        lo, hi = FAST_MS
        return math.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * u) / 1000
    raise ValueError(f"unknown delay profile {profile!r}; one of {', '.join(PROFILES)}")


def profile_summary(profile: str, pages: int, hosts: int) -> dict[str, float]:
    """Mean delay (s) over the site's pages and the share of pages on slow hosts."""
    delays = [page_delay(profile, i, hosts) for i in range(pages)]
    slow = sum(1 for i in range(pages)
               if profile == "spread" and hosts > SLOW_HOSTS and i % hosts >= hosts - SLOW_HOSTS)
    return {"mean_s": sum(delays) / pages, "min_s": min(delays), "max_s": max(delays),
            "slow_share": slow / pages}


class LatencySite(testsite.SiteProcess):
    """The site as a subprocess: ``LatencySite(pages, log_path, hosts, profile).start()``."""

    script = SCRIPT

    def __init__(self, pages: int, log_path: Any, hosts: int = 4,
                 profile: str = "fixed100") -> None:
        super().__init__(pages=pages, log_path=log_path, ports=hosts, distinct_hosts=True,
                         spread=True)
        if profile not in PROFILES:
            raise ValueError(f"unknown delay profile {profile!r}; one of {', '.join(PROFILES)}")
        self.profile = profile

    def start(self, timeout: float = 10.0) -> "LatencySite":
        # SiteProcess.start builds the command line; the profile travels by environment
        import os

        os.environ["LATENCY_SITE_PROFILE"] = self.profile
        try:
            super().start(timeout)
        finally:
            os.environ.pop("LATENCY_SITE_PROFILE", None)
        return self


def _install(profile: str) -> None:
    """Patch the test site's handler (in this subprocess only): delay, t0, NODELAY."""
    handler = testsite._Handler
    handler.disable_nagle_algorithm = True
    route = handler._route

    def _route(self: Any) -> None:
        self._t0 = time.time()
        parts = self.path.split("?", 1)[0].strip("/").split("/")
        if len(parts) == 2 and parts[0] == "p":
            i = self._page_index(parts[1])
            if i is not None:
                time.sleep(page_delay(profile, i, len(self.site.hosts)))
        route(self)

    def _record(self: Any, h: Any, status: int) -> None:  # testsite.Site._record + t0
        entry = {"t": time.time(), "t0": getattr(h, "_t0", None), "method": h.command,
                 "path": h.path, "host": h.headers.get("Host"), "port": h.server.server_address[1],
                 "server_host": h.server.server_address[0], "status": status}
        with self._lock:
            self.log.append(entry)
            if self._logfile is not None:
                self._logfile.write(json.dumps(entry) + "\n")
                self._logfile.flush()

    handler._route = _route
    testsite.Site._record = _record


if __name__ == "__main__":
    import os

    _install(os.environ.get("LATENCY_SITE_PROFILE", "fixed100"))
    sys.exit(testsite.main(prog="python benchmarks/site_latency.py"))
