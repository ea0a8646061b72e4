"""Differential check: the same random operations against two Redis servers, one running
the base scripts (/tmp/lua2-diff/base: main 0db6949), one the worktree's; replies and state compared
after each operation, with tokens and times replaced by their ranks."""
from __future__ import annotations

import asyncio
import importlib.util
import json
import random
import sys

sys.path.insert(0, "/work/wt-lua2")
from scrapy_leased.connection import make_client  # noqa: E402
from scrapy_leased.frontier import Budget, Failure, Frontier, NewRequest, Revisit  # noqa: E402
from scrapy_leased.frontier.keys import CrawlKeys  # noqa: E402
from scrapy_leased.frontier.scripts import script_source  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402

BASE = "/tmp/lua2-diff/base/scrapy_leased/frontier"
spec = importlib.util.spec_from_file_location("base_scripts", f"{BASE}/scripts.py")
base_scripts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(base_scripts)


def old_source(name: str) -> str:
    body = open(f"{BASE}/lua/{name}.lua").read()
    shebang = ""
    if body.startswith("#!"):
        shebang, _, body = body.partition("\n")
        shebang += "\n"
    parts = [open(f"{BASE}/lua/{lib}.lua").read() for lib in base_scripts.LIBS.get(name, ())]
    parts.append(body)
    return shebang + "\n".join(parts)


import os
DEBUG = os.environ.get("DEBUG")
LANES = ["a", "b", "c", ""]
CODES = ["p1", "p-1", "p2", "s0", "s1", "s-1", "s2", "p0"]
CRAWL = "d"
K = CrawlKeys(CRAWL)


class Side:
    def __init__(self, srv: RedisServer, old: bool) -> None:
        self.srv = srv
        self.r = srv.client(decode_responses=True)
        self.raw = srv.client()
        self.fs = {}
        for w in ("w1", "w2"):
            f = Frontier(make_client(srv.url), K, lease_ms=600_000, max_attempts=3,
                         recover_batch=3, caller=w)
            if old:
                for name in list(f._s):
                    f._s[name] = f.client.register_script(old_source(name))
            self.fs[w] = f
            inner = f._s["claim"]
            calls = []

            async def rec(*a, _inner=inner, _calls=calls, **kw):
                out = await _inner(*a, **kw)
                _calls.append(out)
                await asyncio.sleep(0.003)  # a continuation in its own ms too
                return out
            f._s["claim"] = rec
            f._rec_calls = calls
        self.tokens: list[int] = []  # issued, in order

    def tok_rank(self, t) -> object:
        t = int(t)
        if t in self.tokens:
            return f"T{self.tokens.index(t)}"
        return "X" if t > 10**15 else t

    def state(self) -> dict:
        r = self.r
        out = {}
        for lane in LANES:
            out[f"z:{lane}"] = r.zrange(K.lane_queue(lane), 0, -1, withscores=True)
            out[f"l:{lane}"] = r.lrange(K.lane_fifo(lane), 0, -1)
            for code in CODES:
                out[f"t:{code}:{lane}"] = r.lrange(K.lane_tier(lane, code), 0, -1)
            rate = r.hgetall(K.rate(lane))
            out[f"rate:{lane}"] = sorted(rate)
        lanes = r.zrange(K.lanes, 0, -1, withscores=True)
        scores = sorted({s for _, s in lanes})
        out["lanes"] = sorted((m, 0 if s == 0 else scores.index(s) + 1) for m, s in lanes)
        leases = r.zrange(K.leases, 0, -1, withscores=True)
        ls = sorted({s for _, s in leases})
        out["leases"] = sorted((self.tok_rank(m), ls.index(s)) for m, s in leases)
        out["inflight"] = sorted((self.tok_rank(t), e) for t, e in r.hgetall(K.inflight).items())
        out["owners"] = sorted((self.tok_rank(t), w) for t, w in r.hgetall(K.owners).items())
        out["stats"] = r.hgetall(K.stats)
        out["todo"] = r.get(K.todo) or "0"  # absent (main) = "0" (lua2): see the report
        out["tiercache"] = {w: dict(f._tiers) for w, f in self.fs.items()}
        out["rids"] = r.get(K.rids)
        out["done"] = (self.raw.get(K.done) or b"").rstrip(b"\0")
        out["tokens"] = self.tok_rank(r.get(K.tokens) or 0)
        dead = {}
        for k, v in r.hgetall(K.dead).items():
            d = json.loads(v)
            d.pop("t", None)
            dead[k] = d
        out["dead"] = dead
        rv = r.zrange(K.revisit, 0, -1, withscores=True)
        out["revisit"] = sorted(m for m, _ in rv)
        out["throughput"] = sum(int(v) for v in r.hgetall(K.throughput).values())
        out["workers"] = sorted(r.zrange(K.workers, 0, -1))
        return out


