"""The frontier's values: what callers pass in (NewRequest, Failure, Budget, CloseLimits,
Revisit) and what calls give back (ClaimResult, CommitResult, FeedBatch), with the
control states and the ``meta`` fields the frontier records."""

from __future__ import annotations

from dataclasses import dataclass, field

from .envelope import Envelope

#: The fleet's control states (the ``control`` HASH, keys.py): claims are made only while
#: running; a paused fleet holds what it has, a stopping one closes.
RUNNING, PAUSED, STOPPING = "running", "paused", "stopping"
CONTROL_STATES = (RUNNING, PAUSED, STOPPING)
REASON_CHARS = 500  # a failure's reason is kept to its first 500 characters
#: Field of the crawl's ``meta`` HASH: the slowdown half-life (ms) the workers use.
HALF_LIFE_FIELD = "rate_half_life_ms"
#: Field of the crawl's ``meta`` HASH: the expiry of seen entries (ms, 0: never).
SEEN_TTL_FIELD = "seen_ttl_ms"

#: What the frontier package exports of these (scrapy_leased.frontier)
__all__ = ["CONTROL_STATES", "NO_BUDGET", "NO_LIMITS", "PAUSED", "RUNNING", "STOPPING",
           "Budget", "ClaimResult", "CloseLimits", "CommitResult", "Failure", "FeedBatch",
           "NewRequest", "Revisit"]


@dataclass(frozen=True)
class NewRequest:
    """A request to enqueue; ``bucket`` None means no dedupe (``dont_filter``).
    ``order``: where it goes in its priority (lua/lib_settle.lua): ``L`` LIFO, ``F``
    FIFO, ``S``/``T`` a start request kept apart (FIFO/LIFO); see order.py."""

    payload: str
    priority: int = 0
    bucket: int | None = None
    member: int = 0
    lane: str = ""
    order: str = "F"


@dataclass(frozen=True)
class Failure:
    token: int
    reason: str
    permanent: bool = False
    lane: str = ""
    rid: int | None = None  # the request the claim holds (checked by commit.lua); None: any
    #: the claimed request's priority (its requeue goes to that tier's LIST; checked by
    #: commit.lua); None: read from Redis first, one more round trip
    priority: int | None = None


@dataclass(frozen=True)
class Budget:
    """A lane's rate budget: one request per ``interval_ms`` with bursts of ``burst``;
    ``interval_ms`` 0 means no budget."""

    interval_ms: int = 0
    burst: int = 1


NO_BUDGET = Budget()


@dataclass(frozen=True)
class CloseLimits:
    """The fleet-wide limits (LEASED_CLOSE_*; 0 = none), checked by every claim
    (lua/claim.lua) against the whole crawl's counts: requests done (``stats`` done),
    items scraped and spider errors (the fleet's Scrapy stats, ``fleet_stats``), and ms
    since the crawl's first claim. One reached, the claim sets the fleet's control state
    to stopping."""

    pages: int = 0
    items: int = 0
    errors: int = 0
    timeout_ms: int = 0

    def args(self) -> list[int]:
        return [self.pages, self.items, self.errors, self.timeout_ms]


NO_LIMITS = CloseLimits()


@dataclass
class ClaimResult:
    now_ms: int
    queued: int
    leases: int
    next_ms: int = -1  # earliest time a lane is ready (now when one is, -1: no lane)
    ready_lanes: list[str] = field(default_factory=list)
    claims: list[tuple[int, Envelope]] = field(default_factory=list)
    # lanes claimed from that had nothing to enforce then (no budget, Crawl-delay, block)
    free_lanes: frozenset[str] = frozenset()
    #: The fleet's control state (``RUNNING``, ``PAUSED``, ``STOPPING``): claims are made
    #: only while running
    control: str = "running"
    #: Entries in the crawl's feed and in batches taken off it, not queued yet (0 when
    #: not running)
    feed: int = 0
    #: Lanes not served because their top tier was not the one passed (lua/claim.lua):
    #: they have claimable requests; claim again at once
    stale: int = 0
    #: The control HASH's ``cookies`` field, as this claim read it: it changes with every
    #: write to a cookie jar of the crawl (worker/cookies.py)
    cookies: str = ""


@dataclass(frozen=True)
class Revisit:
    """An acked request to queue again ``after_ms`` after its ack (lua/commit.lua): its
    priority, lane and payload, as claimed."""

    after_ms: int
    priority: int
    lane: str
    payload: str


@dataclass
class FeedBatch:
    """Entries taken off the feed (lua/feed_take.lua): ``returned`` entries of other
    takers past their deadline went back to the feed first; ``left`` are still in it."""

    entries: list[bytes | str]
    returned: int = 0
    left: int = 0
    id: str = "0"  # the batch's id, for commit_feed ("0": nothing taken)


@dataclass
class CommitResult:
    queued: list[bool]
    acks: list[int]  # bit 1: lease was held; bit 2: newly counted done
    fails: list[int]  # 0: lease no longer held, 1: requeued, 2: dead-lettered


def is_start(order: str) -> bool:
    """Whether a queue order code (lua/lib_settle.lua) is a start request's."""
    return order in ("S", "T")
