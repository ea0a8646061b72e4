"""``LeasedConfig``: every ``LEASED_*`` setting of a crawl, parsed and validated once.

``LeasedConfig.from_settings`` reads them all (its sections: ``budgets``, the rate
settings, ``rate.Budgets``; ``upsert``, the ``LEASED_UPSERT_*`` settings,
``upsert.UpsertConfig``; each with the rules of ``validate.py`` and the defaults of
``defaults.py``), so one call checks a project's settings and names the first bad one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from scrapy.settings import BaseSettings

from ..codec import item_modules, meta_types
from ..exceptions import LeasedConfigError
from ..frontier import CloseLimits
from .defaults import (
    CONNECT_TIMEOUT_SECONDS,
    EMBEDDED_DIR,
    IDLE_POLL_SECONDS,
    LEASE_SECONDS,
    MAX_ATTEMPTS,
    RECOVER_BATCH,
    SEEN_BUCKET_BITS,
    SEEN_CACHE,
    SWEEP_INTERVAL_SECONDS,
    WORKER_PRUNE_TTLS,
    WORKER_TTL_SECONDS,
)
from .rate import Budgets
from .upsert import UpsertConfig
from .validate import (
    bool_setting,
    check_crawl_id,
    check_redis_url,
    close_limits,
    logstats_interval,
    ms_setting,
    number_setting,
    run_grace,
)

if TYPE_CHECKING:
    from scrapy.crawler import Crawler


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
    #: (worker/cookies.py), not one per worker
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
    #: (worker/feedexports.py); they are flushed to the operating system either way
    feed_fsync: bool = False
    #: LEASED_GC_FREEZE: once open, the worker's start-up objects are kept out of
    #: Python's full garbage collections while it crawls (worker/gcfreeze.py)
    gc_freeze: bool = True

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> LeasedConfig:
        meta_types(settings)  # LEASED_META_TYPES: what it names can be imported and stored
        url, crawl_id = _redis_url(settings), _crawl_id(settings)
        lease, renew = _lease(settings)
        fail_codes = _fail_codes(settings)
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
            gc_freeze=bool_setting(settings, "LEASED_GC_FREEZE", True),
        )

    @property
    def embedded_dir(self) -> Path:
        """The embedded Redis's data directory (embedded.embedded_data_dir): read only
        where the embedded Redis is used."""
        from .._redis.embedded import embedded_data_dir

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


def _redis_url(settings: BaseSettings) -> str | None:
    url = settings.get("LEASED_REDIS_URL") or None
    if url is not None:
        if not isinstance(url, str):
            raise LeasedConfigError(f"LEASED_REDIS_URL ({url!r}) must be a string.")
        check_redis_url(url)
    return url


def _crawl_id(settings: BaseSettings) -> str | None:
    crawl_id = settings.get("LEASED_CRAWL_ID") or None
    if crawl_id is not None:
        check_crawl_id(crawl_id)
    return crawl_id


def _lease(settings: BaseSettings) -> tuple[float, float]:
    """LEASED_LEASE_SECONDS and LEASED_RENEW_INTERVAL (a third of it by default)."""
    lease = number_setting(settings, "LEASED_LEASE_SECONDS", LEASE_SECONDS, minimum=1,
                           exclusive=False)
    renew = number_setting(settings, "LEASED_RENEW_INTERVAL", lease / 3, minimum=0)
    if renew >= lease:
        raise LeasedConfigError(
            f"LEASED_RENEW_INTERVAL ({renew!r}) must be lower than "
            f"LEASED_LEASE_SECONDS ({lease!r}), or leases expire between renewals."
        )
    return lease, renew


def _fail_codes(settings: BaseSettings) -> frozenset[int]:
    try:
        fail_codes = frozenset(int(c) for c in settings.getlist("LEASED_FAIL_HTTP_CODES"))
        if any(not 100 <= c <= 999 for c in fail_codes):
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        raw = settings.get("LEASED_FAIL_HTTP_CODES")
        raise LeasedConfigError(
            f"LEASED_FAIL_HTTP_CODES ({raw!r}) must be a list of HTTP status codes."
        ) from None
    return fail_codes


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


#: where ``config_for`` keeps a crawler's LeasedConfig
_ATTRIBUTE = "_leased_config"


def config_for(crawler: Crawler) -> LeasedConfig:
    """The crawl's LeasedConfig, read once per crawler (its settings are frozen by the
    time components are built) and shared by every component of the add-on."""
    config: LeasedConfig | None = getattr(crawler, _ATTRIBUTE, None)
    if config is None:
        config = LeasedConfig.from_settings(crawler.settings)
        setattr(crawler, _ATTRIBUTE, config)
    return config
