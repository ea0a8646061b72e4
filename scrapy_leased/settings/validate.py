"""The rules every ``LEASED_*`` setting is checked by: numbers in range, durations in
ms, booleans, rates (``"120/min"``), Redis URLs, crawl ids, the close limits. Public so
that each section of the settings, and the commands, use the same rules; each raises
LeasedConfigError naming the setting."""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Mapping
from typing import Any

from scrapy.settings import BaseSettings

from .._redis.url import RedisUrlError, parse_redis_url, redact
from ..exceptions import LeasedConfigError
from ..frontier import NO_BUDGET, Budget, CloseLimits
from .defaults import LOGSTATS_INTERVAL_SECONDS, SCRAPYD_RUN_GRACE_SECONDS

REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+sentinel", "redis+cluster",
                 "rediss+sentinel", "rediss+cluster")
CRAWL_ID_RE = re.compile(r"^[^{}\s]+$")  # it becomes the keys' {hash tag}


#: The largest number a numeric setting takes (a count, or seconds): in ms it is still an
#: exact integer in a double, as Lua and Redis read it (1e12 s is 31,700 years)
MAX_SETTING_NUMBER = 10**12


def number_setting(settings: BaseSettings, name: str, default: float | None, *, minimum: float,
                   integer: bool = False, exclusive: bool = True) -> Any:
    """Setting ``name`` as a number (an int with ``integer``), above ``minimum`` (at least
    it, without ``exclusive``) and at most MAX_SETTING_NUMBER; ``default`` when unset;
    else LeasedConfigError."""
    raw = settings.get(name)
    if raw is None or raw == "":
        return default
    kind = "an integer" if integer else "a number"
    try:
        if isinstance(raw, bool):
            raise ValueError
        value = int(raw) if integer else float(raw)
        if integer and float(raw) != value:
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        raise LeasedConfigError(f"{name} ({raw!r}) must be {kind}.") from None
    if not math.isfinite(value) or abs(value) > MAX_SETTING_NUMBER:
        raise LeasedConfigError(f"{name} ({raw!r}) must be {kind} up to "
                                f"{MAX_SETTING_NUMBER:.0e}.")
    if value < minimum or (exclusive and value == minimum):
        bound = "higher than" if exclusive else "at least"
        raise LeasedConfigError(f"{name} ({raw!r}) must be {bound} {minimum}.")
    return value


