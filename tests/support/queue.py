"""Read a lane's queue as the scripts see it (lua/lib_settle.lua): a LIST for regular
requests of priority 0, one LIST per other tier (priority, start requests kept apart)
and the lane's tier index, a ZSET of the tiers in use scored by rank."""

from __future__ import annotations

from typing import Any

from scrapy_leased.frontier import Envelope, as_str
from scrapy_leased.frontier.keys import CrawlKeys


def tiers(r: Any, keys: CrawlKeys, lane: str = "") -> list[tuple[str, float]]:
    """The lane's tier index: (tier code, rank), in claim order."""
    return [(as_str(m), s) for m, s in r.zrange(keys.lane_queue(lane), 0, -1, withscores=True)]


def tier_lists(r: Any, keys: CrawlKeys, lane: str = "") -> dict[str, list[str]]:
    """Every tier of the lane with its LIST (p0 included, even empty), read in one MULTI."""
    codes = ["p0"] + [code for code, _ in tiers(r, keys, lane)]
    p = r.pipeline(transaction=True)
    for code in codes:
        p.lrange(keys.lane_tier(lane, code), 0, -1)
    return {code: [as_str(m) for m in members] for code, members in zip(codes, p.execute())}


def in_claim_order(index: list[tuple[Any, float]], lists: dict[str, list[Any]]) -> list[str]:
    """Envelopes of one lane in the order claims take them, from its tier index
    (``ZRANGE .. WITHSCORES``) and each tier's LIST (``lists``: code -> ``LRANGE``, p0
    included): tiers ranked below 0 (priorities above 0), then p0, then the rest."""
    ranked = [(score, as_str(code)) for code, score in index] + [(0.0, "p0")]
    ranked.sort(key=lambda x: x[0])
    return [as_str(m) for _, code in ranked for m in lists.get(code, [])]


def queued(r: Any, keys: CrawlKeys, lane: str = "") -> list[str]:
    """A lane's queued envelopes (strings) in claim order."""
    index = r.zrange(keys.lane_queue(lane), 0, -1, withscores=True)
    return in_claim_order(index, tier_lists(r, keys, lane))


def queued_envelopes(r: Any, keys: CrawlKeys, lane: str = "") -> list[Envelope]:
    return [Envelope.parse(e) for e in queued(r, keys, lane)]


def queue_len(r: Any, keys: CrawlKeys, lane: str = "") -> int:
    """How many requests a lane's queue holds (key by key: no MULTI, so that a cluster
    client can read it too)."""
    codes = ["p0"] + [code for code, _ in tiers(r, keys, lane)]
    return sum(int(r.llen(keys.lane_tier(lane, code))) for code in codes)


#: The tiers besides p0 that a crawl of the test site uses: start requests (Scrapy's
#: default keeps them apart, in their own tier of priority 0)
CRAWL_TIERS = ("s0",)


def pipe_queue(p: Any, keys: CrawlKeys, lane: str = "", codes: tuple[str, ...] = CRAWL_TIERS
               ) -> None:
    """Add the reads of a lane's queue to a (MULTI) pipeline: its tier index, its p0 LIST
    and the LISTs of tiers ``codes``; ``queue_of`` reads the replies."""
    p.zrange(keys.lane_queue(lane), 0, -1, withscores=True)
    for code in ("p0", *codes):
        p.lrange(keys.lane_tier(lane, code), 0, -1)


def queue_of(replies: list[Any], codes: tuple[str, ...] = CRAWL_TIERS) -> list[str]:
    """The envelopes in claim order from the replies of ``pipe_queue`` (``2 +
    len(codes)`` of them); a tier in use but not in ``codes`` is an error."""
    index, *lists = replies
    other = {as_str(c) for c, _ in index} - set(codes)
    assert not other, f"tiers {other} not read"
    return in_claim_order(index, dict(zip(("p0", *codes), lists)))


def queue_keys(r: Any, keys: CrawlKeys, lane: str = "") -> list[str]:
    """The keys of a lane's queue that exist: its fifo LIST, tier LISTs and tier index."""
    names = [keys.lane_fifo(lane), keys.lane_queue(lane)]
    names += [keys.lane_tier(lane, code) for code, _ in tiers(r, keys, lane)]
    return [k for k in names if r.exists(k)]
