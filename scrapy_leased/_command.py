"""Which ``scrapy`` command runs this process, for the add-on (addon.py).

Scrapy's commands that look at one page (``shell``, ``fetch``, ``parse``, ``view``,
``check``) or measure Scrapy itself (``bench``) are not crawls of a fleet: with the
add-on on they would register a crawl in Redis, queue their one request through it and
(``shell``) wait for a fleet that never comes. The add-on stays off for them, so they
behave as in plain Scrapy and write nothing to Redis.

Scrapy does not record the command's name anywhere a component can read it (it pops it
off ``sys.argv`` in ``scrapy.cmdline.execute``), so it is read from that function's
frame, on the main thread's stack, where it runs for the whole command."""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from types import FrameType

#: Scrapy's commands that run as plain Scrapy with the add-on on (docs/differences.md)
PLAIN_COMMANDS = frozenset({"shell", "fetch", "parse", "view", "check", "bench"})
_CMDLINE = "scrapy.cmdline"


def scrapy_command() -> str | None:
    """The name of the ``scrapy`` command this process runs (``crawl``, ``shell``...),
    None when Scrapy was not started through its command line (CrawlerProcess,
    CrawlerRunner, Scrapyd's runner calls the command line too)."""
    frames: list[FrameType | None] = [sys._getframe(1)]
    main = sys._current_frames().get(threading.main_thread().ident or -1)
    if main is not None:
        frames.append(main)
    for frame in frames:
        while frame is not None:
            if frame.f_code.co_name == "execute" and \
                    frame.f_globals.get("__name__") == _CMDLINE:
                name = frame.f_locals.get("cmdname")
                return name if isinstance(name, str) else None
            frame = frame.f_back
    return None


def runs_plain() -> str | None:
    """The command's name when it is one of PLAIN_COMMANDS, else None."""
    name = scrapy_command()
    return name if name in PLAIN_COMMANDS else None


def exit_if_command_line(exc: BaseException) -> None:
    """Under Scrapy's command line (``scrapy crawl``): log ``exc``, an error that names the
    setting or the Redis at fault, as one CRITICAL line and end the process with exit
    status 1, instead of Scrapy's "Task exception was never retrieved" and a traceback
    (#25 item 8). Anywhere else (a CrawlerProcess or CrawlerRunner in an application)
    it returns, and the caller raises ``exc`` for the application to handle; so it does
    outside an asyncio task (another reactor: Twisted would turn the exit into a logged
    failure and exit status 0)."""
    if scrapy_command() is None:
        return
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no asyncio loop: Twisted's Deferreds would swallow the exit
        return
    if task is None:
        return
    logging.getLogger("scrapy_leased").critical("%(error)s", {"error": exc})
    # the exit is this task's outcome, not an exception to log
    task.add_done_callback(lambda t: t.cancelled() or t.exception())
    raise SystemExit(1)
