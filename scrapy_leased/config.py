"""All ``LEASED_*`` settings, parsed and validated once."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scrapy.settings import BaseSettings
from scrapy.utils.project import data_path

from .connection import CONNECT_TIMEOUT_SECONDS  # how long a starting worker waits for Redis

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
EMBEDDED_DIR = "leased-redis"  # under the project's .scrapy/ (scrapy.utils.project.data_path)
REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+sentinel", "redis+cluster")
CRAWL_ID_RE = re.compile(r"^[^{}\s]+$")  # it becomes the keys' {hash tag}


class LeasedConfigError(ValueError):
    """A ``LEASED_*`` setting has a bad value; the message names it."""


def number_setting(settings: BaseSettings, name: str, default: float, *, minimum: float,
                   integer: bool = False, exclusive: bool = True) -> Any:
    """Setting ``name`` as a number (an int with ``integer``), above ``minimum`` (at least
    it, without ``exclusive``); ``default`` when unset; else LeasedConfigError."""
    raw = settings.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw) if integer else float(raw)
        if integer and float(raw) != value:
            raise ValueError
    except (TypeError, ValueError):
        kind = "an integer" if integer else "a number"
        raise LeasedConfigError(f"{name} ({raw!r}) must be {kind}.") from None
    if value < minimum or (exclusive and value == minimum):
        bound = "higher than" if exclusive else "at least"
        raise LeasedConfigError(f"{name} ({raw!r}) must be {bound} {minimum}.")
    return value


def bool_setting(settings: BaseSettings, name: str, default: bool) -> bool:
    """Setting ``name`` as a boolean; ``default`` when unset; else LeasedConfigError."""
    try:
        return settings.getbool(name, default)
    except ValueError:
        raise LeasedConfigError(
            f"{name} ({settings.get(name)!r}) must be a boolean (True/False, 1/0)."
        ) from None


def check_redis_url(url: str, name: str = "LEASED_REDIS_URL") -> str:
    """``url`` if it names a Redis (one server, a Sentinel master or a Cluster: see
    topology.py), else LeasedConfigError naming the setting."""
    from .topology import RedisUrlError, parse_redis_url, redact

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
    worker_ttl: float
    seen_bucket_bits: int
    seen_cache: int
    recover_batch: int
    prefetch: int
    fail_http_codes: frozenset[int]
    retry_errors: bool
    embedded_dir: Path
    embedded_server: str | None
    connect_timeout: float = CONNECT_TIMEOUT_SECONDS

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> LeasedConfig:
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
        except (TypeError, ValueError):
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
            worker_ttl=number_setting(settings, "LEASED_WORKER_TTL", WORKER_TTL_SECONDS, minimum=0),
            seen_bucket_bits=_seen_bits(settings),
            seen_cache=number_setting(settings, "LEASED_SEEN_CACHE", SEEN_CACHE, minimum=0,
                               integer=True, exclusive=False),
            recover_batch=number_setting(settings, "LEASED_RECOVER_BATCH", RECOVER_BATCH,
                                  minimum=1, integer=True, exclusive=False),
            prefetch=number_setting(settings, "LEASED_PREFETCH", 0, minimum=0, integer=True,
                             exclusive=False),
            fail_http_codes=fail_codes,
            retry_errors=bool_setting(settings, "LEASED_RETRY_ERRORS", False),
            embedded_dir=Path(data_path(settings.get("LEASED_EMBEDDED_DIR") or EMBEDDED_DIR)),
            embedded_server=settings.get("LEASED_EMBEDDED_SERVER") or None,
            connect_timeout=number_setting(settings, "LEASED_CONNECT_TIMEOUT", CONNECT_TIMEOUT_SECONDS,
                                    minimum=0, exclusive=False),
        )

    @property
    def lease_ms(self) -> int:
        return int(self.lease_seconds * 1000)

    @property
    def prune_ms(self) -> int:
        """Registry entries of workers silent this long are removed (renew.lua)."""
        return int(self.worker_ttl * WORKER_PRUNE_TTLS * 1000)


def _seen_bits(settings: BaseSettings) -> int:
    bits = number_setting(settings, "LEASED_SEEN_BUCKET_BITS", SEEN_BUCKET_BITS, minimum=0,
                   integer=True, exclusive=False)
    if bits > 16:
        raw = settings.get("LEASED_SEEN_BUCKET_BITS")
        raise LeasedConfigError(f"LEASED_SEEN_BUCKET_BITS ({raw!r}) must be at most 16.")
    return bits
