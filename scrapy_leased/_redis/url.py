"""Which Redis a crawl uses, read from its URL: one server, the master of a Sentinel
group, or a Redis Cluster (``client.build_client`` builds the redis-py client).

URL formats (README, "Sentinel and Cluster")::

    redis://[[user]:password@]host[:port][/db]     one server: redis-py's own format
    rediss://...                                   (TLS), unix:///path/redis.sock[?db=N]
    redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/master_name[/db]
        [?sentinel_password=...&sentinel_username=...]
    redis+cluster://[[user]:password@]host[:port][,host[:port]...][/0]
    rediss+sentinel://..., rediss+cluster://...  (TLS)

The Sentinel form is the one of redis-sentinel-url, Prefect and RedisVL: the hosts are
the sentinels (port 26379 unless given), the path names the master and the database,
the user and password are those of the Redis servers, ``sentinel_password`` (and
``sentinel_username``) those of the sentinels. The Cluster form lists startup nodes
(port 6379 unless given); redis-py finds the others. Both also take the query options
``socket_timeout``, ``socket_connect_timeout``, ``socket_keepalive`` and
``health_check_interval`` and ``max_connections`` (the pool's size: past it a command
waits for a connection, POOL_WAIT_SECONDS at most). Every form but the Cluster one takes
``wait_replicas=N`` (scripts.py: WAIT N after the writes a worker acts on).

TLS: ``rediss+sentinel://`` and ``rediss+cluster://`` (to the sentinels and the
servers, to every cluster node), with redis-py's options of ``rediss://``:
``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``, ``ssl_cert_reqs``,
``ssl_check_hostname``.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

logger = logging.getLogger(__name__)

SERVER_SCHEMES = ("redis", "rediss", "unix")
SENTINEL_SCHEME = "redis+sentinel"
CLUSTER_SCHEME = "redis+cluster"
#: the same over TLS (to the sentinels and the servers, to every cluster node)
TLS_SENTINEL_SCHEME = "rediss+sentinel"
TLS_CLUSTER_SCHEME = "rediss+cluster"
SCHEMES = SERVER_SCHEMES + (SENTINEL_SCHEME, CLUSTER_SCHEME, TLS_SENTINEL_SCHEME,
                            TLS_CLUSTER_SCHEME)
SENTINEL_PORT = 26379
CLUSTER_PORT = 6379

#: Connections of one client to one server (redis-py's default). Past it, a command
#: waits for a connection to come free instead of failing ("Too many connections",
#: redis-py's asyncio pools): up to POOL_WAIT_SECONDS, then a ConnectionError (retried).
POOL_SIZE = 100
POOL_WAIT_SECONDS = 30.0

# Query options of a Sentinel or Cluster URL (redis-py's names and parsers).
_BOOL = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}
_OPTIONS: dict[str, Any] = {
    "socket_timeout": float,
    "socket_connect_timeout": float,
    "socket_keepalive": lambda v: _BOOL[v.lower()],
    "health_check_interval": int,
    "max_connections": int,
    # TLS (rediss+sentinel://, rediss+cluster://): redis-py's names, as rediss:// takes
    "ssl_ca_certs": str,
    "ssl_certfile": str,
    "ssl_keyfile": str,
    "ssl_cert_reqs": lambda v: {"none": "none", "optional": "optional",
                                "required": "required"}[v.lower()],
    "ssl_check_hostname": lambda v: _BOOL[v.lower()],
}
_TLS_OPTIONS = tuple(name for name in _OPTIONS if name.startswith("ssl_"))
_SENTINEL_OPTIONS = ("sentinel_password", "sentinel_username")
_SECRET_QUERY = re.compile(r"((?:^|[?&])(?:sentinel_)?password=)[^&]*")


class RedisUrlError(ValueError):
    """The URL cannot name a Redis; the message says why (without the setting)."""


@dataclass(frozen=True)
class RedisTarget:
    """A parsed crawl Redis URL."""

    kind: str  # "server", "sentinel" or "cluster"
    url: str  # without the options of this module (wait_replicas)
    hosts: tuple[tuple[str, int], ...] = ()  # sentinels, or cluster startup nodes
    master_name: str | None = None  # Sentinel: the master's name
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    #: WAIT for this many replicas after the writes a worker acts on (Scripts.waited)
    wait_replicas: int = 0
    tls: bool = False  # rediss+sentinel://, rediss+cluster:// (rediss:// is redis-py's)


def redact(url: str) -> str:
    """The URL without its passwords (user info and ``sentinel_password``), for logs."""
    parts = urlsplit(url)
    netloc, query = parts.netloc, parts.query
    if "@" in netloc:
        userinfo, _, hosts = netloc.rpartition("@")
        user, colon, _password = userinfo.partition(":")
        if colon:
            netloc = f"{user}:***@{hosts}"
    query = _SECRET_QUERY.sub(r"\1***", query)
    return parts._replace(netloc=netloc, query=query).geturl()


def parse_redis_url(url: str) -> RedisTarget:
    """Parse a crawl's Redis URL; raises RedisUrlError."""
    scheme = urlsplit(url).scheme.lower() if "://" in url else ""
    if scheme not in SCHEMES:
        raise RedisUrlError("must be a redis://, rediss:// (TLS), unix://, redis+sentinel:// "
                            "or redis+cluster:// URL (rediss+sentinel://, rediss+cluster:// "
                            "for TLS)")
    url, wait = _pop_wait_replicas(url)
    if scheme in SERVER_SCHEMES:
        return RedisTarget("server", url, wait_replicas=wait)
    tls = scheme in (TLS_SENTINEL_SCHEME, TLS_CLUSTER_SCHEME)
    if tls:
        scheme = scheme.replace("rediss+", "redis+")
    if scheme == CLUSTER_SCHEME and wait:
        raise RedisUrlError("has wait_replicas, which redis+cluster:// URLs do not support")
    rest = url.split("://", 1)[1]
    rest, _, query = rest.partition("?")  # (its values may hold "/": certificate paths)
    netloc, _, path = rest.partition("/")
    username = password = None
    if "@" in netloc:
        userinfo, _, netloc = netloc.rpartition("@")
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon and secret else None
    default_port = SENTINEL_PORT if scheme == SENTINEL_SCHEME else CLUSTER_PORT
    hosts = tuple(_host_port(part, default_port) for part in netloc.split(","))
    options, extra = _query_options(query, sentinel=scheme == SENTINEL_SCHEME)
    ssl = [name for name in options if name in _TLS_OPTIONS]
    if ssl and not tls:
        raise RedisUrlError(f"has {ssl[0]}, a TLS option: use rediss+"
                            f"{scheme.partition('+')[2]}:// for TLS")
    segments = [unquote(s) for s in path.split("/") if s]
    if scheme == SENTINEL_SCHEME:
        if not segments:
            raise RedisUrlError("must name the master after the sentinels: "
                                "redis+sentinel://host:26379[,host:26379...]/mymaster[/db]")
        if len(segments) > 2:
            raise RedisUrlError("has a path with more than a master name and a database "
                                "number: redis+sentinel://hosts/mymaster/0")
        db = _db(segments[1]) if len(segments) == 2 else 0
        return RedisTarget("sentinel", url, hosts, segments[0], db, username, password,
                           extra.get("sentinel_username"), extra.get("sentinel_password"),
                           options, wait, tls)
    if segments and (len(segments) > 1 or _db(segments[0]) != 0):
        raise RedisUrlError("names a database other than 0: Redis Cluster has only "
                            "database 0 (redis+cluster://host:port[,host:port...])")
    return RedisTarget("cluster", url, hosts, None, 0, username, password, options=options,
                       tls=tls)


