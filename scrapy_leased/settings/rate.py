"""Rate budgets: which lane a request belongs to, and each lane's shared budget.

A lane is the key of a rate budget: the request's host by default, or
``request.meta["leased_lane"]`` when set (any string, e.g. a resolved IP), or its
``download_slot`` with ``LEASED_RATE_KEY = "slot"``. Budgets: ``LEASED_RATE`` for every
lane, ``LEASED_RATES`` per host (exact names, or ``*.example.com`` for a domain and its
subdomains; the most specific wins).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from scrapy import Request
from scrapy.settings import BaseSettings
from scrapy.utils.httpobj import urlparse_cached

from ..exceptions import LeasedConfigError
from ..frontier import Budget
from ..meta import META_LANE
from .defaults import HALF_LIFE_MS
from .validate import bool_setting, ms_setting, number_setting, parse_rate

LANE_KEYS = ("host", "netloc", "slot")


@dataclass
class Budgets:
    default: Budget
    exact: dict[str, Budget]
    domains: list[tuple[str, Budget]]  # (".example.com", budget), longest first
    lane_key: str = "host"
    half_life_ms: int = HALF_LIFE_MS
    backoff_ms: int = 5_000
    obey_crawl_delay: bool = True
    # A claim from a lane with nothing to enforce (no budget, Crawl-delay or block when
    # claimed) starts without a download-time check within this many ms of its claim.
    free_grace_ms: int = 500

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Budgets:
        # checked on its own, with its name, even with no rate set that it would apply to
        burst = number_setting(settings, "LEASED_RATE_BURST", 1, minimum=1, integer=True,
                               exclusive=False)
        default = parse_rate(settings.get("LEASED_RATE"), burst, "LEASED_RATE")
        exact: dict[str, Budget] = {}
        domains: list[tuple[str, Budget]] = []
        rates = settings.get("LEASED_RATES") or {}
        if not isinstance(rates, Mapping):
            try:  # a JSON object, as from -s LEASED_RATES='{"example.com": "2/s"}'
                rates = settings.getdict("LEASED_RATES")
            except (TypeError, ValueError):
                raise LeasedConfigError(
                    f"LEASED_RATES ({rates!r}) must be a dict of host patterns to rates, "
                    f"like {{'example.com': '2/s'}}.") from None
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
                   half_life_ms=ms_setting(settings, "LEASED_RATE_RECOVERY", HALF_LIFE_MS / 1000),
                   backoff_ms=ms_setting(settings, "LEASED_RATE_BACKOFF", 5.0),
                   obey_crawl_delay=bool_setting(settings, "LEASED_RATE_CRAWL_DELAY", True),
                   free_grace_ms=ms_setting(settings, "LEASED_RATE_FREE_GRACE", 0.5,
                                            allow_zero=True))

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
