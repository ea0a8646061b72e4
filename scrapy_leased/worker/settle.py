"""Settling claims and the commit bookkeeping: a request Scrapy has fully processed
settles its claim (an ack, or a failure, for the next commit); a commit written to
Redis tells which new requests were queued, which were duplicates, how the acks and
failures went; lost leases and a Redis that went back in time drop what this worker
held or remembered."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scrapy import Request, signals

from ..frontier import PAUSED, CommitResult, Failure

if TYPE_CHECKING:
    from ..frontier.writer import Batch
    from ._claimbook import Claim
    from .scheduler import LeasedScheduler

logger = logging.getLogger(__name__)


class Settlement:
    def __init__(self, worker: LeasedScheduler) -> None:
        self.w = worker

    def on_request_finished(self, request: Request) -> None:
        self.w.slots.approaching.pop(request, None)
        self.w.slots.left(request)
        claim = self.w.book.finished(request)
        if claim is not None:
            self.settle(claim)
        if self.w.control.state == PAUSED:
            self.w.control.check_paused_idle()

    def settle(self, claim: Claim) -> None:
        assert self.w.writer is not None
        if self.w.book.settle(claim):  # the suspect that ran alone: the others may start
            self.w.engine.wake()
        if claim.failure is None:
            self.w.writer.add_ack(claim.token, claim.rid, claim.revisit)
        else:
            self.w.writer.add_fail(Failure(claim.token, claim.failure, claim.permanent,
                                           claim.lane, claim.rid, claim.priority))
        if self.w.kick is not None:
            self.w.kick.set()

    def on_commit(self, batch: Batch, result: CommitResult) -> None:
        if any(result.queued) and self.w.kick is not None:
            self.w.claims.starved = False  # this worker just queued work: claim it at once
            self.w.kick.set()
        self.w.unconfirmed -= len(batch.enqueue)
        self.w.book.written([token for token, _ in batch.acks] + [f.token for f in batch.fails])
        seen = self.w.seen
        filled: set[str] = set()
        for new, tag, queued in zip(batch.enqueue, batch.tags, result.queued):
            if new.bucket is not None:
                seen.confirmed(new.bucket, new.member)
            if queued:
                filled.add(new.lane)
            elif isinstance(tag, Request):  # a duplicate, fleet-wide: dropped as Scrapy does
                seen.duplicate(tag, self.w.spider)
                self.w.crawler.signals.send_catch_log(signals.request_dropped, request=tag,
                                                      spider=self.w.spider)
        # lanes this worker just queued to are ready as far as it knows: the next claim
        # names them (else a claim before the next reply that reports them gets nothing
        # from them, and a second call is needed)
        filled.difference_update(self.w.claims.lanes)
        if filled:
            self.w.claims.lanes = self.w.claims.lanes + sorted(filled)
        tally = self.w.tally
        queued_n = sum(map(bool, result.queued))
        if queued_n:
            for name in ("leased/enqueued", "scheduler/enqueued/redis", "scheduler/enqueued"):
                tally.add(name, queued_n)
        stale = sum(1 for flags in result.acks if not flags & 1)
        if len(result.acks) > stale:
            tally.add("leased/acked", len(result.acks) - stale)
        if stale:
            tally.add("leased/acked_stale", stale)
            if self.w.warn.once("stale"):
                logger.warning("Acked a request after its lease was lost (this worker was "
                               "too slow or paused, or Redis went back in time); it may "
                               "have been processed twice (counted in leased/acked_stale, "
                               "logged once)")
        for outcome in result.fails:
            tally.add(("leased/failed_stale", "leased/failed", "leased/dead")[outcome])
        tally.flush()

    def drop_unstarted(self, lost: set[int]) -> None:
        """Drop claims whose lease is gone and that were never handed to the engine:
        another worker processes them (recovered), or Redis forgot them (rollback)."""
        if not lost:
            return
        dropped = self.w.book.drop_unstarted(lost)
        if dropped:
            self.w.stats.inc_value("leased/dropped_lost", dropped)
        if self.w.kick is not None:
            self.w.kick.set()

    def on_epoch(self, old: int, new: int) -> None:
        """A new epoch: what this worker cached about Redis may be gone from it. Forget
        the seen-set entries it remembered (a URL Redis forgot must be queued again),
        and renew at once: the claims Redis no longer knows that were not started yet
        are dropped (their requests are queued again in Redis, or will be found again)."""
        self.w.stats.inc_value("leased/epoch_changes")
        self.w.seen.forget()
        if self.w.keeper is not None:
            self.w.keeper.renew_now.set()
        logger.warning("Redis restarted, failed over or went back in time (epoch %(old)d -> "
                       "%(new)d): forgetting the seen URLs this worker remembered and the "
                       "claims Redis no longer has", {"old": old, "new": new})

    def on_seen_gen(self, old: int, new: int) -> None:
        """The seen set moved to a new generation (LEASED_SEEN_TTL): entries this worker
        remembers as seen may have expired in Redis; forget them."""
        self.w.seen.forget()
