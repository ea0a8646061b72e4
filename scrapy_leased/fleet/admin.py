"""Fleet administration: the crawl as a whole, seen from outside the workers.

``FleetAdmin`` reads a crawl's state (counters through ``Frontier.counts``, workers,
throughput, Redis memory, dead letters, live leases) and performs the operator's
mutations: requeue or purge dead letters, seed URLs, delete a crawl. Each mutation is
one Lua script in ``lua/`` (``requeue_dead.lua``, ``purge_dead.lua``) or goes through
``Frontier.commit`` (seeding), so it is atomic and keeps the crawl's invariants.
``diagnose`` (diagnose.py) turns two snapshots into warnings.

Used by ``scrapy leased`` (``commands/``), the workers' fleet log line
(``scrapy_leased/observe/logstats.py``) and the observers (``observe/``). Everything
here is asynchronous (redis.asyncio), like ``Frontier``; it knows nothing of Scrapy.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .._redis.scan import keys_with_prefix, scan_batches, server_info
from ..frontier import CONTROL_STATES, Envelope, Frontier, NewRequest
from ..frontier.keys import KEY_PREFIX, CrawlKeys, ExtraKeys, tier_code
from ..frontier.model import HALF_LIFE_FIELD, SEEN_TTL_FIELD
from ..frontier.scripts import Scripts, as_str, pairs, read_atomic, register
from ..ratelimit.state import HALF_LIFE_MS, RATE_FIELDS, RateState
from .snapshot import ControlState, LaneState, Snapshot, WorkerState
from .stats import decode_fleet_stats

#: fleet/lua/: ``scrapy leased dead --requeue`` and ``--purge``, ``pause``, ``resume``,
#: ``stop``, ``forget``
SCRIPTS = Scripts("scrapy_leased.fleet", {
    "requeue_dead": ("lib_envelope", "lib_settle"), "purge_dead": (), "control": ("lib_time",),
    "forget": ()})
#: Throughput is read from the ``throughput`` HASH (10-second buckets of Redis time,
#: kept by commit.lua): the current bucket and the 5 before it, i.e. the last 50-60 s,
#: from the oldest of them that has requests done.
THROUGHPUT_BUCKET_MS = 10_000
THROUGHPUT_BUCKETS = 6

BATCH = 500  # requests per seeding commit, dead letters per requeue/purge call
LANES_SHOWN = 10  # lanes (hosts) listed by status


@dataclass(frozen=True)
class DeadLetter:
    rid: str  # field in the ``dead`` HASH (``malformed:<sha1>`` for unreadable envelopes)
    reason: str
    attempts: int
    t_ms: int  # when it was parked (Redis time)
    url: str | None  # None when the envelope cannot be read
    method: str = "GET"
    lane: str = ""
    envelope: Envelope | None = None
    #: A request the spider yielded that could not be stored (dropped.py): never queued,
    #: never requeued. ``callback``: its callback's name; ``removed``: the meta and
    #: cb_kwargs keys left out of ``request``, what of it could be encoded (None: nothing)
    dropped: bool = False
    callback: str | None = None
    removed: tuple[str, ...] = ()
    request: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rid": self.rid, "url": self.url, "method": self.method,
               "attempts": self.attempts, "reason": self.reason, "time": self.t_ms / 1000}
        if self.dropped:
            out.update(dropped=True, callback=self.callback, removed=list(self.removed),
                       request=self.request)
        return out


def parse_dead_letter(rid: str, raw: str) -> DeadLetter:
    try:
        letter = json.loads(raw)
    except ValueError:
        return DeadLetter(rid, f"unreadable dead letter: {raw[:200]!r}", 0, 0, None)
    reason = str(letter.get("reason", ""))
    attempts = int(letter.get("attempts") or 0)
    t_ms = int(letter.get("t") or 0)
    if letter.get("dropped"):
        removed = letter.get("removed")
        request = letter.get("request")
        return DeadLetter(rid, reason, attempts, t_ms, str(letter.get("url") or "") or None,
                          str(letter.get("method") or "GET"), dropped=True,
                          callback=str(letter.get("callback") or "parse"),
                          removed=tuple(str(r) for r in removed)
                          if isinstance(removed, list) else (),
                          request=request if isinstance(request, str) else None)
    try:
        env = Envelope.parse(str(letter.get("envelope", "")))
        payload = json.loads(env.payload)
        url, method = str(payload["u"]), str(payload.get("m", "GET"))
    except (ValueError, KeyError, TypeError):
        return DeadLetter(rid, reason, attempts, t_ms, None)
    return DeadLetter(rid, reason, attempts, t_ms, url, method, getattr(env, "lane", ""), env)


@dataclass(frozen=True)
class RequeueResult:
    requeued: int = 0
    missing: int = 0  # gone meanwhile (requeued or purged by someone else)
    already_done: int = 0  # their request was processed meanwhile: letter dropped
    unreadable: int = 0  # envelope cannot be requeued: letter kept (purge it)
    dropped: int = 0  # requests that could not be stored: never requeued, letter kept


@dataclass(frozen=True)
class Lease:
    token: int
    deadline_ms: int
    envelope: Envelope | None
    owner: str | None = None  # the worker holding it (the ``owners`` HASH)


class FleetAdmin:
    def __init__(self, client: Any, keys: CrawlKeys, *, worker_ttl_ms: int = 30_000,
                 lease_ms: int = 30_000, max_attempts: int = 4,
                 half_life_ms: int = HALF_LIFE_MS) -> None:
        """``half_life_ms``: LEASED_RATE_RECOVERY, for a crawl whose workers have not
        recorded theirs in Redis (``Frontier.record_half_life``)."""
        self.client = client
        self.keys = keys
        self.worker_ttl_ms = worker_ttl_ms
        self.half_life_ms = half_life_ms
        self.frontier = Frontier(client, keys, lease_ms=lease_ms, max_attempts=max_attempts,
                                 half_life_ms=half_life_ms)
        self._s = {**register(client, "read"),
                   **SCRIPTS.register(client, "requeue_dead", "purge_dead", "control", "forget")}

    # -- reading ---------------------------------------------------------------------

    async def exists(self) -> bool:
        """Whether the crawl has state in this Redis (started, seeded or dead letters)."""
        k = self.keys
        return bool(await self.client.exists(k.meta, k.stats, k.workers, k.dead))

    @staticmethod
    async def list_crawls(client: Any, scan_limit: int = 100_000) -> list[str]:
        """Crawl ids with a ``meta`` key in this Redis (every master of a cluster; looks
        at up to scan_limit keys)."""
        found: set[str] = set()
        seen = 0
        start, end = f"{KEY_PREFIX}:{{", "}:meta"
        async for batch in scan_batches(client, f"{KEY_PREFIX}:{{*}}:meta", 1000):
            for key in batch:
                key = as_str(key)
                if key.startswith(start) and key.endswith(end):
                    found.add(key[len(start):-len(end)])
            seen += 1000
            if seen >= scan_limit:
                break
        return sorted(found)

    async def lanes(self, now_ms: int, limit: int = LANES_SHOWN) -> tuple[int, list[LaneState]]:
        """(number of lanes with queued requests, the ``limit`` lanes served last: those
        whose ready time lies furthest ahead, i.e. the ones their budget holds back)."""
        k = self.keys
        async with self.client.pipeline(transaction=False) as p:
            p.zcard(k.lanes).zrevrange(k.lanes, 0, limit - 1, withscores=True)
            p.hget(k.meta, HALF_LIFE_FIELD)
            total, top, recorded = await p.execute()
        # the workers' LEASED_RATE_RECOVERY (what lib_rate.lua computes with), else ours
        half_life_ms = int(recorded) if recorded else self.half_life_ms
        names = [as_str(name) for name, _ in top]
        async with self.client.pipeline(transaction=False) as p:
            for lane in names:
                p.zrange(k.lane_queue(lane), 0, -1).llen(k.lane_fifo(lane))
                p.hmget(k.rate(lane), *RATE_FIELDS)
            res = await p.execute()
        # a lane's requests of other tiers than p0: one LLEN per tier in use (its index)
        tiers = [(i, as_str(code)) for i in range(len(names)) for code in res[3 * i]]
        counts = [0] * len(names)
        if tiers:
            async with self.client.pipeline(transaction=False) as p:
                for i, code in tiers:
                    p.llen(k.lane_tier(names[i], code))
                for (i, _), n in zip(tiers, await p.execute()):
                    counts[i] += int(n)
        out = []
        for i, (lane, (_, ready)) in enumerate(zip(names, top)):
            queued = counts[i] + int(res[3 * i + 1])
            rate = RateState.from_reply(res[3 * i + 2])
            out.append(LaneState(lane, int(queued), max(0.0, (ready - now_ms) / 1000),
                                 max(0.0, (rate.tat - now_ms) / 1000),
                                 max(0.0, (rate.blocked_until - now_ms) / 1000),
                                 round(rate.slowdown(now_ms, half_life_ms), 2),
                                 rate.crawl_delay_ms / 1000))
        return int(total), out

    async def snapshot(self, *, workers: bool = True, memory: bool = True) -> Snapshot:
        k = self.keys
        counts = await self.frontier.counts(self.worker_ttl_ms)
        reads: list[tuple[Any, ...]] = [("HGETALL", k.throughput)]
        if workers:  # + who holds each lease: one HVALS, as long as the leases (not the queue)
            reads += [("ZRANGE", k.workers, 0, -1, "WITHSCORES"), ("HGETALL", k.worker_info),
                      ("HVALS", k.owners), ("HGETALL", k.worker_acked)]
        reads += [("LLEN", k.feed), ("HLEN", k.feed_taken), ("HGETALL", k.control),
                  ("HGETALL", k.fleet_stats)]
        now_ms, res = await read_atomic(self._s["read"], *reads)
        fleet_stats = decode_fleet_stats(pairs(res.pop()))
        control = ControlState.from_hash(dict(pairs(res.pop())))
        feed_batches, feed = int(res.pop()), int(res.pop())
        current = now_ms // THROUGHPUT_BUCKET_MS
        first = current - THROUGHPUT_BUCKETS + 1
        buckets = {int(b): int(v) for b, v in pairs(res[0]) if first <= int(b) <= current}
        recent = sum(buckets.values())
        # From the start of the oldest bucket with requests done (a young crawl is not
        # diluted over a minute it did not run), at least 1 s.
        start = min((b for b, v in buckets.items() if v), default=current)
        window_ms = max(now_ms - start * THROUGHPUT_BUCKET_MS, 1000)
        totals = {name[len("total_"):]: v for name, v in counts.items()
                  if name.startswith("total_")}
        snap = Snapshot(
            crawl=k.crawl_id, now_ms=now_ms, todo=counts["todo"],
            processing=counts["processing"], done=counts["done"], dead=counts["dead"],
            workers_alive=counts["workers_alive"], totals=totals, done_last_minute=recent,
            window_s=window_ms / 1000, stats=fleet_stats, control=control, feed=feed,
            feed_batches=feed_batches)
        if workers:
            snap.workers = self._workers(now_ms, [(w, float(s)) for w, s in pairs(res[1])],
                                         dict(pairs(res[2])), dict(pairs(res[4])))
            snap.leases_by_worker = dict(sorted(Counter(as_str(w) for w in res[3]).items()))
            snap.lanes_total, snap.lanes = await self.lanes(now_ms)
        if memory:  # the server holding the crawl (on a cluster: its slot's master)
            info = await server_info(self.client, "memory", k.meta)
            snap.used_memory = int(info.get("used_memory", 0))
            snap.used_memory_human = as_str(info.get("used_memory_human", ""))
            snap.maxmemory = int(info.get("maxmemory", 0) or 0)
        return snap

    def _workers(self, now_ms: int, beats: Iterable[tuple[Any, float]],
                 infos: dict[Any, Any], acks: dict[Any, Any]) -> list[WorkerState]:
        """The registry's workers. Each one's ``acked`` is the count its commits keep in
        ``worker_acked`` (exact at this moment), or what its last heartbeat recorded when
        that is more (a worker of a version without the count, or Redis went back in
        time and lost some of it)."""
        by_id = {as_str(key): as_str(value) for key, value in infos.items()}
        acked = {as_str(key): int(as_str(value)) for key, value in acks.items()}
        out = []
        for wid, score in beats:
            wid = as_str(wid)
            try:
                info = json.loads(by_id.get(wid, "{}"))
            except ValueError:
                info = {}
            age = (now_ms - int(score)) / 1000
            out.append(WorkerState(
                id=wid, heartbeat_ms=int(score), heartbeat_age_s=round(age, 3),
                alive=now_ms - int(score) < self.worker_ttl_ms,
                inflight=info.get("inflight"), acked=_most(acked.get(wid), info.get("acked")),
                capacity=info.get("capacity"), host=info.get("host"), pid=info.get("pid"),
                started=info.get("started"), control=info.get("control"),
                unstarted=info.get("unstarted"), unstarted_s=info.get("unstarted_s"),
                slot_delay=info.get("slot_delay")))
        out.sort(key=lambda w: (not w.alive, w.id))
        return out

    async def leases(self) -> tuple[int, list[Lease]]:
        """(Redis time ms, every live lease with its envelope and owner): what is in
        flight."""
        k = self.keys
        now_ms, (leases, inflight, owned) = await read_atomic(
            self._s["read"], ("ZRANGE", k.leases, 0, -1, "WITHSCORES"), ("HGETALL", k.inflight),
            ("HGETALL", k.owners))
        envs = {as_str(t): as_str(e) for t, e in pairs(inflight)}
        owners = {as_str(t): as_str(w) for t, w in pairs(owned)}
        out = []
        for token, deadline in pairs(leases):
            raw = envs.get(as_str(token))
            try:
                env = Envelope.parse(raw) if raw is not None else None
            except ValueError:
                env = None
            out.append(Lease(int(as_str(token)), int(float(deadline)), env,
                             owners.get(as_str(token))))
        return now_ms, out

    async def lease_deadlines(self, tokens: Sequence[int]) -> tuple[int, list[int | None]]:
        """(Redis time ms, each token's lease deadline or None once the lease is gone)."""
        if not tokens:
            return (await read_atomic(self._s["read"]))[0], []
        now_ms, (scores,) = await read_atomic(self._s["read"],
                                              ("ZMSCORE", self.keys.leases, *tokens))
        return now_ms, [None if s is None else int(float(s)) for s in scores]

    async def dead_letters(self, limit: int | None = None,
                           urls: Iterable[str] | None = None) -> tuple[int, list[DeadLetter]]:
        """(number of dead letters, the newest ``limit`` of them, or those of ``urls``)."""
        wanted = set(urls) if urls is not None else None
        letters = []
        async for rid, raw in self.client.hscan_iter(self.keys.dead, count=1000):
            letter = parse_dead_letter(as_str(rid), as_str(raw))
            if wanted is None or letter.url in wanted:
                letters.append(letter)
        total = await self.client.hlen(self.keys.dead)
        letters.sort(key=lambda d: (-d.t_ms, d.rid))
        return int(total), letters[:limit] if limit is not None else letters

    # -- mutations -------------------------------------------------------------------

    async def set_control(self, state: str, by: str, reason: str = "") -> tuple[str, int, int]:
        """Set the fleet's control state (``running``, ``paused``, ``stopping``; the
        ``control`` HASH, lua/control.lua): every worker obeys it from its next claim or
        heartbeat on, and so does a worker started later. Returns (the previous state,
        since when it held in ms of Redis time (0: never set), Redis time now in ms)."""
        if state not in CONTROL_STATES:
            raise ValueError(f"unknown control state {state!r}: one of "
                             f"{', '.join(CONTROL_STATES)}")
        prev, since, now = await self._s["control"](keys=[self.keys.control],
                                                     args=[state, by, reason])
        return as_str(prev), int(since), int(now)

    async def requeue_dead(self, letters: Sequence[DeadLetter]) -> RequeueResult:
        """Put dead letters back in the queue, attempts and expiries reset to 0. The
        letters of requests that could not be stored (``dropped``) are refused and kept:
        counted in ``RequeueResult.dropped``."""
        k = self.keys
        counts = [0, 0, 0, 0]
        todo = [d for d in letters if d.envelope is not None]
        dropped = sum(d.dropped for d in letters)
        counts[3] += len(letters) - len(todo) - dropped
        for i in range(0, len(todo), BATCH):
            keys = [k.lanes, k.todo, k.stats, k.dead, k.done]
            extra = ExtraKeys(keys)
            args: list[Any] = []
            for letter in todo[i:i + BATCH]:
                assert letter.envelope is not None
                priority = letter.envelope.priority
                args += [letter.rid, extra.queue(k, letter.lane, tier_code(priority)),
                         letter.lane, priority]
            out = await self._s["requeue_dead"](keys=keys, args=args)
            for j in range(4):
                counts[j] += int(out[j])
        return RequeueResult(counts[0], counts[1], counts[2], counts[3], dropped)

    async def purge_dead(self, letters: Sequence[DeadLetter] | None = None) -> int:
        """Delete the given dead letters, or every one; returns how many were deleted."""
        if letters is None:
            return int(await self._s["purge_dead"](keys=[self.keys.dead, self.keys.stats]))
        deleted = 0
        for i in range(0, len(letters), BATCH):
            deleted += int(await self._s["purge_dead"](
                keys=[self.keys.dead, self.keys.stats],
                args=[d.rid for d in letters[i:i + BATCH]]))
        return deleted

    async def seed(self, requests: Sequence[NewRequest], seen_bucket_bits: int,
                   seen_ttl_ms: int = 0) -> list[bool]:
        """Queue new requests, deduplicated like a worker's (True: queued, False: seen).
        Records the seen-set layout for a new crawl; refuses a different one."""
        await self.frontier.check_layout(seen_bucket_bits, seen_ttl_ms)
        queued: list[bool] = []
        for i in range(0, len(requests), BATCH):
            queued += (await self.frontier.commit(enqueue=requests[i:i + BATCH])).queued
        return queued

    async def forget(self, entries: Sequence[tuple[int, int]]) -> list[bool]:
        """Remove seen-set entries ((bucket, member) of a fingerprint, ``split_fingerprint``)
        from the crawl's seen set, ``BATCH`` per atomic step (lua/forget.lua); True for
        each entry that was there. Each request forgotten is queued again the next time
        it is sent (by a worker, a new run's ``start()``, ``seed``)."""
        k = self.keys
        out: list[bool] = []
        ttl = int(await self.client.hget(k.meta, SEEN_TTL_FIELD) or 0)
        gens: list[int | None] = [None]
        if ttl:  # the generations an entry may be in now, or by the time the script runs
            sec, usec = await self.client.time()
            gen = (int(sec) * 1000 + int(usec) // 1000) // ttl
            gens = [gen - 1, gen, gen + 1]
        for i in range(0, len(entries), BATCH):
            keys = [k.stats]
            extra = ExtraKeys(keys)
            args: list[Any] = []
            for bucket, member in entries[i:i + BATCH]:
                for g in gens:
                    args += [extra(k.seen_bucket(bucket, g)), member]
            found = await self._s["forget"](keys=keys, args=args)
            out += [any(found[j:j + len(gens)]) for j in range(0, len(found), len(gens))]
        return out

    async def crawl_keys(self) -> list[str]:
        """Every key of this crawl (SCAN MATCH on its escaped prefix; on a cluster, of every
        master: a slot being migrated has keys on two)."""
        return await keys_with_prefix(self.client, self.keys.prefix)

    async def reset(self, records: bool = True, records_prefix: str = "records"
                    ) -> tuple[int, int]:
        """Delete every key of this crawl, and nothing else, except, without ``records``,
        the ``records`` hashes of UpsertPipeline (``records_prefix``: LEASED_UPSERT_PREFIX).
        Returns (keys deleted, records hashes kept)."""
        keys = await self.crawl_keys()
        kept = [] if records else [key for key in keys
                                   if self.keys.is_records(key, records_prefix)]
        doomed = sorted(set(keys) - set(kept))
        deleted = 0
        for i in range(0, len(doomed), BATCH):
            deleted += int(await self.client.unlink(*doomed[i:i + BATCH]))
        return deleted, len(kept)


def _most(counted: int | None, reported: Any) -> int | None:
    """The larger of two counts of one thing, either unknown (None)."""
    if not isinstance(reported, int):
        return counted
    return reported if counted is None else max(counted, reported)
