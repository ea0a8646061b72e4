"""Coming from scrapy-redis: find its keys of a spider, move its pending requests.

scrapy-redis (its defaults, ``scrapy_redis/defaults.py``) keeps a spider's state in:

- ``SCHEDULER_QUEUE_KEY`` (``%(spider)s:requests``): the pending requests, each
  ``request.to_dict(spider=...)`` serialized by ``SCHEDULER_SERIALIZER`` (pickle,
  ``scrapy_redis.picklecompat``, unless set), in a ZSET scored ``-priority``
  (``PriorityQueue``, the default) or a LIST (``FifoQueue``, ``LifoQueue``);
- ``SCHEDULER_DUPEFILTER_KEY`` (``%(spider)s:dupefilter``): a SET of its own SHA1
  fingerprints (of the method, URL, body and meta, not Scrapy's fingerprinter): they
  cannot be turned into this crawl's, so they are not carried over;
- ``REDIS_START_URLS_KEY`` (``%(name)s:start_urls``): a RedisSpider's start entries, a
  LIST (a SET with ``REDIS_START_URLS_AS_SET``, a ZSET with ``REDIS_START_URLS_AS_ZSET``)
  of URLs or JSON objects (feed/format.py ``parse_scrapy_redis_entry``).

``find`` looks for them (EXISTS, TYPE and a length: read-only), so that a worker and
``scrapy leased status`` can say that a crawl has scrapy-redis state next to it;
``Migration`` moves them into the crawl (``scrapy leased from-scrapy-redis``, the
migration guide: docs/from-scrapy-redis.md).
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from scrapy import Request, Spider
from scrapy.settings import Settings
from scrapy.utils.request import request_from_dict

from ..frontier import NewRequest
from ..meta import shown
from .crawl import to_feed_request
from .format import parse_scrapy_redis_entry
from .packer import RequestPacker

QUEUE_KEY = "%(spider)s:requests"  # scrapy_redis.defaults.SCHEDULER_QUEUE_KEY
DUPEFILTER_KEY = "%(spider)s:dupefilter"  # SCHEDULER_DUPEFILTER_KEY
START_URLS_KEY = "%(name)s:start_urls"  # START_URLS_KEY (REDIS_START_URLS_KEY)
PICKLE_SERIALIZERS = frozenset({"scrapy_redis.picklecompat", "pickle", "cPickle"})
#: entries moved per step: pushed into the crawl, then removed from the source
MOVE_BATCH = 500
COMMAND = "scrapy leased from-scrapy-redis"


class MigrationError(ValueError):
    """Nothing (more) can be moved; the message names the key, entry or flag at fault."""


@dataclass(frozen=True)
class SourceKeys:
    queue: str
    dupefilter: str
    start_urls: str

    @classmethod
    def of(cls, spider: str, settings: Settings | None = None, *, queue: str | None = None,
           dupefilter: str | None = None, start_urls: str | None = None) -> SourceKeys:
        """The keys scrapy-redis uses for ``spider``: the given names, else its settings
        when the project still has them, else its defaults."""
        def name(given: str | None, setting: str, default: str, field: str) -> str:
            value = given or (settings.get(setting) if settings is not None else None) \
                or default
            try:
                return str(value) % {field: spider}
            except (KeyError, ValueError, TypeError):
                return str(value)
        return cls(name(queue, "SCHEDULER_QUEUE_KEY", QUEUE_KEY, "spider"),
                   name(dupefilter, "SCHEDULER_DUPEFILTER_KEY", DUPEFILTER_KEY, "spider"),
                   name(start_urls, "REDIS_START_URLS_KEY", START_URLS_KEY, "name"))


@dataclass(frozen=True)
class Found:
    key: str
    role: str  # queue, dupefilter, start_urls
    type: str  # zset, list, set, ...
    size: int


_SIZE = {"zset": "zcard", "list": "llen", "set": "scard"}


async def find(client: Any, keys: SourceKeys) -> list[Found]:
    """The scrapy-redis keys that exist (read-only: EXISTS, TYPE, and ZCARD, LLEN or
    SCARD); a Redis error is the caller's to handle."""
    out = []
    for role, key in (("queue", keys.queue), ("start_urls", keys.start_urls),
                      ("dupefilter", keys.dupefilter)):
        if not await client.exists(key):
            continue
        kind = await client.type(key)
        kind = kind.decode() if isinstance(kind, bytes) else str(kind)
        size = int(await getattr(client, _SIZE[kind])(key)) if kind in _SIZE else 0
        out.append(Found(key, role, kind, size))
    return out


