"""Instructions Redis runs per call of claim.lua and commit.lua, counted by callgrind.

    python benchmarks/bench_script_instructions.py [--calls 200] [--lanes 64] [--micro]
                                                   [--steps] [--floor] [--onsite]

Redis CPU seconds (``INFO cpu``, bench_frontier.py) move by 2x between runs on a shared
machine; instructions do not: ``valgrind --tool=callgrind`` counts the instructions the
redis-server process runs (its own code, Lua, libc) to read and run each request
(inside ``readQueryFromClient``: the protocol, the command, its reply, freeing its
arguments; not the event loop's cron, which runs by the clock), the same count for the
same code and calls whatever else the machine does. Not to the last instruction: the claims and
commits take tokens from Redis TIME and land in listpacks and intsets of slightly
different sizes, so two runs of the same code differed by up to 1.2 % (claim.lua at 100
calls: 1,553,331 and 1,571,325 on 2026-12-05); a change smaller than that needs several
runs of each. So this is the figure to compare two versions of the scripts with; it
says nothing of time.

A private ``redis-server`` runs under callgrind with instrumentation off; it is seeded
with 20,000 requests over ``--lanes`` lanes (bench_frontier.seed), then, counted one
phase at a time (``callgrind_control -i on``, ``-d`` after the phase):

* claims of ``PAGES`` requests from ``CANDIDATES`` candidate lanes (``Frontier.claim``),
  ``--calls`` of them: a worker's batch at Scrapy's default ``CONCURRENT_REQUESTS`` and
  the lanes it names for it (``ClaimSizer``: 8 requests, 12 lanes; 4 and 8 before
  2026-12-06);
* commits of ``PAGES`` pages (``Frontier.commit``): 10 links a page (7 duplicates of
  seed URLs, 3 new: 2 on the page's lane, 1 on a random one) and their acks, as
  bench_frontier's simulated workers send them;

both in a steady state: each counted claim is followed by a commit of the ``PAGES``
oldest claims, each counted commit by a claim (not counted), so that 32 claims stay in
flight (``INFLIGHT``: two workers at Scrapy's default concurrency), with the crawl's
busiest keys hashed as the workers' sweep keeps them (``hot_keys.lua``). (Before
2026-12-06 the claims were counted first, then the commits, so the leases grew to 400
and shrank again, and their keys' resizing was counted too.)
* the trivial script (``return 1``): what a call costs with nothing in it.

``--onsite`` adds commits of ``PAGES`` pages whose 10 links are all on the page's lane (3 new,
7 seed URLs of that lane): an on-site crawl, where a call's new requests share a few
lanes (the commits above spread them over up to 40 lanes). Not in the per-page figure.

``--micro`` adds single Lua operations and Redis commands inside a script (10 per call,
less the trivial call), and arguments (per call: 100 of 20 bytes, 100 of 200 bytes):
what the scripts' parts cost.

``--steps`` adds claim.lua and commit.lua cut after each of their steps (the rest
replaced by ``return 1``), called with the KEYS and ARGV of real calls (no call id):
claims and commits of ``PAGES`` pages as above (each cut's
commits ack claims made for it, not counted). The instructions of each step are the
differences of the cuts. A claim cut before the writes leaves its pops unleased; the
next cut pops the next requests.

``--floor`` adds ``lua/floor.lua`` with the same pages (``PAGES`` a call, 10 links each,
3 of them new, acks of the previous call's): one script per batch that acks, queues what is new
and claims with the fewest commands a page needs (one lease entry per batch, no guard,
lanes, tiers, rate or checks). Beside it, the claim and commit of today's frontier per
page: how far a protocol is from what any protocol costs.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

import bench_frontier as bf  # noqa: E402

from scrapy_leased.worker._claimsize import ClaimSizer  # noqa: E402

#: Pages a claim takes and a commit settles: a worker's claim batch at Scrapy's default
#: CONCURRENT_REQUESTS (16), and the candidate lanes its claims name
PAGES = ClaimSizer(16).batch
CANDIDATES = ClaimSizer(16).candidates(PAGES)
LINKS = bf.LINKS_NEW + bf.LINKS_DUP  # a page's links
CLAIM_LABEL = f"claim.lua: {PAGES} requests from {CANDIDATES} candidate lanes"
COMMIT_LABEL = f"commit.lua: {PAGES} pages ({PAGES * LINKS} links, {PAGES} acks)"

ENVELOPE = ('12345|0|0|0|host7.example.com|{"u":"https://host7.example.com/p/c123",'
            '"k":{"depth":3},"h":{"Referer":["https://host7.example.com/"]},"cb":"parse"}')


class Counted:
    """redis-server under callgrind, instrumentation off until ``phase``."""

    def __init__(self, workdir: str) -> None:
        from tests.support.redis_server import free_port

        self.out = os.path.join(workdir, "callgrind.out")
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--collect-atstart=no",
             "--toggle-collect=readQueryFromClient",
             f"--callgrind-out-file={self.out}", "redis-server", "--port", str(self.port),
             "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", workdir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis

        self.client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 120
        while True:
            try:
                self.client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("redis-server under valgrind did not start") from None
                time.sleep(0.2)
        self.phases: list[str] = []

    def _ctl(self, *args: str) -> None:
        subprocess.run(["callgrind_control", *args, str(self.proc.pid)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def start(self) -> None:
        self._ctl("-i", "on")

    def pause(self) -> None:
        """Instrumentation off until the next ``start``, what was counted kept."""
        self._ctl("-i", "off")

    def stop(self, label: str) -> None:
        self._ctl("-d", f"phase{len(self.phases)}")
        self._ctl("-i", "off")
        self._ctl("-z")
        self.phases.append(label)

    def totals(self) -> dict[str, int]:
        """Instructions of each phase, from its dump."""
        files = sorted(glob.glob(self.out + ".*"), key=lambda p: int(p.rsplit(".", 1)[1]))
        out = {}
        for label, path in zip(self.phases, files):
            with open(path, encoding="utf-8", errors="replace") as fh:
                found = re.search(r"^totals: (\d+)", fh.read(), re.M)
            out[label] = int(found.group(1)) if found else 0
        return out

    def close(self) -> None:
        try:
            self.client.shutdown(nosave=True)
        except Exception:
            pass
        self.proc.wait(timeout=120)


def page_links(env: Any, lanes: int, pool: list[Any], rng: random.Random, counter: list[int],
               prefix: str) -> list[Any]:
    """The links of one simulated page, as bench_frontier's workers send them: LINKS_NEW
    new URLs (2 on the page's lane, the rest on a random one; ``prefix`` keeps each
    phase's URLs apart from the other phases' and from the seeds' ``/p/s``) and
    LINKS_DUP seed URLs of ``pool`` (duplicates)."""
    out = []
    for k in range(bf.LINKS_NEW):
        counter[0] += 1
        lane = env.lane if k < 2 else bf.host(rng.randrange(lanes))
        out.append(bf.new_request(f"https://{lane}/p/{prefix}{counter[0]}", "https://x/", lane))
    return out + [pool[rng.randrange(len(pool))] for _ in range(bf.LINKS_DUP)]


def onsite_links(env: Any, by_lane: dict[str, list[Any]], rng: random.Random,
                 counter: list[int]) -> list[Any]:
    """The links of one simulated page of an on-site crawl: as ``page_links``, all on
    the page's lane (LINKS_NEW new URLs, LINKS_DUP seed URLs of that lane)."""
    out = []
    for _ in range(bf.LINKS_NEW):
        counter[0] += 1
        out.append(bf.new_request(f"https://{env.lane}/p/o{counter[0]}", "https://x/",
                                  env.lane))
    same = by_lane[env.lane]
    return out + [same[rng.randrange(len(same))] for _ in range(bf.LINKS_DUP)]


ONSITE = (f"on-site commit.lua: {PAGES} pages ({PAGES * LINKS} links on the page's lane, "
          f"{PAGES} acks)")
#: claims in flight while claims and commits are counted: 2 workers' worth at Scrapy's
#: default CONCURRENT_REQUESTS (16)
INFLIGHT = 32


def frontier_phases(srv: Counted, calls: int, lanes: int, onsite: bool = False) -> None:
    from scrapy_leased._redis.connection import make_client
    from scrapy_leased.frontier import NO_BUDGET, Frontier
    from scrapy_leased.frontier.keys import CrawlKeys

    bf.seed(srv.url, 20_000, lanes)
    pool = bf.seed_requests(20_000, lanes)
    by_lane: dict[str, list[Any]] = {}
    for r in pool:
        by_lane.setdefault(r.lane, []).append(r)

    async def go() -> None:
        f = Frontier(make_client(srv.url), CrawlKeys(bf.CRAWL_ID), lease_ms=bf.LEASE_MS,
                     max_attempts=4)
        names = [bf.host(i) for i in range(lanes)]
        held: list[Any] = []
        rng = random.Random(7)
        counter = [0]

        async def commit(same_lane: bool = False) -> None:
            done = [held.pop() for _ in range(PAGES)]  # the oldest claims
            links = [x for _, e in done
                     for x in (onsite_links(e, by_lane, rng, counter) if same_lane
                               else page_links(e, lanes, pool, rng, counter, "c"))]
            await f.commit(links, [(t, e.rid) for t, e in done])

        # scripts loaded and the guard's epoch started before anything is counted; the
        # claims in flight brought to INFLIGHT, the busiest keys hashed, as the workers'
        # sweep keeps them (lua/hot_keys.lua)
        t = 0

        async def claim() -> None:
            nonlocal t
            cands = [(names[(t * CANDIDATES + i) % lanes], NO_BUDGET)
                     for i in range(CANDIDATES)]
            held[:0] = (await f.claim(PAGES, "w", cands)).claims  # the oldest last
            t += 1

        while len(held) < INFLIGHT + PAGES:
            await claim()
        await commit()
        trivial = f.client.register_script(bf.TRIVIAL)
        await trivial()
        await f.hash_hot_keys()

        async def phase(label: str, counted: Any, other: Any) -> None:
            """``calls`` rounds of a claim and a commit (the claims in flight stay at
            INFLIGHT), instructions counted for ``counted`` only."""
            for _ in range(calls):
                await asyncio.to_thread(srv.start)
                await counted()
                await asyncio.to_thread(srv.pause)
                await other()
            await asyncio.to_thread(srv.stop, label)

        await phase(CLAIM_LABEL, claim, commit)
        await phase(COMMIT_LABEL, commit, claim)
        if onsite:
            await phase(ONSITE, lambda: commit(same_lane=True), claim)
        await asyncio.to_thread(srv.start)
        for _ in range(calls):
            await trivial()
        await asyncio.to_thread(srv.stop, "trivial script (`return 1`)")
        await f.client.aclose()

    asyncio.run(go())


def micro_cases() -> list[tuple[str, str, list[str], list[str]]]:
    """(label, script, KEYS, ARGV): 10 of one operation per call."""
    from scrapy_leased.frontier.scripts import script_source

    # the helpers prepended to claim.lua, without claim.lua's own code (its first
    # statement reads the feed's length)
    prefix = script_source("claim").split("local feed = redis.pcall(")[0]
    ten = "for i = 1, 10 do local a = {} end return 1"
    return [
        ("the claim script's helpers defined, nothing run", prefix + "\nreturn 1", [], []),
        ("97 arguments (a claim from 8 candidate lanes)", "return 1",
         [f"key{i}" for i in range(50)], [f"argument{i}" for i in range(47)]),
        # what an argument's length costs: Redis 7 hashes every byte of every string
        # a script makes (its arguments, command replies, concatenations) to intern
        # it in Lua (redis/redis#9449), on top of reading it off the socket
        ("100 arguments of 20 bytes", "return 1", [], [f"{i:03d}" + "a" * 17 for i in range(100)]),
        ("100 arguments of 200 bytes", "return 1", [],
         [f"{i:03d}" + "a" * 197 for i in range(100)]),
        ("a 200-byte string made in Lua (ARGV[1] .. i: the number's text made too, as in "
         "the case 'a number concatenated' below)",
         ten.replace("{}", "ARGV[1] .. i"), [], ["a" * 199]),
        ("guard_open: INFO server, its run_id, the epoch's reads (lib_guard.lua)", prefix +
         "\nlocal g = guard_open() return 1", ["e", "t", "r", "c"], ["", "0", "0", "0"]),
        ("parse_envelope", prefix + "\n" + ten.replace("{}", "{parse_envelope(ARGV[1])}"),
         [], [ENVELOPE]),
        ("utf8_valid of an ASCII envelope", prefix + "\n" +
         ten.replace("{}", "utf8_valid(ARGV[1])"), [], [ENVELOPE]),
        ("a number concatenated ('x' .. n)", ten.replace("{}", "'x' .. (1764900000000 + i)"),
         [], []),
        ("tonumber of a 13-digit string", ten.replace("{}", "tonumber(ARGV[1])"), [],
         ["1764900000000"]),
        ("TIME", ten.replace("{}", "redis.call('TIME')"), [], []),
        ("EXISTS", ten.replace("{}", "redis.call('EXISTS', KEYS[1])"), ["x"], []),
        ("HMGET of 5 fields, no such key", ten.replace(
            "{}", "redis.call('HMGET', KEYS[1], 'tat', 'blk', 'pf', 'pt', 'cd')"), ["x"], []),
        ("cmsgpack.pack of a claim-like reply (28 values)",
         "local t = {} for i = 1, 20 do t[i] = i end for i = 1, 4 do t[#t + 1] = "
         "'1764900000000123' t[#t + 1] = ARGV[1] end "
         "for i = 1, 10 do local s = cmsgpack.pack(t) end return 1", [], [ENVELOPE]),
    ]


def micro_phases(srv: Counted, calls: int) -> list[tuple[str, int]]:
    cases = [("trivial", "return 1", [], []), *micro_cases()]
    shas = []
    for _, src, keys, args in cases:
        sha = srv.client.script_load(src)
        srv.client.evalsha(sha, len(keys), *keys, *args)
        shas.append(sha)
    for (label, _, keys, args), sha in zip(cases, shas):
        srv.start()
        for _ in range(calls):
            srv.client.evalsha(sha, len(keys), *keys, *args)
        srv.stop("micro: " + label)
    return [(label, len(keys) + len(args)) for label, _, keys, args in cases]


#: claim.lua's steps: (label, the text the step ends before; None: the whole script)
CLAIM_STEPS = [
    ("dispatch, arguments, helpers defined", "local feed = redis.pcall("),
    ("feed counts, checks, guard_open, replay", "-- The reply when the control state is"),
    ("heartbeat, control state, limits", "local active = {}\nfor i = 1"),
    ("the loop: candidates read, pops, checks", "guard_flush(g)  -- the tokens key first"),
    ("leases, todo, tiers, lane times, counters", "local stale, tiers = 0, {}"),
    ("ready lanes reported, record, reply", None),
]
#: commit.lua's steps, likewise
COMMIT_STEPS = [
    ("dispatch, arguments, helpers defined", "for i = 1, 8 do\n"),
    ("argument checks", "local g = guard_open()"),
    ("guard_open, replay", "local out = {}\n"),
    ("new requests: seen set, envelopes, pushes", "-- never fails (lib_stats.lua)"),
    ("stats, dropped requests", "-- The acks, each decided in order"),
    ("acks: leases, envelopes, done bits, counters", "if n_fail > 0 then"),
    ("fails, reply", None),
]


def run_steps(srv: Counted, script: str, steps: list[tuple[str, str | None]],
              calls: list[tuple[list[str], list[Any]]],
              before: Any = None) -> list[str]:
    """``script`` cut after each of ``steps`` (the rest replaced by ``return 1``), run
    with each of ``calls`` (KEYS, ARGV); ``before()``, when given, makes the calls of
    each cut (not counted). The labels of the phases, in order (cumulative totals)."""
    from scrapy_leased.frontier.scripts import script_source

    source = script_source(script)
    labels = []
    for label, end in steps:
        body = source if end is None else source[:source.index(end)] + "\nreturn 1\n"
        sha = srv.client.script_load(body)
        if before is not None:
            calls = before()
        srv.start()
        for keys, args in calls:
            srv.client.evalsha(sha, len(keys), *keys, *args)
        srv.stop(f"step: {script}.lua: {label}")
        labels.append(f"step: {script}.lua: {label}")
    return labels


def steps_phases(srv: Counted, calls: int, lanes: int) -> list[str]:
    """claim.lua and commit.lua cut after each of their steps, ``calls`` real calls each
    (of the crawl ``frontier_phases`` ran): claims of PAGES requests from CANDIDATES
    candidate lanes; commits of PAGES pages (10 links a page, 3 new, and the acks of
    claims made for them, not counted). No call id: each call runs. The labels, in order."""
    from scrapy_leased._redis.connection import make_client
    from scrapy_leased.frontier import NO_BUDGET, Frontier
    from scrapy_leased.frontier.calls import CommitCall
    from scrapy_leased.frontier.keys import CrawlKeys

    names = [bf.host(i) for i in range(lanes)]
    pool = bf.seed_requests(20_000, lanes)
    rng = random.Random(11)
    counter = [0]

    def frontier() -> Frontier:
        # the crawl frontier_phases seeded and ran (its queues hold thousands more)
        return Frontier(make_client(srv.url), CrawlKeys(bf.CRAWL_ID), lease_ms=bf.LEASE_MS,
                        max_attempts=4)

    def no_call_id(call: tuple[list[str], list[Any]]) -> tuple[list[str], list[Any]]:
        keys, args = call
        args = list(args)
        args[-4] = ""
        return keys, args

    async def claims() -> list[tuple[list[str], list[Any]]]:
        f = frontier()
        await f.claim(PAGES, "w", [(names[i], NO_BUDGET) for i in range(CANDIDATES)])  # epoch
        out = []
        for t in range(calls):
            cands = [(names[(t * CANDIDATES + i) % lanes], NO_BUDGET)
                     for i in range(CANDIDATES)]
            out.append(no_call_id(f.claims.build(PAGES, f.lease_ms, "w", cands,
                                                 f.half_life_ms, f.ready_lanes, f.limits,
                                                 False)))
        await f.client.aclose()
        return out

    async def commits() -> list[tuple[list[str], list[Any]]]:
        f = frontier()
        out = []
        for t in range(calls):
            cands = [(names[(t * CANDIDATES + i) % lanes], NO_BUDGET)
                     for i in range(CANDIDATES)]
            held = (await f.claim(PAGES, "w", cands)).claims
            links = [x for _, env in held
                     for x in page_links(env, lanes, pool, rng, counter, "t")]
            call = CommitCall(f.keys, f.guard, "", f.max_attempts, f.generations.ttl_ms,
                              links, [(token, env.rid) for token, env in held])
            out.append(no_call_id(call.build(None)))
        await f.client.aclose()
        return out

    labels = run_steps(srv, "claim", CLAIM_STEPS, asyncio.run(claims()))
    return labels + run_steps(srv, "commit", COMMIT_STEPS, [],
                              before=lambda: asyncio.run(commits()))


FLOOR_PAGES = PAGES  # pages a floor call acks and claims, as the claims and commits above
FLOOR_SEEDS = 20_000
SEEN_BUCKETS = 2 ** 14  # as the frontier's seen set (keys.py)


def floor_phases(srv: Counted, calls: int) -> None:
    """``lua/floor.lua``: ``calls`` calls of FLOOR_PAGES pages, after a seeded queue and
    seen set of FLOOR_SEEDS (its own keys, beside the crawl's)."""
    client = srv.client
    rng = random.Random(7)
    payload = ENVELOPE.split("|", 5)[5]
    seeds = [rng.getrandbits(63) for _ in range(FLOOR_SEEDS)]
    pipe = client.pipeline(transaction=False)
    for i, fp in enumerate(seeds):
        pipe.sadd(f"floor:seen:{fp % SEEN_BUCKETS}", fp)
        pipe.rpush("floor:queue", f"{i + 1}|0|0|0||{payload}")
    pipe.set("floor:rids", FLOOR_SEEDS)
    pipe.execute()
    sha = client.script_load((Path(__file__).parent / "lua" / "floor.lua").read_text())
    fixed = [f"floor:{k}" for k in ("queue", "leases", "inflight", "done", "rids", "stats")]
    held: dict[str, Any] = {"token": "", "rids": []}

    def call() -> None:
        keys, links = list(fixed), []
        for _ in range(FLOOR_PAGES):
            for k in range(bf.LINKS_NEW + bf.LINKS_DUP):
                fp = rng.getrandbits(63) if k < bf.LINKS_NEW else seeds[rng.randrange(FLOOR_SEEDS)]
                keys.append(f"floor:seen:{fp % SEEN_BUCKETS}")
                links += [len(keys), fp, payload]
        n_links = len(links) // 3
        token, got = client.evalsha(sha, len(keys), *keys, FLOOR_PAGES, held["token"],
                                    len(held["rids"]), n_links, *held["rids"], *links)
        held["token"], held["rids"] = token, [e.split(b"|", 1)[0] for e in got]

    call()  # loaded, and a batch held to ack
    srv.start()
    for _ in range(calls):
        call()
    srv.stop(f"floor.lua: {FLOOR_PAGES} pages (acks, {FLOOR_PAGES * LINKS} links, claims)")


def measure(calls: int = 200, lanes: int = 64, micro: bool = False,
            floor: bool = False, steps: bool = False, onsite: bool = False) -> dict[str, int]:
    """Instructions of each phase (label -> total over ``calls`` calls)."""
    with tempfile.TemporaryDirectory() as workdir:
        srv = Counted(workdir)
        try:
            frontier_phases(srv, calls, lanes, onsite)
            if micro:
                micro_phases(srv, calls)
            if steps:
                steps_phases(srv, calls, lanes)
            if floor:
                floor_phases(srv, calls)
        finally:
            srv.close()
        return srv.totals()


def per_page(totals: dict[str, int], calls: int) -> dict[str, float]:
    """Instructions per page: ``frontier`` (claim + commit share) and, when measured,
    ``floor`` (floor.lua); each phase serves PAGES pages a call."""
    pages = {label: total / calls / FLOOR_PAGES for label, total in totals.items()
             if label.startswith(("claim.lua", "commit.lua", "floor.lua"))}
    out = {"frontier": sum(v for k, v in pages.items() if not k.startswith("floor"))}
    floors = [v for k, v in pages.items() if k.startswith("floor")]
    if floors:
        out["floor"] = floors[0]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--lanes", type=int, default=64)
    ap.add_argument("--micro", action="store_true")
    ap.add_argument("--floor", action="store_true")
    ap.add_argument("--steps", action="store_true")
    ap.add_argument("--onsite", action="store_true")
    a = ap.parse_args()
    for tool in ("valgrind", "callgrind_control", "redis-server"):
        if not shutil.which(tool):
            print(f"{tool} not found (valgrind: Debian's package valgrind)", file=sys.stderr)
            return 2
    totals = measure(a.calls, a.lanes, a.micro, a.floor, a.steps, a.onsite)
    print("| phase | instructions per call | above the trivial call |")
    print("| --- | ---: | ---: |")
    trivial = totals.get("trivial script (`return 1`)", 0) / a.calls
    micro_base = totals.get("micro: trivial", 0) / a.calls
    step_before = 0.0
    for label, total in totals.items():
        per = total / a.calls
        if label.startswith("step: "):
            if label.split(": ")[2] == "dispatch, arguments, helpers defined":
                step_before = 0.0  # the first step of a script
            print(f"| {label[6:]} | {per - step_before:,.0f} | |")
            step_before = per
            continue
        if label.startswith("micro: "):
            if label == "micro: trivial":
                continue
            each = (per - micro_base) / (1 if "helpers" in label or "arguments" in label
                                         or "guard_open" in label else 10)
            print(f"| {label[7:]} (each) | {each:,.0f} | |")
        else:
            print(f"| {label} | {per:,.0f} | {per - trivial:,.0f} |")
    page = per_page(totals, a.calls)
    print(f"\nPer page: claim + commit {page['frontier']:,.0f} instructions", end="")
    if "floor" in page:
        print(f"; floor.lua {page['floor']:,.0f} ({page['frontier'] / page['floor']:.2f}x "
              f"the floor)", end="")
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
