"""Queue order within one priority, from Scrapy's own queue settings.

Scrapy's scheduler keeps one queue per priority (highest first) and, by default, keeps
start requests in queues of their own: ``SCHEDULER_MEMORY_QUEUE`` (or
``SCHEDULER_DISK_QUEUE`` with ``JOBDIR``) is LIFO, so a crawl goes depth-first, and
``SCHEDULER_START_MEMORY_QUEUE`` (``SCHEDULER_START_DISK_QUEUE``) is FIFO, start requests
coming after the other requests of the same priority; set to ``None``, start requests
share the other queues. The frontier follows the same settings: each request is queued
with an order code (lua/lib_settle.lua) telling LIFO from FIFO and start requests from
the others. Queue classes are told apart by what they derive from (queuelib's FIFO and
LIFO queues, which every Scrapy queue class is made of); an unknown class is treated as
Scrapy's default for that setting, with a warning.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from scrapy import Request
from scrapy.settings import BaseSettings
from scrapy.utils.misc import load_object

logger = logging.getLogger(__name__)

LIFO, FIFO, START_FIFO, START_LIFO = "L", "F", "S", "T"


def _kind(settings: BaseSettings, name: str, default: str) -> str | None:
    """``"lifo"``/``"fifo"`` for the queue class a setting names, None when unset."""
    value = settings.get(name)
    if not value:
        return None
    try:
        cls: Any = load_object(value) if isinstance(value, str) else value
    except (ImportError, AttributeError, ValueError, NameError) as exc:
        logger.warning("%(name)s (%(value)r) cannot be loaded (%(exc)s): scrapy_leased "
                       "queues as with %(default)s", {"name": name, "value": value,
                                                      "exc": exc, "default": default})
        return default
    from queuelib import queue as q

    lifo = tuple(getattr(q, n) for n in ("LifoMemoryQueue", "LifoDiskQueue", "LifoSQLiteQueue")
                 if hasattr(q, n))
    fifo = tuple(getattr(q, n) for n in ("FifoMemoryQueue", "FifoDiskQueue", "FifoSQLiteQueue")
                 if hasattr(q, n))
    if isinstance(cls, type) and issubclass(cls, lifo):
        return "lifo"
    if isinstance(cls, type) and issubclass(cls, fifo):
        return "fifo"
    logger.warning("%(name)s (%(value)r) is neither a FIFO nor a LIFO queue of queuelib: "
                   "scrapy_leased queues as with a %(default)s queue",
                   {"name": name, "value": value, "default": default.upper()})
    return default


@dataclass(frozen=True)
class QueueOrder:
    regular: str  # LIFO or FIFO
    start: str | None  # START_FIFO or START_LIFO; None: start requests share the queues

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> QueueOrder:
        disk = bool(settings.get("JOBDIR"))
        regular = _kind(settings, "SCHEDULER_DISK_QUEUE" if disk else "SCHEDULER_MEMORY_QUEUE",
                        "lifo") or "lifo"
        start = _kind(settings, "SCHEDULER_START_DISK_QUEUE" if disk
                      else "SCHEDULER_START_MEMORY_QUEUE", "fifo")
        return cls(LIFO if regular == "lifo" else FIFO,
                   None if start is None else START_LIFO if start == "lifo" else START_FIFO)

    def of(self, request: Request) -> str:
        """The order code a request is queued with."""
        if self.start is not None and request.meta.get("is_start_request"):
            return self.start
        return self.regular