def warning(found: Sequence[Found], spider: str, crawl_exists: bool) -> str | None:
    """What to tell the user about scrapy-redis keys found next to the crawl, or None
    when nothing is worth saying: pending entries (a queue or start URLs), or a
    dupefilter of a spider whose crawl has not started here yet."""
    pending = [f for f in found if f.role != "dupefilter" and f.size]
    if not pending and (crawl_exists or not found):
        return None
    what = ", ".join(f"{f.key} ({f.type}, {f.size:,} "
                     f"{'fingerprints' if f.role == 'dupefilter' else 'entries'})"
                     for f in found)
    todo = (f"its pending requests are not crawled by scrapy_leased until moved: `{COMMAND} "
            f"{spider} --pickle` (--pickle when its queue is pickled, scrapy-redis's "
            f"default)" if pending else f"`{COMMAND} {spider} --seen-urls FILE`")
    return (f"scrapy-redis state of spider {spider!r} in this Redis: {what}; {todo}, and "
            f"`--seen-urls FILE` marks the URLs it crawled already as seen (its "
            f"dupefilter's fingerprints cannot be carried over): docs/from-scrapy-redis.md")


# -- reading the queue -----------------------------------------------------------------


def serializer_of(settings: Settings, allow_pickle: bool) -> Callable[[bytes], Any]:
    """How to read a queue entry: ``SCHEDULER_SERIALIZER`` as scrapy-redis reads it (a
    module with ``loads``; pickle when unset). Pickle only with ``allow_pickle``
    (unpickling runs code): MigrationError naming ``--pickle`` otherwise."""
    name = settings.get("SCHEDULER_SERIALIZER") or "scrapy_redis.picklecompat"
    if not isinstance(name, str):
        name = getattr(name, "__name__", repr(name))
    if name == "json":
        return lambda raw: json.loads(raw)
    if name in PICKLE_SERIALIZERS:
        if not allow_pickle:
            raise MigrationError(
                f"the scrapy-redis queue is pickled (SCHEDULER_SERIALIZER {name!r}, "
                f"scrapy-redis's default): reading it unpickles each entry, which runs "
                f"whatever code the entry names; only if this Redis is trusted, add "
                f"--pickle (or set SCHEDULER_SERIALIZER to the serializer the crawl used)")
        import pickle

        return lambda raw: pickle.loads(raw)  # the user asked for it: --pickle
    try:  # the module the project named, as scrapy-redis imports it
        module = importlib.import_module(name)
    except ImportError as exc:
        raise MigrationError(f"SCHEDULER_SERIALIZER ({name!r}) cannot be imported: "
                             f"{exc}") from None
    loads = getattr(module, "loads", None)
    if not callable(loads):
        raise MigrationError(f"SCHEDULER_SERIALIZER ({name!r}) has no loads()")
    return loads  # type: ignore[no-any-return]


def _request_class_allowed(path: Any) -> bool:
    """A request class named in an entry (``_class``) that request_from_dict may load:
    one of a module already imported (Scrapy's, the project's), so nothing is imported
    because an entry names it."""
    if not isinstance(path, str) or "." not in path:
        return False
    module, _, attr = path.rpartition(".")
    cls = getattr(sys.modules.get(module), attr, None)
    return isinstance(cls, type) and issubclass(cls, Request)


def decode_queue_entry(raw: bytes, loads: Callable[[bytes], Any],
                       spidercls: type[Spider]) -> Request:
    """A scrapy-redis queue entry as the Request it was: Scrapy's request_from_dict with
    the spider (its callback and errback are the spider's methods of those names)."""
    d = loads(raw)
    if not isinstance(d, dict) or not isinstance(d.get("url"), str):
        raise MigrationError(f"not a request dict ({type(d).__name__})")
    if "_class" in d and not _request_class_allowed(d["_class"]):
        raise MigrationError(f"request class {shown(d['_class'])} is not an imported "
                             f"subclass of scrapy.Request")
    try:
        # the class: request_from_dict only looks its callback and errback up on it
        return request_from_dict(d, spider=spidercls)  # type: ignore[arg-type]
    except ValueError as exc:  # a method not found on the spider
        raise MigrationError(str(exc)) from None


