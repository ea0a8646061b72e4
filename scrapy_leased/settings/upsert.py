"""The ``LEASED_UPSERT_*`` settings, parsed and validated once."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from scrapy.settings import BaseSettings

from .._redis.url import redact
from ..exceptions import LeasedConfigError
from .defaults import UPSERT_BATCH_SIZE as BATCH_SIZE
from .defaults import UPSERT_PREFIX as PREFIX
from .validate import REDIS_SCHEMES, bool_setting, check_redis_url, number_setting

SQL_SCHEMES = ("sqlite", "postgresql", "postgres")
_PREFIX_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,39}$")
_FIELD_RE = re.compile(r"^\S+$")


@dataclass(frozen=True)
class UpsertConfig:
    enabled: bool
    #: None: the crawl's own Redis; else a redis://, rediss://, unix://, sqlite:// or
    #: postgresql:// URL.
    url: str | None
    #: Field names from LEASED_UPSERT_KEY; None: per item class, else DEFAULT_KEY.
    key_fields: tuple[str, ...] | None
    prefix: str
    batch_size: int

    @property
    def backend(self) -> str:
        """``redis``, ``sqlite`` or ``postgresql``."""
        if self.url is None:
            return "redis"
        scheme = urlsplit(self.url).scheme
        if scheme == "sqlite":
            return "sqlite"
        if scheme in ("postgresql", "postgres"):
            return "postgresql"
        return "redis"

    @property
    def sqlite_path(self) -> Path:
        """The file of a ``sqlite:///relative.db`` or ``sqlite:////absolute.db`` URL."""
        assert self.url is not None
        return Path(self.url[len("sqlite:///"):])

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> UpsertConfig:
        url = _url(settings)
        return cls(
            # Off unless told where records go (LEASED_UPSERT_URL) or switched on: an
            # existing project's items reach its own pipelines and feeds untouched.
            enabled=bool_setting(settings, "LEASED_UPSERT_ENABLED", url is not None),
            url=url,
            key_fields=_key_fields(settings),
            prefix=_prefix(settings),
            batch_size=number_setting(settings, "LEASED_UPSERT_BATCH_SIZE", BATCH_SIZE, minimum=1,
                               integer=True, exclusive=False),
        )


def _url(settings: BaseSettings) -> str | None:
    url = settings.get("LEASED_UPSERT_URL") or None
    if url is None:
        return None
    if not isinstance(url, str):
        raise LeasedConfigError(f"LEASED_UPSERT_URL ({url!r}) must be a string.")
    scheme = urlsplit(url).scheme
    if scheme == "sqlite":
        if not url.startswith("sqlite:///") or len(url) == len("sqlite:///"):
            raise LeasedConfigError(
                f"LEASED_UPSERT_URL ({url!r}) must name a file: sqlite:///relative/file.db "
                "or sqlite:////absolute/file.db."
            )
        return url
    if scheme in SQL_SCHEMES:
        return url
    if scheme in REDIS_SCHEMES:  # the reason a Redis URL is wrong, naming the setting
        return check_redis_url(url, "LEASED_UPSERT_URL")
    raise LeasedConfigError(
        f"LEASED_UPSERT_URL ({redact(url)!r}) must be a redis://, rediss://, unix://, "
        "redis+sentinel://, redis+cluster:// (rediss+...: TLS), sqlite:/// or postgresql:// "
        "URL (or unset: the crawl's Redis)."
    )


def _key_fields(settings: BaseSettings) -> tuple[str, ...] | None:
    raw = settings.get("LEASED_UPSERT_KEY")
    if raw is None or raw == "" or raw == []:
        return None
    try:
        fields = tuple(f.strip() if isinstance(f, str) else f
                       for f in settings.getlist("LEASED_UPSERT_KEY"))
    except (TypeError, ValueError):
        fields = ()
    if not fields or not all(isinstance(f, str) and _FIELD_RE.match(f) for f in fields) \
            or len(set(fields)) != len(fields):
        raise LeasedConfigError(
            f"LEASED_UPSERT_KEY ({raw!r}) must be a field name or a list of distinct field "
            "names (comma-separated on the command line), e.g. 'url' or ['site', 'sku']."
        )
    return fields


def _prefix(settings: BaseSettings) -> str:
    raw = settings.get("LEASED_UPSERT_PREFIX")
    if raw is None or raw == "":
        return PREFIX
    if not (isinstance(raw, str) and _PREFIX_RE.match(raw)):
        raise LeasedConfigError(
            f"LEASED_UPSERT_PREFIX ({raw!r}) must be a letter or underscore followed by "
            "letters, digits or underscores (at most 40): it starts SQL table names."
        )
    return raw
