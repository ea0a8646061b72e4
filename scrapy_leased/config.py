"""The settings layer: every ``LEASED_*`` setting parsed and validated here, once.

``LeasedConfig.from_settings`` reads them all (its sections: ``budgets``, the rate
settings, read by ``ratelimit.budgets.Budgets``; ``upsert``, the ``LEASED_UPSERT_*``
settings, read by ``upsert.config.UpsertConfig``; each with the public validators
below), so one call checks a project's settings and names the first bad one. The
validators are public so that each section, and the commands, use the same rules.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy.settings import BaseSettings

from ._redis.connection import CONNECT_TIMEOUT_SECONDS  # how long a starting worker waits for Redis
from .codec import item_modules, meta_types
from .exceptions import LeasedConfigError as LeasedConfigError  # (its old home)
from .frontier import NO_BUDGET, Budget, CloseLimits

if TYPE_CHECKING:
    from .ratelimit.budgets import Budgets
    from .upsert.config import UpsertConfig

# Defaults, with their unit in the name.
LEASE_SECONDS = 30.0
MAX_ATTEMPTS = 4
SWEEP_INTERVAL_SECONDS = 2.0
IDLE_POLL_SECONDS = 0.2
WORKER_TTL_SECONDS = 30.0
WORKER_PRUNE_TTLS = 5  # registry entries silent for this many worker TTLs are removed
SEEN_BUCKET_BITS = 14
SEEN_CACHE = 100_000
RECOVER_BATCH = 500
LOGSTATS_INTERVAL_SECONDS = 60.0  # the fleet log line's period (0: off)
#: LEASED_RUN_GRACE inside a Scrapyd job (``in_scrapyd_job``): jobs scheduled together
#: start up to a poll interval (5 s) or more apart; 0 elsewhere
SCRAPYD_RUN_GRACE_SECONDS = 30.0
EMBEDDED_DIR = "leased-redis"  # under the project's .scrapy/ (embedded.embedded_data_dir)
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
    from ._redis.url import RedisUrlError, parse_redis_url, redact

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


@dataclass(frozen=True)
class LeasedConfig:
    redis_url: str | None
    crawl_id: str | None
    lease_seconds: float
    renew_interval: float
    sweep_interval: float
    max_attempts: int
    idle_poll: float
    keep_alive: bool
    revisit_after_ms: int  # LEASED_REVISIT_AFTER: queue done requests again (0: never)
    flush_on_start: bool  # LEASED_FLUSH_ON_START: a fresh run when none is on
    resume: bool  # LEASED_RESUME: a new run continues a finished crawl (not afresh)
    worker_ttl: float
    #: LEASED_RUN_GRACE: seconds a run that ended stays joinable (frontier/run.py)
    run_grace: float
    seen_bucket_bits: int
    seen_cache: int
    seen_ttl: float  # LEASED_SEEN_TTL: seconds after which a seen entry may expire (0: never)
    recover_batch: int
    prefetch: int | None  # None: the claim margin adapts (_claimsize.py)
    fail_http_codes: frozenset[int]
    retry_errors: bool
    fleet_stats: bool  # LEASED_FLEET_STATS: add this worker's Scrapy stats to the crawl's
    #: LEASED_SHARED_COOKIES: one cookie jar per ``meta['cookiejar']`` for the whole fleet
    #: (cookies.py), not one per worker
    shared_cookies: bool
    #: LEASED_SHARED_AUTOTHROTTLE: a delay one worker's AutoThrottle learnt for a download
    #: slot is adopted by the others when lower (_throttleshare.py)
    shared_autothrottle: bool
    #: LEASED_EMBEDDED_DIR as set: resolved (``embedded_dir``) only when the embedded Redis
    #: is used, so that a worker with LEASED_REDIS_URL never touches the project's .scrapy/
    embedded_dir_setting: str
    #: LEASED_FEED_FORMAT: how workers read the feed's entries: "leased" (feed/format.py
    #: parse_entry) or "scrapy-redis" (RedisSpider's start entries, parse_scrapy_redis_entry)
    feed_format: str
    embedded_server: str | None
    connect_timeout: float
    logstats_interval: float
    item_modules: tuple[str, ...]
    limits: CloseLimits  # LEASED_CLOSE_*: the fleet-wide limits (0: none)
    budgets: Budgets  # LEASED_RATE*
    upsert: UpsertConfig  # LEASED_UPSERT_*
    #: LEASED_FEED_FSYNC: fsync the feed files before each commit that acks pages
    #: (feedexports.py); they are flushed to the operating system either way
    feed_fsync: bool = False

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> LeasedConfig:
        # the sections' modules import this one (its validators): imported here
        from .ratelimit.budgets import Budgets
        from .upsert.config import UpsertConfig

        meta_types(settings)  # LEASED_META_TYPES: what it names can be imported and stored

        url = settings.get("LEASED_REDIS_URL") or None
        if url is not None:
            if not isinstance(url, str):
                raise LeasedConfigError(f"LEASED_REDIS_URL ({url!r}) must be a string.")
            check_redis_url(url)
        crawl_id = settings.get("LEASED_CRAWL_ID") or None
        if crawl_id is not None:
            check_crawl_id(crawl_id)
        lease = number_setting(settings, "LEASED_LEASE_SECONDS", LEASE_SECONDS, minimum=1,
                        exclusive=False)
        renew = number_setting(settings, "LEASED_RENEW_INTERVAL", lease / 3, minimum=0)
        if renew >= lease:
            raise LeasedConfigError(
                f"LEASED_RENEW_INTERVAL ({renew!r}) must be lower than "
                f"LEASED_LEASE_SECONDS ({lease!r}), or leases expire between renewals."
            )
        try:
            fail_codes = frozenset(int(c) for c in settings.getlist("LEASED_FAIL_HTTP_CODES"))
            if any(not 100 <= c <= 999 for c in fail_codes):
                raise ValueError
        except (TypeError, ValueError, OverflowError):
            raw = settings.get("LEASED_FAIL_HTTP_CODES")
            raise LeasedConfigError(
                f"LEASED_FAIL_HTTP_CODES ({raw!r}) must be a list of HTTP status codes."
            ) from None
        return cls(
            redis_url=url,
            crawl_id=crawl_id,
            lease_seconds=lease,
            renew_interval=renew,
            sweep_interval=number_setting(settings, "LEASED_SWEEP_INTERVAL",
                                   SWEEP_INTERVAL_SECONDS, minimum=0),
            max_attempts=number_setting(settings, "LEASED_MAX_ATTEMPTS", MAX_ATTEMPTS,
                                 minimum=1, integer=True, exclusive=False),
            idle_poll=number_setting(settings, "LEASED_IDLE_POLL", IDLE_POLL_SECONDS, minimum=0),
            keep_alive=bool_setting(settings, "LEASED_KEEP_ALIVE", False),
            revisit_after_ms=ms_setting(settings, "LEASED_REVISIT_AFTER", 0, allow_zero=True),
            flush_on_start=bool_setting(settings, "LEASED_FLUSH_ON_START", False),
            resume=bool_setting(settings, "LEASED_RESUME", False),
            worker_ttl=number_setting(settings, "LEASED_WORKER_TTL", WORKER_TTL_SECONDS, minimum=0),
            run_grace=run_grace(settings),
            seen_bucket_bits=_seen_bits(settings),
            seen_cache=number_setting(settings, "LEASED_SEEN_CACHE", SEEN_CACHE, minimum=0,
                               integer=True, exclusive=False),
            seen_ttl=_seen_ttl(settings),
            recover_batch=number_setting(settings, "LEASED_RECOVER_BATCH", RECOVER_BATCH,
                                  minimum=1, integer=True, exclusive=False),
            prefetch=number_setting(settings, "LEASED_PREFETCH", None, minimum=0, integer=True,
                             exclusive=False),
            fail_http_codes=fail_codes,
            retry_errors=bool_setting(settings, "LEASED_RETRY_ERRORS", False),
            fleet_stats=bool_setting(settings, "LEASED_FLEET_STATS", True),
            shared_cookies=bool_setting(settings, "LEASED_SHARED_COOKIES", True),
            shared_autothrottle=bool_setting(settings, "LEASED_SHARED_AUTOTHROTTLE", True),
            embedded_dir_setting=str(settings.get("LEASED_EMBEDDED_DIR") or EMBEDDED_DIR),
            feed_format=_feed_format(settings),
            embedded_server=settings.get("LEASED_EMBEDDED_SERVER") or None,
            connect_timeout=number_setting(settings, "LEASED_CONNECT_TIMEOUT",
                                           CONNECT_TIMEOUT_SECONDS, minimum=0, exclusive=False),
            logstats_interval=logstats_interval(settings),
            item_modules=tuple(item_modules(settings)),
            limits=close_limits(settings),
            budgets=Budgets.from_settings(settings),
            upsert=UpsertConfig.from_settings(settings),
            feed_fsync=bool_setting(settings, "LEASED_FEED_FSYNC", False),
        )

    @property
    def embedded_dir(self) -> Path:
        """The embedded Redis's data directory (embedded.embedded_data_dir): read only
        where the embedded Redis is used."""
        from ._redis.embedded import embedded_data_dir

        return embedded_data_dir(self.embedded_dir_setting)

    @property
    def lease_ms(self) -> int:
        return int(self.lease_seconds * 1000)

    @property
    def seen_ttl_ms(self) -> int:
        return int(self.seen_ttl * 1000)

    @property
    def prune_ms(self) -> int:
        """Registry entries of workers silent this long are removed (renew.lua)."""
        return int(self.worker_ttl * WORKER_PRUNE_TTLS * 1000)


def _seen_ttl(settings: BaseSettings) -> float:
    ttl: float = number_setting(settings, "LEASED_SEEN_TTL", 0, minimum=0, exclusive=False)
    if 0 < ttl < 1:
        raise LeasedConfigError(f"LEASED_SEEN_TTL ({settings.get('LEASED_SEEN_TTL')!r}) must "
                                "be 0 (seen entries never expire) or at least 1 second.")
    return ttl


def _seen_bits(settings: BaseSettings) -> int:
    bits: int = number_setting(settings, "LEASED_SEEN_BUCKET_BITS", SEEN_BUCKET_BITS,
                               minimum=0, integer=True, exclusive=False)
    if bits > 16:
        raw = settings.get("LEASED_SEEN_BUCKET_BITS")
        raise LeasedConfigError(f"LEASED_SEEN_BUCKET_BITS ({raw!r}) must be at most 16.")
    return bits


FEED_FORMATS = ("leased", "scrapy-redis")


def _feed_format(settings: BaseSettings) -> str:
    value = settings.get("LEASED_FEED_FORMAT") or "leased"
    if value not in FEED_FORMATS:
        raise LeasedConfigError(f"LEASED_FEED_FORMAT ({value!r}) must be one of "
                                f"{', '.join(map(repr, FEED_FORMATS))}")
    return str(value)