def norm_claim(side: Side, res, w) -> dict:
    for t, _ in res.claims:
        side.tokens.append(int(t))
    calls = side.fs[w]._rec_calls
    raw = []
    for out in calls:  # each script reply: stale count, the tiers section, ready, free
        o = list(out[3:])
        if len(o) < 8:
            raw.append(o[1:2] + o[4:])
            continue
        i = 8
        ready = o[i:i + o[7]]; i += o[7]
        nf = o[i]; free = sorted(o[i + 1:i + 1 + nf]); i += 1 + nf
        nt = o[i]; tiers = o[i + 1:i + 1 + 2 * nt]; i += 1 + 2 * nt
        raw.append((o[1], o[2], o[4], o[5], o[6], ready, free, tiers, len(o) - i))
    calls.clear()
    return {"raw": raw, "stale": res.stale, "queued": res.queued, "leases": res.leases, "next_is_now": res.next_ms == res.now_ms,
            "next_neg": res.next_ms < 0, "ready": res.ready_lanes,
            "free": sorted(res.free_lanes), "control": res.control, "feed": res.feed,
            "claims": [(side.tok_rank(t), e.rid, e.attempts, e.expiries, e.priority, e.lane,
                        e.payload) for t, e in res.claims]}


async def scenario(seed: int, a: Side, b: Side, steps: int) -> None:
    rng = random.Random(seed)
    held: dict[str, list] = {"w1": [], "w2": []}  # (rank index, rid, lane)
    counter = [0]
    for step in range(steps):
        op = rng.choice(["enq", "enq", "claim", "claim", "claim", "commit", "commit",
                         "renew", "hand", "recover", "expire"])
        w = rng.choice(["w1", "w2"])
        replies = []
        if op == "enq":
            reqs = []
            for _ in range(rng.randrange(1, 8)):
                counter[0] += 1
                reqs.append(NewRequest(f"p{counter[0]}", rng.choice([0, 0, 1, -1, 2, 1, 2]),
                                       bucket=rng.choice([None, 1, 2]),
                                       member=rng.randrange(30), lane=rng.choice(LANES),
                                       order=rng.choice("LFST")))
            for s in (a, b):
                replies.append((await s.fs[w].commit(enqueue=reqs)).queued)
        elif op == "claim":
            n = rng.choice([0, 1, 2, 3, 5, 8, 16])
            cands = rng.sample(LANES, rng.randrange(1, 5))
            if rng.random() < 0.2:
                cands = cands + cands[:1]  # a lane named twice
            budgets = {lane: rng.choice([Budget(), Budget(), Budget(10**9, 2)])
                       for lane in cands}
            lanes = [(lane, budgets[lane]) for lane in cands]
            if DEBUG:
                print(step, "claim", n, lanes, "lanes before", a.r.zrange(K.lanes, 0, -1, withscores=True), b.r.zrange(K.lanes, 0, -1, withscores=True))
            for s in (a, b):
                res = await s.fs[w].claim(n, w, lanes)
                replies.append(norm_claim(s, res, w))
            for t, e in res.claims:  # b's
                held[w].append((len(b.tokens) - len(res.claims) + res.claims.index((t, e)),
                                e.rid, e.lane, e))
        elif op == "commit":
            pool = held["w1"] + held["w2"]
            acks, fails, revisits_idx = [], [], {}
            for _ in range(rng.randrange(0, 6)):
                kind = rng.random()
                if pool and kind < 0.6:
                    h = rng.choice(pool)
                    rid = h[1] if rng.random() < 0.9 else h[1] + 1
                    acks.append(("T", h[0], rid))
                    if rng.random() < 0.3:
                        revisits_idx[h[0]] = Revisit(rng.choice([1000, 5000]), h[3].priority,
                                                     h[3].lane, h[3].payload)
                elif kind < 0.7:
                    acks.append(("F", rng.choice([5, 10**18]), rng.randrange(1, 40)))
                elif pool:
                    h = rng.choice(pool)
                    fails.append((h[0], rng.random() < 0.3, h[2],
                                  rng.choice([h[1], None])))
            if acks and rng.random() < 0.3:
                acks.append(acks[0])  # the same ack twice
            for s in (a, b):
                def tok(kind, x, s=s):
                    return s.tokens[x] if kind == "T" else x
                ack_list = [(tok(k, x), rid) for k, x, rid in acks]
                fail_list = [Failure(s.tokens[x], "boom", perm, lane, rid)
                             for x, perm, lane, rid in fails]
                revs = {s.tokens[x]: rv for x, rv in revisits_idx.items()}
                out = await s.fs[w].commit(acks=ack_list, fails=fail_list, revisits=revs)
                replies.append((out.queued, out.acks, out.fails))
        elif op == "renew":
            pool = held[w] + held["w1" if w == "w2" else "w2"]
            idx = [h[0] for h in rng.sample(pool, min(len(pool), rng.randrange(0, 6)))]
            fake = [10**9] if rng.random() < 0.3 else []
            for s in (a, b):
                toks = [s.tokens[x] for x in idx] + fake
                lost = await s.fs[w].renew(w, toks)
                replies.append([s.tok_rank(t) for t in lost])
        elif op == "hand":
            kind = rng.randrange(9)
            code = rng.choice(CODES[:-1])
            lane = rng.choice(LANES)
            rid = rng.randrange(1, 40)
            low = rng.choice([0, 1])
            for s in (a, b):
                r = s.r
                if kind == 0:
                    r.set(K.todo, low)
                elif kind == 1:  # a suspect at the head of a lane
                    r.lpush(K.lane_fifo(lane), f"{900 + step}|1|1|0|{lane}|susp{step}")
                    r.zadd(K.lanes, {lane: 0}, nx=True)
                    r.incr(K.todo)
                elif kind == 2:
                    r.lpush(K.lane_fifo(lane), f"garbage{step}")
                    r.zadd(K.lanes, {lane: 0}, nx=True)
                elif kind == 3:
                    r.setbit(K.done, rid, 1)
                elif kind == 4:
                    r.zadd(K.lanes, {lane: 0})  # a lane made ready (maybe empty)
                elif kind == 5:  # a suspect at the head of a tier
                    pr = code[1:]
                    r.lpush(K.lane_tier(lane, code), f"{900 + step}|1|1|{pr}|{lane}|susp{step}")
                    r.zadd(K.lane_queue(lane), {code: -int(pr) + (0.5 if code[0] == "s" else 0)})
                    r.zadd(K.lanes, {lane: 0}, nx=True)
                    r.incr(K.todo)
                elif kind == 6:  # a tier listed without a LIST (by hand)
                    r.zadd(K.lane_queue(lane), {code: -int(code[1:]) + (0.5 if code[0] == "s" else 0)})
                    r.zadd(K.lanes, {lane: 0}, nx=True)
                elif kind == 7:  # garbage in a tier
                    r.rpush(K.lane_tier(lane, code), f"garbage{step}")
                    r.zadd(K.lane_queue(lane), {code: -int(code[1:]) + (0.5 if code[0] == "s" else 0)})
                    r.zadd(K.lanes, {lane: 0}, nx=True)
                else:
                    r.set(K.todo, 2)  # (a deleted todo: main leaves it absent, lua2 "0")
            rng.random()
        elif op == "expire":  # some leases expire (their deadline set in the past)
            pool = held["w1"] + held["w2"]
            idx = [h[0] for h in rng.sample(pool, min(len(pool), rng.randrange(0, 4)))]
            for s in (a, b):
                for x in idx:
                    s.r.zadd(K.leases, {str(s.tokens[x]): 1}, xx=True)
        elif op == "recover":
            for s in (a, b):
                replies.append(await s.fs[w].recover())
        await asyncio.sleep(0.003)  # each call in its own ms: equal times only within a call
        if replies and replies[0] != replies[1]:
            raise AssertionError(f"seed {seed} step {step} {op}: replies differ\n"
                                 f"old {replies[0]}\nnew {replies[1]}")
        sa, sb = a.state(), b.state()
        if sa != sb:
            diff = {k: (sa[k], sb[k]) for k in sa if sa[k] != sb[k]}
            raise AssertionError(f"seed {seed} step {step} {op}: state differs {diff}")


async def main(seeds: range, steps: int) -> None:
    with RedisServer() as sa, RedisServer() as sb:
        for seed in seeds:
            for srv in (sa, sb):
                c = srv.client()
                c.flushall()
                c.close()
            a, b = Side(sa, True), Side(sb, False)
            try:
                await scenario(seed, a, b, steps)
            finally:
                for s in (a, b):
                    for f in s.fs.values():
                        await f.client.aclose()
            print("seed", seed, "ok", a.r.hgetall(K.stats), "revisit", a.r.zcard(K.revisit), flush=True)


if __name__ == "__main__":
    lo, hi, steps = (int(x) for x in sys.argv[1:4])
    asyncio.run(main(range(lo, hi), steps))