def in_scrapyd_job() -> bool:
    """Whether this process is a Scrapyd job: Scrapyd's runner is ``__main__``
    (``python -m scrapyd.runner crawl SPIDER -a _job=ID``), a ``_job=`` spider argument
    is on the command line (a custom runner), or Scrapyd's environment variables are set
    (``SCRAPYD_EGG_VERSION``; ``SCRAPY_JOB`` of Scrapyd before 1.3)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if getattr(spec, "name", None) == "scrapyd.runner":
        return True
    argv = sys.argv[1:]
    if any(a == "-a" and b.startswith("_job=") for a, b in zip(argv, argv[1:])):
        return True
    return bool(os.environ.get("SCRAPYD_EGG_VERSION") or os.environ.get("SCRAPY_JOB"))


def run_grace(settings: BaseSettings) -> float:
    """LEASED_RUN_GRACE: seconds a run that ended stays joinable (lua/run_leave.lua);
    by default SCRAPYD_RUN_GRACE_SECONDS inside a Scrapyd job, else 0 (a new ``scrapy
    crawl`` of a finished crawl starts afresh)."""
    default = SCRAPYD_RUN_GRACE_SECONDS if in_scrapyd_job() else 0.0
    return float(number_setting(settings, "LEASED_RUN_GRACE", default, minimum=0,
                                exclusive=False))


def bool_setting(settings: BaseSettings, name: str, default: bool) -> bool:
    """Setting ``name`` as a boolean; ``default`` when unset; else LeasedConfigError."""
    try:
        return settings.getbool(name, default)
    except (TypeError, ValueError, OverflowError):
        raise LeasedConfigError(
            f"{name} ({settings.get(name)!r}) must be a boolean (True/False, 1/0)."
        ) from None


def ms_setting(settings: BaseSettings, name: str, default_s: float,
               allow_zero: bool = False) -> int:
    """Setting ``name`` (seconds, above 0; at least 0 with ``allow_zero``) in ms."""
    raw = settings.get(name)
    try:
        if isinstance(raw, bool):
            raise ValueError
        value = float(default_s if raw in (None, "") else raw)
    except (TypeError, ValueError, OverflowError):
        raise LeasedConfigError(f"{name} ({raw!r}) must be a number of seconds.") from None
    if not math.isfinite(value) or value > MAX_SETTING_NUMBER:
        raise LeasedConfigError(f"{name} ({raw!r}) must be a number of seconds up to "
                                f"{MAX_SETTING_NUMBER:.0e}.")
    if value < 0 or (value == 0 and not allow_zero):
        bound = "at least" if allow_zero else "higher than"
        raise LeasedConfigError(f"{name} ({raw!r}) must be {bound} 0.")
    return int(value * 1000)


def logstats_interval(settings: BaseSettings) -> float:
    """``LEASED_LOGSTATS_INTERVAL`` in seconds (0: off); raises LeasedConfigError."""
    raw = settings.get("LEASED_LOGSTATS_INTERVAL")
    if raw is None or raw == "":
        return LOGSTATS_INTERVAL_SECONDS
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = -1.0
    if not 0 <= value <= MAX_SETTING_NUMBER:  # also rejects NaN
        raise LeasedConfigError(
            f"LEASED_LOGSTATS_INTERVAL ({raw!r}) must be a number of seconds, at least 0 "
            f"(0 turns the fleet log line off).")
    return value


def close_limits(settings: BaseSettings) -> CloseLimits:
    """The fleet-wide limits LEASED_CLOSE_PAGECOUNT, LEASED_CLOSE_ITEMCOUNT,
    LEASED_CLOSE_ERRORCOUNT (integers) and LEASED_CLOSE_TIMEOUT (seconds), each at least
    0 (0 or unset: no limit). Items and errors are counted in the fleet's Scrapy stats:
    they need LEASED_FLEET_STATS."""
    def count(name: str) -> int:
        value: int = number_setting(settings, name, 0, minimum=0, integer=True,
                                    exclusive=False)
        return value

    timeout = number_setting(settings, "LEASED_CLOSE_TIMEOUT", 0.0, minimum=0,
                             exclusive=False)
    limits = CloseLimits(pages=count("LEASED_CLOSE_PAGECOUNT"),
                         items=count("LEASED_CLOSE_ITEMCOUNT"),
                         errors=count("LEASED_CLOSE_ERRORCOUNT"),
                         timeout_ms=int(math.ceil(timeout * 1000)))
    if (limits.items or limits.errors) and not bool_setting(settings, "LEASED_FLEET_STATS",
                                                            True):
        name = "LEASED_CLOSE_ITEMCOUNT" if limits.items else "LEASED_CLOSE_ERRORCOUNT"
        raise LeasedConfigError(
            f"{name} counts the fleet's Scrapy stats in Redis: it needs "
            f"LEASED_FLEET_STATS = True.")
    return limits


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
    if count > MAX_SETTING_NUMBER or per * unit_ms / count > MAX_SETTING_NUMBER:
        raise LeasedConfigError(f"{setting} ({value!r}) is out of range: at most "
                                f"{MAX_SETTING_NUMBER:.0e} requests, and at least one "
                                f"request in {MAX_SETTING_NUMBER:.0e} ms.")
    try:
        if isinstance(burst, bool):
            raise ValueError
        b = int(burst)
        if b < 1 or b > MAX_SETTING_NUMBER or float(burst) != b:
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        raise LeasedConfigError(
            f"burst of {setting} ({burst!r}) must be an integer >= 1.") from None
    return Budget(max(1, math.ceil(per * unit_ms / count)), b)  # rounded up: never over


def check_redis_url(url: str, name: str = "LEASED_REDIS_URL") -> str:
    """``url`` if it names a Redis (one server, a Sentinel master or a Cluster: see
    _redis/url.py), else LeasedConfigError naming the setting."""

    try:
        parse_redis_url(url)
    except RedisUrlError as exc:
        raise LeasedConfigError(f"{name} ({redact(url)!r}) {exc}.") from None
    return url


def check_crawl_id(crawl_id: Any, name: str = "LEASED_CRAWL_ID") -> str:
    """``crawl_id`` if it can name a crawl, else LeasedConfigError naming ``name``."""
    if not (isinstance(crawl_id, str) and CRAWL_ID_RE.match(crawl_id)):
        raise LeasedConfigError(
            f"{name} ({crawl_id!r}) must be a non-empty string without "
            "spaces or braces (it becomes the keys' {hash tag})."
        )
    return crawl_id