# -- moving ----------------------------------------------------------------------------


def _member(item: Any) -> bytes:
    return item if isinstance(item, bytes) else str(item).encode()


async def source_type(client: Any, key: str) -> str:
    """The Redis type of a queue or start URLs key ("none" when absent); MigrationError
    for a type scrapy-redis does not use there."""
    kind = await client.type(key)
    kind = kind.decode() if isinstance(kind, bytes) else str(kind)
    if kind not in ("none", "zset", "list", "set"):
        raise MigrationError(f"{key} is a Redis {kind}, not a scrapy-redis queue (a zset or "
                             f"a list) or start URLs (a list, set or zset)")
    return kind


async def every_entry(client: Any, key: str, kind: str) -> AsyncIterator[list[bytes]]:
    """Every entry of the key, ``MOVE_BATCH`` at a time, without changing it (the check
    before anything is moved)."""
    if kind == "set":
        cursor: Any = 0
        while True:
            cursor, part = await client.sscan(key, cursor, count=MOVE_BATCH)
            if part:
                yield [_member(m) for m in part]
            if int(cursor) == 0:
                return
    read = client.zrange if kind == "zset" else client.lrange
    i = 0
    while True:
        part = await read(key, i, i + MOVE_BATCH - 1)
        if not part:
            return
        yield [_member(m) for m in part]
        i += MOVE_BATCH


async def next_entries(client: Any, key: str, kind: str) -> list[bytes]:
    """The next ``MOVE_BATCH`` entries to move, in the order scrapy-redis takes them: a
    ZSET's lowest scores (the highest priorities) first, a LIST's tail first (the order
    FifoQueue pops, LPUSH then RPOP), a SET's in any order."""
    if kind == "zset":
        part = await client.zrange(key, 0, MOVE_BATCH - 1)
    elif kind == "list":
        part = list(reversed(await client.lrange(key, -MOVE_BATCH, -1)))
    elif kind == "set":
        part = await client.srandmember(key, MOVE_BATCH)
    else:
        part = []
    return [_member(m) for m in part or ()]


async def remove_source(client: Any, key: str, kind: str, members: Sequence[bytes]) -> int:
    """Remove these entries (the crawl has them) from the source key, one each; how many
    were removed."""
    if not members:
        return 0
    if kind == "zset":
        return int(await client.zrem(key, *members))
    if kind == "set":
        return int(await client.srem(key, *members))
    async with client.pipeline(transaction=False) as p:
        for m in members:
            p.lrem(key, -1, m)  # from the tail, where next_entries read it
        return sum(int(n) for n in await p.execute())


def pack_queue(entries: Sequence[bytes], loads: Callable[[bytes], Any],
               spidercls: type[Spider], packer: RequestPacker, key: str) -> list[NewRequest]:
    out = []
    for raw in entries:
        try:
            request = decode_queue_entry(raw, loads, spidercls)
            fed = to_feed_request(request)
            out.append(packer.pack(fed.request, fed.names))
        except Exception as exc:  # an unreadable entry: named, nothing of it moved
            why = str(exc) if isinstance(exc, MigrationError) else \
                f"{type(exc).__name__}: {exc}"
            raise MigrationError(f"{key}: entry {shown(raw, 200)} cannot be read: "
                                 f"{why}") from None
    return out


def pack_start_urls(entries: Sequence[bytes], packer: RequestPacker,
                    key: str) -> list[NewRequest]:
    out = []
    for raw in entries:
        try:
            fed = parse_scrapy_redis_entry(raw)
            out.append(packer.pack(fed.request, fed.names))
        except Exception as exc:
            raise MigrationError(f"{key}: entry {shown(raw, 200)} cannot be read: "
                                 f"{exc}") from None
    return out