def _pop_wait_replicas(url: str) -> tuple[str, int]:
    """(the URL without its ``wait_replicas`` option, that option's value or 0)."""
    base, sep, query = url.partition("?")
    if not sep:
        return url, 0
    kept, wait = [], 0
    for item in query.split("&"):
        name, _, value = item.partition("=")
        if name != "wait_replicas":
            kept.append(item)
            continue
        if not value.isdigit():
            raise RedisUrlError(f"has wait_replicas={value!r}: a number of replicas, at least 0")
        wait = int(value)
    return (f"{base}?{'&'.join(kept)}" if kept else base), wait


def _host_port(part: str, default_port: int) -> tuple[str, int]:
    part = part.strip()
    if part.startswith("["):  # [IPv6]:port
        host, _, port = part[1:].partition("]")
        port = port[1:] if port.startswith(":") else ""
    else:
        host, _, port = part.rpartition(":") if ":" in part else (part, "", "")
    if not host:
        raise RedisUrlError(f"has an empty host in {part!r}: list host[:port] entries "
                            "separated by commas")
    if not port:
        return host, default_port
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise RedisUrlError(f"has an invalid port in {part!r}")
    return host, int(port)


def _db(text: str) -> int:
    if not text.isdigit():
        raise RedisUrlError(f"has {text!r} where a database number belongs")
    return int(text)


def _query_options(query: str, sentinel: bool) -> tuple[dict[str, Any], dict[str, str]]:
    options: dict[str, Any] = {}
    extra: dict[str, str] = {}
    for name, values in parse_qs(query, keep_blank_values=True).items():
        value = values[-1]
        if sentinel and name in _SENTINEL_OPTIONS:
            extra[name] = value
            continue
        parser = _OPTIONS.get(name)
        if parser is None:
            known = sorted(_OPTIONS) + (list(_SENTINEL_OPTIONS) if sentinel else [])
            raise RedisUrlError(f"has an unknown option {name!r} (known: {', '.join(known)})")
        try:
            options[name] = parser(value)
        except (KeyError, TypeError, ValueError):
            raise RedisUrlError(f"has an invalid value for {name!r}") from None
    return options, extra


# --------------------------------------------------------------------------- clients
