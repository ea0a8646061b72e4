"""The frontier's parts without Redis: each script call's fixed KEYS as its Lua header
names them, replies read by name, the guard, the tier cache and the seen generations."""

from __future__ import annotations

import asyncio
import importlib
import pkgutil
from pathlib import Path

import pytest
from redis.exceptions import ResponseError

import scrapy_leased
from scrapy_leased.frontier import NO_BUDGET, NO_LIMITS, Envelope, Failure, NewRequest
from scrapy_leased.frontier.calls import CommitCall, FeedCommitCall
from scrapy_leased.frontier.claimcall import ClaimCall, ClaimReply
from scrapy_leased.frontier.guard import Guard
from scrapy_leased.frontier.keys import CrawlKeys, tier_code
from scrapy_leased.frontier.layout import Recorded
from scrapy_leased.frontier.reply import Reader, fixed_keys
from scrapy_leased.frontier.scripts import Scripts, header_keys, keys_in_header
from scrapy_leased.frontier.seengen import SeenGenerations
from scrapy_leased.frontier.tiers import TierCache
from scrapy_leased.frontier.upkeep import Expired, Renewed, parse_feed_batch

pytestmark = pytest.mark.unit

#: The fixed KEYS as Frontier listed them by hand before they were read from the headers
BY_HAND = {
    "claim": ["lanes", "leases", "inflight", "tokens", "done", "stats", "dead", "workers",
              "todo", "owners", "control", "fleet_stats", "feed", "feed_taken"],
    "commit": ["lanes", "todo", "stats", "leases", "inflight", "done", "dead", "rids",
               "throughput", "owners", "revisit", "fleet_stats", "worker_acked"],
    "feed_commit": ["lanes", "todo", "stats", "dead", "feed_taken", "feed_deadlines"],
    "feed_take": ["feed", "feed_taken", "feed_deadlines"],
    "expired": ["leases", "inflight"],
    "recover": ["lanes", "todo", "stats", "leases", "inflight", "dead", "owners"],
    "revisit": ["lanes", "todo", "stats", "revisit"],
    "renew": ["leases", "workers", "worker_info", "owners", "control", "worker_acked"],
    "release": ["lanes", "todo", "stats", "leases", "inflight", "workers", "worker_info",
                "owners", "worker_acked"],
    "layout": ["meta", "lanes"],
}


@pytest.mark.parametrize("script", sorted(BY_HAND))
def test_fixed_keys_come_from_the_lua_header(script):
    assert list(header_keys(script)) == BY_HAND[script]
    keys = CrawlKeys("c1")
    assert fixed_keys(script, keys) == [getattr(keys, name) for name in BY_HAND[script]]


def test_keys_in_header_reads_the_opening_comments_only():
    text = ("#!lua flags=no-writes\n-- x: a script\n-- KEYS[1] lanes  KEYS[2] todo (a count)\n"
            "-- KEYS[3..] queue LISTs; KEYS[3 + 2i] per lane\n-- KEYS[3] stats\n"
            "local a = KEYS[4]\n-- KEYS[4] dead\n")
    assert keys_in_header(text, "x.lua") == ("lanes", "todo", "stats")
    with pytest.raises(ValueError, match="x.lua names KEYS\\[1\\] twice"):
        keys_in_header("-- KEYS[1] lanes\n-- KEYS[1] todo\n", "x.lua")
    with pytest.raises(ValueError, match="does not name KEYS"):
        keys_in_header("-- KEYS[1] lanes  KEYS[3] todo\n", "x.lua")
    assert keys_in_header("-- no keys\n", "x.lua") == ()


def _registries() -> list[Scripts]:
    """Every Scripts of the package's modules, once each."""
    out: dict[int, Scripts] = {}
    for info in pkgutil.walk_packages(scrapy_leased.__path__, "scrapy_leased."):
        for value in vars(importlib.import_module(info.name)).values():
            if isinstance(value, Scripts):
                out[id(value)] = value
    return list(out.values())


