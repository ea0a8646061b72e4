"""``LEASED_GC_FREEZE``: a worker's start-up objects kept out of Python's full garbage
collections while it crawls.

CPython's cyclic garbage collector walks every object it tracks at each collection of
its oldest generation. In a Scrapy worker those are mostly the modules, classes and
functions of Scrapy, Twisted, lxml, redis-py, the project and this package (about
120,000 objects once a spider has opened), and a CPU-bound crawl runs such a collection
about every 130 pages, each holding the event loop about 150 ms on this project's
benchmark machine (docs/settings.md#leased_gc_freeze gives the figures). Once a worker
has opened, garbage is collected once and what is alive is frozen (``gc.freeze``: kept
in a generation the collector does not walk; reference counting still frees those
objects). When the last worker of the process closes, they
are unfrozen (``gc.unfreeze``), so that a process running crawl after crawl collects
each crawl's reference cycles as before; unless something else had frozen objects
before the first worker did (``gc.get_freeze_count()``): those are not ours to unfreeze.
"""

from __future__ import annotations

import gc


class _Freezes:
    """The workers of this process holding the freeze."""

    def __init__(self) -> None:
        self.holders = 0
        self.unfreeze = False

    def hold(self) -> int:
        """Collect, then freeze what is alive; returns how many objects are frozen."""
        if self.holders == 0:
            self.unfreeze = gc.get_freeze_count() == 0
        self.holders += 1
        gc.collect()
        gc.freeze()
        return gc.get_freeze_count()

    def release(self) -> None:
        if self.holders == 0:
            return
        self.holders -= 1
        if self.holders == 0 and self.unfreeze:
            gc.unfreeze()


_FREEZES = _Freezes()
hold = _FREEZES.hold
release = _FREEZES.release
