"""Scrapy's feed exports (FEEDS, ``-o``/``-O``) in a fleet: durable before the ack, one
file per worker.

**Durable before the ack.** Scrapy's FeedExporter writes each item to its feed file when
the item is scraped, through the file's buffer (8 KiB): a worker killed with ``kill -9``
loses what the buffer holds. The pages of those items may be acked already, and an acked
page is never fetched again: its items would be lost for good. So the add-on stores local
feeds through ``LeasedFileFeedStorage`` (and ``-o -`` through ``LeasedStdoutFeedStorage``),
which note every feed file they open in the crawler's ``ExportFiles``; before each commit
that acks pages (frontier/writer.py: ``before_acks``), the scheduler flushes every open
feed file to the operating system, and, with ``LEASED_FEED_FSYNC``, waits for ``fsync``
(in a thread) too. ``kill -9`` keeps what the operating system has; ``fsync`` also keeps
it through a power loss. The items of pages not acked yet may be in the file and are
written again by the worker that processes those pages again: at-least-once, as every
write of the add-on.

Not covered (docs/per-process.md): feeds stored elsewhere (S3, GCS, FTP: Scrapy uploads
them when the worker closes), feeds with ``postprocessing`` (a compressor holds items
until it is closed), an exporter with a buffer of its own, and a project's own storage
for ``file``: the add-on warns about each at open.

**One file per worker.** ``%(worker)s`` in a feed URI is the worker's id (``host:pid:
random``, frontier/workerid.py) made file-name safe (``host-pid-random``): unique in the
fleet, the same for the whole life of the process. The add-on sets FEED_URI_PARAMS to a
``WorkerUriParams`` that adds it, then calls the project's own function, if it set one.
A worker whose local feed file is one that a live worker of the crawl on the same host
writes stops at open with an error naming FEEDS and the file (``claim_paths``: the
check and the record are one script, lua/exports_enter.lua).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import socket
from typing import IO, TYPE_CHECKING, Any
from urllib.parse import urlparse
from weakref import WeakKeyDictionary

from scrapy.extensions.feedexport import (
    FeedExporter,
    FileFeedStorage,
    StdoutFeedStorage,
)
from scrapy.utils.misc import load_object
from w3lib.url import file_uri_to_path

from .._compat import apply_uri_params
from ..frontier.keys import CrawlKeys
from ..frontier.scripts import Scripts, as_str
from ..runtime import worker_of
from ..settings import config_for

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.settings import Settings
    from typing_extensions import Self

logger = logging.getLogger(__name__)

#: worker/lua/exports_enter.lua: a worker's feed files, unless another live worker has them
SCRIPTS = Scripts("scrapy_leased.worker", {"exports_enter": ("lib_time",)})
#: The feed URI parameter naming the worker: ``FEEDS = {"items-%(worker)s.jsonl": ...}``
WORKER_PARAM = "worker"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")

_registries: WeakKeyDictionary[Any, ExportFiles] = WeakKeyDictionary()


class FeedCollisionError(RuntimeError):
    """A live worker of the crawl on this host writes one of this worker's feed files."""


def file_name_safe(text: str) -> str:
    """``text`` with every run of characters other than letters, digits, ``.``, ``_``
    and ``-`` replaced by one ``-``."""
    return _UNSAFE.sub("-", text).strip("-") or "worker"


def worker_name(crawler: Crawler) -> str:
    """The value of ``%(worker)s``: the worker id of the crawl's LeasedScheduler, file-name
    safe; ``host-pid`` when the project uses another scheduler."""

    scheduler = worker_of(crawler)
    if scheduler is not None:
        return file_name_safe(scheduler.worker_id)
    return file_name_safe(f"{socket.gethostname()}-{os.getpid()}")


class WorkerUriParams:
    """FEED_URI_PARAMS set by the add-on: adds ``worker`` (``worker_name``) to the
    feed URI parameters, then calls the project's own function (``inner``, a callable
    or its import path), which sees it and may change it."""

    def __init__(self, inner: Any = None) -> None:
        self.inner = inner

    def __call__(self, params: dict[str, Any], spider: Spider) -> dict[str, Any]:
        params[WORKER_PARAM] = worker_name(spider.crawler)
        if self.inner:
            out = load_object(self.inner)(params, spider)
            if out is not None:
                return dict(out)
        return params

    def __repr__(self) -> str:
        return f"WorkerUriParams({self.inner!r})"