def test_every_script_is_run_by_the_package_it_sits_in():
    """Each lua/NAME.lua (but the frontier's helpers) is named by one Scripts of the
    package whose lua/ folder holds it, and every helper a Scripts names exists."""
    root = Path(scrapy_leased.__file__).parent
    on_disk = {(".".join(("scrapy_leased", *p.parent.parent.relative_to(root).parts)), p.stem)
               for p in root.rglob("lua/*.lua") if not p.stem.startswith("lib_")}
    named: list[tuple[str, str]] = []
    for registry in _registries():
        named += [(registry.package, name) for name in registry.libs]
        for libs in registry.libs.values():
            assert all((root / "frontier" / "lua" / f"{lib}.lua").is_file() for lib in libs)
    assert sorted(named) == sorted(on_disk)


def test_a_script_of_another_package_is_not_found_by_name():
    fleet = next(r for r in _registries() if "stats_flush" in r.libs)
    with pytest.raises(KeyError, match="claim.lua is not among the scripts of scrapy_leased.fleet"):
        fleet.source("claim")
    assert fleet.source("stats_flush").startswith("#!lua")
    assert "function apply_stats" in fleet.source("stats_flush")


def test_reader_refuses_a_short_reply():
    r = Reader([1, b"a"])
    assert r.number() == 1 and r.text() == "a"
    with pytest.raises(ValueError, match="reply too short"):
        r.take()


def test_claim_reply_by_name():
    env = "7|0|0|2|b.example|p"  # rid|attempts|expiries|priority|lane|payload
    out = [1000, 5, 2, 1000, b"running", 3, 1, b"17:2", 2, b"a", b"b", 1, b"a", 1, b"b",
           b"p2", 42, env]
    reply = ClaimReply.parse(out)
    assert reply.ready_lanes == ["a", "b"] and reply.free_lanes == frozenset({"a"})
    assert reply.tiers == {"b": "p2"}
    assert reply.claims == [(42, Envelope(7, 0, 0, 2, "b.example", "p"))]
    result = reply.result()
    assert (result.now_ms, result.queued, result.leases, result.next_ms) == (1000, 5, 2, 1000)
    assert (result.control, result.feed, result.stale) == ("running", 3, 1)
    assert result.cookies == "17:2"
    stopped = ClaimReply.parse([9, 0, 0, 9, "stopping", 0, 0, b"", 0, 0, 0])
    assert stopped.claims == [] and stopped.state == "stopping"


def test_other_replies_by_name():
    assert Expired.parse([5, 2, 1, "e1", 2, None]) == Expired(5, 2, [(1, "e1"), (2, None)])
    assert Renewed.parse([5, b"paused", 3, 4]) == Renewed(5, "paused", [3, 4])
    batch = parse_feed_batch([1, 2, b"b7", b"x", b"y"])
    assert (batch.entries, batch.returned, batch.left, batch.id) == ([b"x", b"y"], 1, 2, "b7")
    assert Recorded.parse([b"16", b"0", None]) == Recorded(16, 0, None)
    keys = CrawlKeys("c1")
    feed = FeedCommitCall(keys, Guard(keys, "w1"), "1", 0, "b7",
                          [NewRequest("a", lane="x"), NewRequest("b", lane="y"),
                           NewRequest("c", lane="x")], [])
    feed.build(None)
    assert feed.parse([0]) is None
    # sent by lane (x: a, c; then y: b), given back in the order of the call
    assert feed.parse([1, 1, 0, 1]) == [True, True, False]


def test_commit_call_arguments_and_reply():
    keys = CrawlKeys("c1")
    guard = Guard(keys, "w1")
    call = CommitCall(keys, guard, "9", max_attempts=3, seen_ttl_ms=0,
                      enqueue=[NewRequest("a", priority=2, bucket=5, member=11, lane="l")],
                      acks=[(1, 10)], fails=[Failure(2, "x" * 600, lane="l", rid=20)],
                      priorities={2: 1})
    kk, args = call.build(None)
    assert kk[:13] == fixed_keys("commit", keys)
    assert kk[-4:] == [keys.epoch, keys.tokens, keys.rids, keys.call("w1", "commit")]
    assert args[:9] == [1, 1, 1, 3, 0, 0, 0, 0, "w1"]
    assert args[-4:] == ["9", 0, 0, 0]
    assert len([a for a in args if isinstance(a, str) and a.startswith("x")][0]) == 500
    assert keys.lane_tier("l", tier_code(1)) in kk  # the failed claim's tier, read first
    result = call.parse([1, 3, 1])
    assert (result.queued, result.acks, result.fails) == ([True], [3], [1])


