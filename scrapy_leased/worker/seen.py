"""What the scheduler asks of its dupefilter (``DUPEFILTER_CLASS``), one interface for
either kind, so the scheduler never asks which kind it has.

:class:`FleetSeen` wraps :class:`~.dupefilter.LeasedDupeFilter`: Redis decides what was
seen (in the enqueue script), and the filter only remembers what Redis confirmed.
:class:`LocalSeen` wraps any other dupefilter (Scrapy's ``RFPDupeFilter``, a project's
own): it filters locally, as under Scrapy's scheduler, and the rest is a no-op.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from .dupefilter import LeasedDupeFilter

if TYPE_CHECKING:
    from scrapy import Request, Spider

    from .tally import Tally


class Seen(Protocol):
    def screen(self, request: Request, spider: Spider | None
               ) -> tuple[bool, tuple[int, int] | None]:
        """(duplicate, seen-set key) of a new request that is not ``dont_filter``: a
        duplicate is dropped (and logged) now; the key (None: Redis does not check) goes
        with the request to Redis."""

    def confirmed(self, bucket: int, member: int) -> None:
        """A commit put this seen-set entry in Redis (or found it there)."""

    def duplicate(self, request: Request, spider: Spider | None) -> None:
        """Redis found ``request`` seen before: log it as the dupefilter does."""

    def forget(self) -> None:
        """What this worker remembers of the seen set may be gone from Redis."""


class FleetSeen:
    """The fleet-wide seen set (LeasedDupeFilter): Redis decides."""

    def __init__(self, df: LeasedDupeFilter, tally: Tally) -> None:
        self.df = df
        self.tally = tally
        df.fleet_wide = True  # Redis decides; not a local filter

    def screen(self, request: Request, spider: Spider | None
               ) -> tuple[bool, tuple[int, int] | None]:
        key = self.df.seen_key(request)
        if key in self.df.known:  # Redis already said so: no need to ask again
            self.tally.add("leased/seen_cached")
            self.df.log(request, spider)
            return True, key
        return False, key

    def confirmed(self, bucket: int, member: int) -> None:
        self.df.known.add(bucket, member)  # in the seen set now, whoever put it there

    def duplicate(self, request: Request, spider: Spider | None) -> None:
        self.df.log(request, spider)

    def forget(self) -> None:
        self.df.known.clear()


class LocalSeen:
    """Another dupefilter: it filters in this worker, Redis checks nothing."""

    def __init__(self, df: Any) -> None:
        self.df = df

    def screen(self, request: Request, spider: Spider | None
               ) -> tuple[bool, tuple[int, int] | None]:
        if self.df.request_seen(request):
            self.df.log(request, spider)
            return True, None
        return False, None

    def confirmed(self, bucket: int, member: int) -> None:
        pass

    def duplicate(self, request: Request, spider: Spider | None) -> None:
        pass

    def forget(self) -> None:
        pass


def seen_for(df: Any, tally: Tally) -> Seen:
    """The interface to ``df``, the dupefilter Scrapy built from DUPEFILTER_CLASS."""
    if isinstance(df, LeasedDupeFilter):
        return FleetSeen(df, tally)
    return LocalSeen(df)