class ExportFiles:
    """The feed files a crawler's feed storages have open, flushed before each commit
    that acks pages."""

    def __init__(self, fsync: bool = False) -> None:
        self.files: dict[int, tuple[IO[bytes], str]] = {}
        self.fsync = fsync

    @classmethod
    def for_crawler(cls, crawler: Crawler) -> ExportFiles:
        registry = _registries.get(crawler)
        if registry is None:
            fsync = config_for(crawler).feed_fsync
            registry = _registries[crawler] = cls(fsync=fsync)
        return registry

    def opened(self, file: IO[bytes], where: str) -> None:
        self.files[id(file)] = (file, where)

    def closed(self, file: IO[bytes]) -> None:
        self.files.pop(id(file), None)

    def flush(self) -> list[int]:
        """Flush every open feed file to the operating system (synchronous: a few
        ``write`` calls); returns duplicates of the descriptors to fsync (with
        LEASED_FEED_FSYNC; the caller closes them). Raises OSError naming the file."""
        fds: list[int] = []
        for file, where in list(self.files.values()):
            if file.closed:
                continue
            try:
                file.flush()
                if self.fsync and where != "stdout":
                    fds.append(os.dup(file.fileno()))
            except OSError as exc:
                for fd in fds:
                    os.close(fd)
                raise OSError(exc.errno, f"cannot flush the feed file {where} (FEEDS): "
                                         f"{exc.strerror or exc}") from exc
        return fds

    async def make_durable(self) -> None:
        """What every item exported so far wrote is in the operating system (and on
        disk with LEASED_FEED_FSYNC) when this returns. The flush runs at the call."""
        fds = self.flush()
        if fds:
            await asyncio.to_thread(_fsync_all, fds)


def _fsync_all(fds: list[int]) -> None:
    try:
        for fd in fds:
            os.fsync(fd)
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


class _NotedFiles:
    """What the two storages below add to Scrapy's (the base after this one): the open
    file noted in the crawler's ExportFiles, so that it is flushed before the pages of
    its items are acked."""

    _files: ExportFiles | None = None

    def _note_files(self, crawler: Crawler | None) -> None:
        self._files = ExportFiles.for_crawler(crawler) if crawler is not None else None

    @classmethod
    def from_crawler(cls, crawler: Crawler, uri: str, *,
                     feed_options: dict[str, Any] | None = None) -> Self:
        return cls(uri, feed_options=feed_options, crawler=crawler)  # type: ignore[call-arg]

    def _where(self) -> str:
        """The open file's name in errors ("stdout" is not fsynced)."""
        raise NotImplementedError

    def open(self, spider: Spider) -> IO[bytes]:
        file: IO[bytes] = super().open(spider)  # type: ignore[misc]
        if self._files is not None:
            self._files.opened(file, self._where())
        return file

    def store(self, file: IO[bytes]) -> Any:
        if self._files is not None:
            self._files.closed(file)
        return super().store(file)  # type: ignore[misc]


class LeasedFileFeedStorage(_NotedFiles, FileFeedStorage):
    """Scrapy's FileFeedStorage, its open file noted in the crawler's ExportFiles (so
    that it is flushed before the pages of its items are acked)."""

    def __init__(self, uri: str, *, feed_options: dict[str, Any] | None = None,
                 crawler: Crawler | None = None) -> None:
        super().__init__(uri, feed_options=feed_options)
        self._note_files(crawler)

    def _where(self) -> str:
        return os.path.abspath(self.path)


class LeasedStdoutFeedStorage(_NotedFiles, StdoutFeedStorage):
    """Scrapy's StdoutFeedStorage (``-o -``), flushed before each ack as the files are."""

    def __init__(self, uri: str, _stdout: IO[bytes] | None = None, *,
                 feed_options: dict[str, Any] | None = None,
                 crawler: Crawler | None = None) -> None:
        super().__init__(uri, _stdout, feed_options=feed_options)
        self._note_files(crawler)

    def _where(self) -> str:
        return "stdout"


