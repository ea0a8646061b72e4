"""Latency profiles: how long each page of the test site waits before its answer.

A page's delay is the same for every crawler and every run (a hash of the page number,
not a random draw):

* ``fixed100``: every page 100 ms;
* ``spread``: pages of the first ``hosts - SLOW_HOSTS`` hosts take 20-150 ms
  (log-uniform), pages of the last ``SLOW_HOSTS`` hosts (the slow ones) 200-500 ms
  (uniform); page j lives on host ``j % hosts`` (the site's ``spread`` layout).
"""

from __future__ import annotations

import hashlib
import math

PROFILES = ("fixed100", "spread")
SLOW_HOSTS = 2  # the last two hosts of the spread profile are the slow ones
FAST_MS = (20.0, 150.0)  # log-uniform
SLOW_MS = (200.0, 500.0)  # uniform


def check_profile(profile: str) -> str:
    """``profile``, if it is one of ``PROFILES``; else ValueError."""
    if profile not in PROFILES:
        raise ValueError(f"unknown delay profile {profile!r}; one of {', '.join(PROFILES)}")
    return profile


def _unit(i: int) -> float:
    """A number in [0, 1) fixed by i (the same in every run and process)."""
    h = hashlib.blake2b(i.to_bytes(8, "little"), digest_size=8).digest()
    return int.from_bytes(h, "little") / 2 ** 64


def _on_slow_host(page: int, hosts: int) -> bool:
    return hosts > SLOW_HOSTS and page % hosts >= hosts - SLOW_HOSTS


def page_delay(profile: str, page: int, hosts: int) -> float:
    """Seconds page ``page`` waits before its answer."""
    if check_profile(profile) == "fixed100":
        return 0.100
    u = _unit(page)
    if _on_slow_host(page, hosts):
        lo, hi = SLOW_MS
        return (lo + (hi - lo) * u) / 1000
    lo, hi = FAST_MS
    return math.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * u) / 1000


def profile_summary(profile: str, pages: int, hosts: int) -> dict[str, float]:
    """Mean delay (s) over the site's pages and the share of pages on slow hosts."""
    delays = [page_delay(profile, i, hosts) for i in range(pages)]
    slow = sum(1 for i in range(pages) if profile == "spread" and _on_slow_host(i, hosts))
    return {"mean_s": sum(delays) / pages, "min_s": min(delays), "max_s": max(delays),
            "slow_share": slow / pages}