def test_guard_keeps_the_highest_seen_and_reports_a_new_epoch():
    keys = CrawlKeys("c1")
    guard = Guard(keys, "w1")
    changes = []
    guard.on_epoch = lambda old, new: changes.append((old, new))
    assert guard.seen([1, 10, 20, "rest"]) == ["rest"]
    assert guard.seen([1, 5, 30]) == []
    assert (guard.epoch, guard.seen_token, guard.seen_rid, changes) == (1, 10, 30, [])
    guard.seen([2, 0, 0])
    assert changes == [(1, 2)]
    assert guard.new_call_id() == "1" and guard.new_call_id() == "2"
    assert guard.wrap(["k"], ["a"])[0] == ["k", keys.epoch, keys.tokens, keys.rids,
                                           keys.epoch]


def test_claim_call_sends_a_lost_claim_again_and_resolves_it():
    keys = CrawlKeys("c1")
    guard, tiers = Guard(keys, "w1"), TierCache()
    sent = []

    async def script(keys, args):
        sent.append(list(args))
        if len(sent) == 1:
            raise ConnectionError("lost")
        return [1, 0, 0] if str(args[-4]).startswith("?") else [
            1, 0, 0, 9, 0, 0, 9, "running", 0, 0, "", 0, 0, 1, "", "p3"]

    call = ClaimCall(script, keys, guard, tiers)

    def build():
        return call.build(1, 1000, "w1", [("", NO_BUDGET)], 30_000, 32, NO_LIMITS, False)

    with pytest.raises(ConnectionError):
        asyncio.run(call.once(build))
    assert call.pending is not None
    reply = asyncio.run(call.once(build))
    assert sent[0] == sent[1] and call.pending is None and tiers.get("") == "p3"
    assert reply.state == "running"
    assert asyncio.run(call.resolve()) == []  # nothing pending
    call.pending = call.build(1, 1000, "w1", [], 30_000, 32, NO_LIMITS, False)
    assert asyncio.run(call.resolve()) == [] and sent[-1][-4].startswith("?")


def test_tier_cache_learns_pushes_and_forgets_the_oldest_quarter():
    tiers = TierCache(size=8)
    tiers.learn_pushes([NewRequest("a", priority=1, lane="x"),
                        NewRequest("b", priority=5, lane="x"),
                        NewRequest("c", priority=9, lane="y"),
                        NewRequest("d", lane="z")], [True, True, False, True])
    assert (tiers.get("x"), tiers.get("y"), tiers.get("z")) == (tier_code(5), "", "")
    tiers.learn("x", "")
    assert tiers.get("x") == "" and len(tiers) == 0
    for i in range(8):
        tiers.learn(f"l{i}", "p1")
    tiers.learn("new", "p1")
    assert len(tiers) == 7 and tiers.get("l0") == tiers.get("l1") == ""
    assert tiers.get("new") == "p1"


def test_seen_generations_rebuild_for_the_generation_named():
    class Clock:
        async def time(self):
            return 100, 0  # 100 s: generation 100_000 // 1000

    seen = SeenGenerations(Clock())
    assert asyncio.run(seen.current()) is None  # no expiry: no generations
    seen.ttl_ms = 1000
    changes, built = [], []
    seen.on_change = lambda old, new: changes.append((old, new))

    def build(gen):
        built.append(gen)
        return [], []

    async def send(keys, args):
        if len(built) == 1:
            raise ResponseError("SEEN_GENERATION 101 is the current one")
        return ["ok"]

    assert asyncio.run(seen.run(build, send)) == ["ok"]
    assert built == [100, 101] and changes == [(100, 101)]

    async def refuse(keys, args):
        raise ResponseError("something else")

    with pytest.raises(ResponseError, match="something else"):
        asyncio.run(seen.run(build, refuse))