_SCRAPY_STORAGES = {
    "": ("scrapy.extensions.feedexport.FileFeedStorage", LeasedFileFeedStorage),
    "file": ("scrapy.extensions.feedexport.FileFeedStorage", LeasedFileFeedStorage),
    "stdout": ("scrapy.extensions.feedexport.StdoutFeedStorage", LeasedStdoutFeedStorage),
}


def install(settings: Settings) -> None:
    """The add-on's part: the flushed storages for ``file`` and ``stdout`` (unless the
    project set its own in FEED_STORAGES) and the ``%(worker)s`` URI parameter (wrapping
    the project's FEED_URI_PARAMS, at its priority)."""
    storages = settings["FEED_STORAGES"]
    for scheme, (_scrapy, ours) in _SCRAPY_STORAGES.items():
        if storages.get(scheme) is None:
            storages.set(scheme, ours, "addon")
    current = settings.get("FEED_URI_PARAMS")
    if not isinstance(current, WorkerUriParams):
        priority = max(settings.getpriority("FEED_URI_PARAMS") or 0,
                       _addon_priority())
        settings.set("FEED_URI_PARAMS", WorkerUriParams(current), priority)


def _addon_priority() -> int:
    from scrapy.settings import SETTINGS_PRIORITIES

    return SETTINGS_PRIORITIES["addon"]


def feed_exporter(crawler: Crawler) -> FeedExporter | None:
    extensions = getattr(crawler, "extensions", None)
    for ext in getattr(extensions, "middlewares", ()):
        if isinstance(ext, FeedExporter):
            return ext
    return None


def local_feeds(crawler: Crawler, spider: Spider) -> tuple[list[str], list[str]]:
    """(The absolute paths of the local feed files this worker's FeedExporter will
    write, as it will name them when the spider opens; the feed URIs not covered by the
    flush before the ack, each with why.)"""
    exporter = feed_exporter(crawler)
    if exporter is None:
        return [], []
    paths: list[str] = []
    uncovered: list[str] = []
    for uri, options in exporter.feeds.items():
        scheme = urlparse(uri).scheme
        cls = exporter.storages.get(scheme, exporter.storages["file"])
        if issubclass(cls, StdoutFeedStorage):
            if not issubclass(cls, LeasedStdoutFeedStorage):
                uncovered.append(f"{uri} (FEED_STORAGES: the project's own storage)")
            continue
        if not issubclass(cls, FileFeedStorage):
            uncovered.append(f"{uri} (stored when the worker closes)")
            continue
        if not issubclass(cls, LeasedFileFeedStorage):
            uncovered.append(f"{uri} (FEED_STORAGES: the project's own storage)")
        elif options.get("postprocessing"):
            uncovered.append(f"{uri} (postprocessing holds items until the file closes)")
        params = exporter._get_uri_params(spider, options.get("uri_params"))
        final = apply_uri_params(uri, params)
        path = file_uri_to_path(final) if final.startswith("file:") else final
        paths.append(os.path.realpath(path))
    return paths, uncovered


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


async def claim_paths(client: Any, keys: CrawlKeys, worker_id: str, worker_ttl_ms: int,
                      info: str, paths: list[str]) -> None:
    """Record this worker's local feed files in its registry entry (``info``, JSON with
    ``host`` and ``exports``), unless a live worker of the crawl on this host writes one
    of them (lua/exports_enter.lua): then raise FeedCollisionError (this worker has left
    the registry). A worker on this host whose process is gone (killed) is not taken for
    alive."""
    script = SCRIPTS.register(client, "exports_enter")["exports_enter"]
    host = socket.gethostname()
    gone: list[str] = []
    while True:
        out = await script(keys=[keys.workers, keys.worker_info],
                           args=[worker_id, worker_ttl_ms, host, info, len(paths), *paths,
                                 *gone])
        if not isinstance(out, list):
            return
        other, path, pid = (as_str(v) for v in out)
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            gone.append(other)  # killed on this host: its heartbeat has not expired yet
            continue
        raise FeedCollisionError(
            f"FEEDS: the feed file {path} is written by worker {other} (pid {pid}, "
            f"on this host) of crawl {keys.crawl_id} already: two workers appending to "
            "one file interleave their items. Give each worker its own file with "
            "%(worker)s in the feed URI (e.g. -O 'items-%(worker)s.jsonl'), or "
            "-s FEEDS=... per worker")
