"""Rate budgets: which lane a request belongs to, and each lane's shared budget.

A lane is the key of a rate budget: the request's host by default, or
``request.meta["leased_lane"]`` when set (any string, e.g. a resolved IP), or its
``download_slot`` with ``LEASED_RATE_KEY = "slot"``. Budgets: ``LEASED_RATE`` for every
lane, ``LEASED_RATES`` per host (exact names, or ``*.example.com`` for a domain and its
subdomains; the most specific wins).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scrapy import Request
from scrapy.settings import BaseSettings
from scrapy.utils.httpobj import urlparse_cached

from ..config import LeasedConfigError
from ..frontier import NO_BUDGET, Budget
from ..meta import META_LANE

LANE_KEYS = ("host", "netloc", "slot")
_UNITS_MS = {"s": 1000, "sec": 1000, "second": 1000, "m": 60_000, "min": 60_000,
             "minute": 60_000, "h": 3_600_000, "hour": 3_600_000}
_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(\d*(?:\.\d+)?)\s*([a-z]+)\s*$")


def parse_rate(value: Any, burst: Any, setting: str) -> Budget:
    """``"120/min"`` (also ``"2/s"``, ``"1000/h"``, ``"5/10s"``) with a burst, as a Budget;
    None, "" or 0 for no budget. A dict gives ``{"rate": ..., "burst": ...}``."""
    if isinstance(value, Mapping):
        unknown = set(value) - {"rate", "burst"}
        if unknown or "rate" not in value:
            raise LeasedConfigError(
                f"{setting} ({dict(value)!r}) must be a rate like '120/min' or a dict with "
                f"'rate' and optionally 'burst'.")
        return parse_rate(value["rate"], value.get("burst", burst), setting)
    if value in (None, "", 0, "0"):
        return NO_BUDGET
    m = _RATE_RE.match(str(value).lower())
    if not m or m.group(3).rstrip("s") not in _UNITS_MS and m.group(3) not in _UNITS_MS:
        raise LeasedConfigError(
            f"{setting} ({value!r}) must be a rate like '120/min', '2/s' or '1000/h'.")
    count, per, unit = float(m.group(1)), float(m.group(2) or 1), m.group(3)
    unit_ms = _UNITS_MS.get(unit) or _UNITS_MS[unit.rstrip("s")]
    if count <= 0 or per <= 0:
        raise LeasedConfigError(f"{setting} ({value!r}) must allow more than 0 requests.")
    try:
        b = int(burst)
        if b < 1 or float(burst) != b:
            raise ValueError
    except (TypeError, ValueError):
        raise LeasedConfigError(f"burst of {setting} ({burst!r}) must be an integer >= 1.") from None
    return Budget(max(1, math.ceil(per * unit_ms / count)), b)  # rounded up: never over


@dataclass
class Budgets:
    default: Budget
    exact: dict[str, Budget]
    domains: list[tuple[str, Budget]]  # (".example.com", budget), longest first
    lane_key: str = "host"
    half_life_ms: int = 30_000
    backoff_ms: int = 5_000
    obey_crawl_delay: bool = True
    # A claim from a lane with nothing to enforce (no budget, Crawl-delay or block when
    # claimed) starts without a download-time check within this many ms of its claim.
    free_grace_ms: int = 500

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Budgets:
        burst = settings.get("LEASED_RATE_BURST") or 1
        default = parse_rate(settings.get("LEASED_RATE"), burst, "LEASED_RATE")
        exact: dict[str, Budget] = {}
        domains: list[tuple[str, Budget]] = []
        rates = settings.get("LEASED_RATES") or {}
        if not isinstance(rates, Mapping):
            rates = settings.getdict("LEASED_RATES")
        for pattern, spec in dict(rates).items():
            budget = parse_rate(spec, burst, f"LEASED_RATES[{pattern!r}]")
            pattern = str(pattern).lower()
            if pattern.startswith("*."):
                domains.append((pattern[1:], budget))
            else:
                exact[pattern] = budget
        domains.sort(key=lambda d: -len(d[0]))
        lane_key = settings.get("LEASED_RATE_KEY") or "host"
        if lane_key not in LANE_KEYS:
            raise LeasedConfigError(
                f"LEASED_RATE_KEY ({lane_key!r}) must be one of {', '.join(LANE_KEYS)}.")
        return cls(default, exact, domains, lane_key,
                   half_life_ms=_ms(settings, "LEASED_RATE_RECOVERY", 30.0),
                   backoff_ms=_ms(settings, "LEASED_RATE_BACKOFF", 5.0),
                   obey_crawl_delay=settings.getbool("LEASED_RATE_CRAWL_DELAY", True),
                   free_grace_ms=_ms(settings, "LEASED_RATE_FREE_GRACE", 0.5, allow_zero=True))

    @property
    def enabled(self) -> bool:
        """Whether any lane has a budget (otherwise no request waits for one)."""
        return bool(self.default.interval_ms or self.exact or self.domains)

    def lane_of(self, request: Request) -> str:
        lane = request.meta.get(META_LANE)
        if lane is None:
            if self.lane_key == "slot" and request.meta.get("download_slot"):
                lane = request.meta["download_slot"]
            else:
                parsed = urlparse_cached(request)
                lane = parsed.netloc if self.lane_key == "netloc" else parsed.hostname
        return str(lane or "").replace("|", "%7C").lower()

    def for_lane(self, lane: str) -> Budget:
        budget = self.exact.get(lane)
        if budget is not None:
            return budget
        dotted = "." + lane
        for suffix, b in self.domains:
            if dotted.endswith(suffix):
                return b
        return self.default


def _ms(settings: BaseSettings, name: str, default_s: float, allow_zero: bool = False) -> int:
    raw = settings.get(name)
    try:
        value = float(default_s if raw in (None, "") else raw)
    except (TypeError, ValueError):
        raise LeasedConfigError(f"{name} ({raw!r}) must be a number of seconds.") from None
    if value < 0 or (value == 0 and not allow_zero):
        bound = "at least" if allow_zero else "higher than"
        raise LeasedConfigError(f"{name} ({raw!r}) must be {bound} 0.")
    return int(value * 1000)
