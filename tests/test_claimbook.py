"""The scheduler's claim book on its own: the order requests are handed out in, a
suspect running alone, and what a lost lease drops."""

from __future__ import annotations

from scrapy import Request

from scrapy_leased.worker._claimbook import Claim, ClaimBook


def _claim(book: ClaimBook, token: int, suspect: bool = False) -> tuple[Request, Claim]:
    request, claim = Request(f"http://example.com/{token}"), Claim(token, token, "")
    book.add(request, claim, suspect)
    return request, claim


def test_continuations_first_then_claims_then_suspects_alone():
    book = ClaimBook()
    ready, first = _claim(book, 1)
    suspect, suspect_claim = _claim(book, 2, suspect=True)
    retry = Request("http://example.com/1?retry")
    later = Request("http://example.com/1?later")
    first.outstanding += 2  # two continuations of claim 1 (as enqueue_request counts)
    book.local.append((retry, first))
    book.defer(later, first, at=10.0)
    assert book.busy() == 4 and book.has_waiting()
    assert book.take(now=0.0) == (retry, first, "memory")  # a continuation first
    assert book.take(now=0.0) == (ready, first, "redis")
    assert book.take(now=0.0) is None  # the suspect waits for the requests in flight
    assert not book.wants_more()
    assert book.finished(retry) is None and book.finished(ready) is None  # 1 left
    assert book.take(now=0.0) == (suspect, suspect_claim, "redis")
    assert book.isolated is suspect_claim
    assert book.take(now=9.9) is None  # nothing else while the suspect runs alone
    assert book.finished(suspect) is suspect_claim
    assert book.settle(suspect_claim) is True  # it was the one running alone
    assert book.take(now=10.0) == (later, first, "memory")  # due now
    assert book.finished(later) is first  # its last request: settle the claim
    assert book.settle(first) is False
    assert sorted(book.held_tokens()) == [1, 2]  # settled, their ack or fail unwritten
    book.written([1, 2])
    assert book.held_tokens() == [] and book.busy() == 0 and book.wants_more()


def test_a_lost_lease_drops_only_unstarted_claims():
    book = ClaimBook()
    started, _ = _claim(book, 1)
    _claim(book, 2)
    _claim(book, 3, suspect=True)
    assert book.take(now=0.0)[0] is started
    assert book.drop_unstarted({1, 2, 3}) == 2  # 1 is with the engine: kept
    assert list(book.claims) == [1] and not book.ready and not book.suspects
    book.mark_failed(1, "boom", permanent=True)
    book.mark_failed(1, "later", permanent=False)  # the first failure stands
    assert (book.claims[1].failure, book.claims[1].permanent) == ("boom", True)
    assert book.unstarted() == [(1, "")]
