"""What differs between the Scrapy versions the package supports (2.13.4 up).

Scrapy 2.14 stopped passing ``spider`` to components' methods (it passes it only to a
method that requires it, with a deprecation warning) and awaits the coroutines that an
item pipeline's ``open_spider``/``close_spider`` return; 2.13 passes ``spider`` to every
method and chains only Deferreds there. So the package's middleware and pipeline methods
take an optional ``spider`` they ignore, and the pipeline hooks go through
``pipeline_hook``. ``scrapy.utils.asyncio`` is 2.14+ (2.13 always runs a reactor).
A download slot's ``lastseen`` (when it last started a request) is ``time.time()`` up
to Scrapy 2.15 and ``time.monotonic()`` from 2.16: ``slot_clock``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from typing import Any

import scrapy
from scrapy.utils.defer import deferred_from_coro


def _version(text: str) -> tuple[int, ...]:
    out: list[int] = []
    for part in text.split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit())
        out.append(int(digits or 0))
    return tuple(out)


SCRAPY_2_14 = _version(scrapy.__version__) >= (2, 14)
#: The clock of a Scrapy download slot's ``lastseen`` (scrapy/core/downloader).
slot_clock: Callable[[], float] = (
    time.monotonic if _version(scrapy.__version__) >= (2, 16) else time.time)


def pipeline_hook(coro: Coroutine[Any, Any, None]) -> Any:
    """What an item pipeline's ``open_spider``/``close_spider`` returns: the coroutine
    (Scrapy 2.14+ awaits it), or a Deferred of it (Scrapy 2.13)."""
    return coro if SCRAPY_2_14 else deferred_from_coro(coro)


def asyncio_loop_in_use() -> bool:
    """The asyncio reactor, or no reactor at all (TWISTED_REACTOR_ENABLED = False, 2.15+)."""
    try:
        from scrapy.utils.asyncio import is_asyncio_available
    except ImportError:  # Scrapy 2.13
        from scrapy.utils.reactor import is_asyncio_reactor_installed as is_asyncio_available

    try:
        return is_asyncio_available()
    except RuntimeError:  # no reactor installed and no loop running
        return False


def _percent_params(uri_template: str, uri_params: dict[str, Any]) -> str:
    """Scrapy before 2.14: a feed URI is ``uri % uri_params`` (feedexport.py)."""
    return uri_template % uri_params


try:  # Scrapy 2.14+: other percent signs of the URI left as they are
    from scrapy.extensions.feedexport import apply_uri_params as apply_uri_params
except ImportError:  # Scrapy 2.13
    apply_uri_params = _percent_params

