"""Faults caused for real: workers killed with ``kill -9``, callbacks that raise or
``os._exit`` their worker, a slow item pipeline killed before it stored its items,
a callback slower than the lease, a worker frozen with SIGSTOP past its lease.

Every test runs real ``scrapy crawl`` workers (tests/project) against a private
``redis-server`` and the local test site, with short leases so recovery is quick:
``LEASED_LEASE_SECONDS=2``, ``LEASED_SWEEP_INTERVAL=0.5`` (renewal every 2/3 s).

Page paths used as switches (substring match in the spider and the pipeline) are
leaves with no longer page number inside the site: ``/p/137`` on a 150-page site
matches no other page (``/p/1370`` does not exist).
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import redis
from scrapy import Request
from scrapy.utils.request import RequestFingerprinter

from scrapy_leased.frontier import Envelope
from scrapy_leased.frontier.fingerprints import split_fingerprint
from scrapy_leased.frontier.keys import CrawlKeys
from scrapy_leased.testing.pages import page_links
from tests.support.queue import CRAWL_TIERS, pipe_queue, queue_len, queue_of, queued_envelopes

LANE = "127.0.0.1"  # the lane (host) of every request to the test site

LEASE = 2.0
SWEEP = 0.5
RENEW = LEASE / 3
BASE = {"LEASED_LEASE_SECONDS": LEASE, "LEASED_SWEEP_INTERVAL": SWEEP}
EXIT_CODE = 3  # the spider's os._exit(3)


# -- helpers -------------------------------------------------------------------------

def wait_for(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout}s")
        time.sleep(interval)


def path_of(url: str) -> str:
    return urlsplit(url).path


def url_of(env: Envelope) -> str:
    return json.loads(env.payload)["u"]


class CrawlState:
    """Reads a crawl's Redis keys (test side, sync client)."""

    def __init__(self, server, crawl_id: str) -> None:
        self.r: redis.Redis = server.client(decode_responses=True)
        self.k = CrawlKeys(crawl_id)

    def stats(self) -> dict[str, int]:
        return {k: int(v) for k, v in self.r.hgetall(self.k.stats).items()}

    def stat(self, name: str) -> int:
        return int(self.r.hget(self.k.stats, name) or 0)

    def now_ms(self) -> int:
        sec, usec = self.r.time()
        return sec * 1000 + usec // 1000

    def leases(self) -> dict[int, int]:
        return {int(t): int(s) for t, s in self.r.zrange(self.k.leases, 0, -1, withscores=True)}

    def inflight(self) -> dict[int, Envelope]:
        return {int(t): Envelope.parse(v) for t, v in self.r.hgetall(self.k.inflight).items()}

    def queued(self) -> list[Envelope]:
        return queued_envelopes(self.r, self.k, LANE)

    def dead(self) -> dict[int, dict]:
        return {int(rid): json.loads(v) for rid, v in self.r.hgetall(self.k.dead).items()}

    def workers(self) -> int:
        return self.r.zcard(self.k.workers)

    def is_done(self, rid: int) -> bool:
        return self.r.getbit(self.k.done, rid) == 1

    def snapshot(self) -> tuple[int, dict[int, int], dict[int, Envelope]]:
        """(registered workers, leases, inflight) in one MULTI."""
        p = self.r.pipeline(transaction=True)
        p.zcard(self.k.workers).zrange(self.k.leases, 0, -1, withscores=True)
        p.hgetall(self.k.inflight)
        nworkers, leases, inflight = p.execute()
        return (nworkers, {int(t): int(s) for t, s in leases},
                {int(t): Envelope.parse(v) for t, v in inflight.items()})

    def assert_drained(self) -> None:
        assert queue_len(self.r, self.k, LANE) == 0
        assert self.r.zcard(self.k.leases) == 0
        assert self.r.hlen(self.k.inflight) == 0
        assert self.r.hlen(self.k.owners) == 0  # every lease's owner went with it


def site_counts(site) -> Counter:
    return site.count_by_path(include_query=False)


def assert_every_page_fetched(site, counts: Counter) -> None:
    missing = sorted(site.all_page_paths() - set(counts), key=lambda p: int(p.rsplit("/", 1)[1]))
    assert not missing, f"pages never fetched: {missing}"


def assert_clean_log(worker) -> None:
    text = worker.log_text()
    assert "Traceback" not in text, worker.log_tail(80)


def hold_all_claims(start_worker, server, crawl_id, site, state, name: str, n: int,
                    extra: dict | None = None):
    """Start one worker alone whose item pipeline holds every item (60 s unless ``extra``
    sets RECORD_DELAY), and wait until it holds exactly ``n`` claims, all downloaded and
    stuck: with no claim margin (LEASED_PREFETCH = 0) a worker holds at most
    2 x CONCURRENT_REQUESTS claims, so CONCURRENT_REQUESTS = n / 2.
    Returns (worker, {token: envelope}) with the claims read in one MULTI while it was
    the only registered worker (so every lease is its own)."""
    assert n % 2 == 0
    settings = {**BASE, "CONCURRENT_REQUESTS": n // 2, "LEASED_PREFETCH": 0, "RECORD_DELAY": 60,
                **(extra or {})}
    w = start_worker(server.url, crawl_id, site.url + "/p/0", settings=settings, name=name)

    def held():
        nworkers, leases, inflight = state.snapshot()
        if nworkers == 1 and len(leases) == n and set(leases) == set(inflight) \
                and len(site.entries()) == n:
            return inflight
        return None

    w.wait_until(lambda: held() is not None, timeout=30, what=f"{n} stuck claims")
    time.sleep(0.2)  # stable: it claims nothing more while its items are stuck
    claims = held()
    assert claims is not None and len(claims) == n
    # the claims it holds are exactly the pages it downloaded
    assert {path_of(url_of(e)) for e in claims.values()} == set(site_counts(site))
    return w, claims


# -- 1. kill -9 mid-crawl ------------------------------------------------------------

def test_kill9_worker_leases_recovered_and_every_page_done_once(
        redis_server, crawl_id, make_site, start_worker):
    n_pages, conc = 200, 8
    site = make_site(pages=n_pages)
    st = CrawlState(redis_server, crawl_id)
    # The victim: every item waits 60 s in its pipeline, so it sits on 8 leased,
    # downloaded requests (children already queued) until it is killed.
    victim, held = hold_all_claims(start_worker, redis_server, crawl_id, site, st, "victim", conc)
    held_paths = {path_of(url_of(e)) for e in held.values()}
    held_rids = {e.rid for e in held.values()}
    first_deadline = st.leases()

    # Two survivors join and crawl (slow-ish pipeline, so the crawl is still going).
    survivors = [start_worker(redis_server.url, crawl_id, site.url + "/p/0",
                              settings={**BASE, "CONCURRENT_REQUESTS": conc, "RECORD_DELAY": 0.2},
                              name=f"s{i}") for i in (1, 2)]
    wait_for(lambda: st.stat("done") >= 30, 30, "survivors crawling")
    # Right before the kill the victim still holds (and renews) every claim.
    leases = st.leases()
    assert set(held) <= set(leases)
    assert all(leases[t] > first_deadline[t] for t in held), "victim never renewed"
    assert st.stat("recovered") == 0
    last_deadline = max(leases[t] for t in held)

    victim.kill9()
    killed_at, killed_ms = time.monotonic(), st.now_ms()
    assert victim.returncode == -9
    assert killed_ms < last_deadline  # the kill happened while it held live leases

    def back() -> bool:
        p = st.r.pipeline(transaction=True)
        p.zrange(st.k.leases, 0, -1).hvals(st.k.inflight)
        pipe_queue(p, st.k, LANE)
        p.hget(st.k.stats, "recovered")
        leased, infl, *queue_replies, recovered = p.execute()
        queue = queue_of(queue_replies)
        if set(map(int, leased)) & set(held):
            return False
        again = {Envelope.parse(v).rid for v in infl} | {Envelope.parse(m).rid for m in queue}
        return int(recovered or 0) == conc and all(
            rid in again or st.is_done(rid) for rid in held_rids)

    wait_for(back, LEASE + SWEEP + 5, "recovery of the victim's claims", interval=0.01)
    delay = time.monotonic() - killed_at
    after_deadline = st.now_ms() - last_deadline
    print(f"\nkill -9 -> {conc} claims back in the queue after {delay:.3f}s "
          f"({after_deadline} ms after the last lease deadline; bound lease+sweep="
          f"{LEASE + SWEEP}s)")
    # never before the lease could have run out, at most lease + sweep (+ slack)
    assert delay >= LEASE - RENEW - 0.1
    assert delay <= LEASE + SWEEP + 0.5
    assert after_deadline <= SWEEP * 1000 + 500

    for w in survivors:
        assert w.wait(60) == 0, w.log_tail()
        assert w.close_reason() == "finished"
        assert_clean_log(w)
    stats = st.stats()
    assert stats["done"] == n_pages
    assert stats["acked"] == n_pages
    assert stats["enqueued"] == n_pages
    assert stats["recovered"] == conc
    assert stats["claimed"] == n_pages + conc
    assert "dead" not in stats and st.dead() == {}
    st.assert_drained()
    assert sum(w.stats().get("leased/recovered", 0) for w in survivors) == conc

    counts = site_counts(site)
    assert_every_page_fetched(site, counts)
    dups = {p: c for p, c in counts.items() if c > 1}
    print(f"pages fetched twice: {len(dups)} (the {conc} the victim held)")
    assert set(dups) == held_paths and set(dups.values()) == {2}
    # every page's item stored exactly once, by a survivor; the victim stored none
    assert victim.items() == []
    stored = Counter(path_of(i["url"]) for w in survivors for i in w.items())
    assert set(stored) == site.all_page_paths() and set(stored.values()) == {1}


# -- 2. poison requests: a callback that raises, a callback that kills its worker -----

def test_raising_callback_dead_lettered_after_max_attempts(
        redis_server, crawl_id, make_site, start_worker):
    n_pages, poison = 150, "/p/137"
    site = make_site(pages=n_pages)
    st = CrawlState(redis_server, crawl_id)
    # requeued on a callback error only with LEASED_RETRY_ERRORS (without it: one dead
    # letter at once, as Scrapy processes the request once; tests/test_dropin.py)
    settings = {**BASE, "LEASED_MAX_ATTEMPTS": 3, "LEASED_RETRY_ERRORS": True,
                **start_worker.barrier(2)}
    workers = [start_worker(redis_server.url, crawl_id, site.url + "/p/0", settings=settings,
                            args={"raise_path": poison}, name=f"w{i}") for i in (1, 2)]
    for w in workers:
        assert w.wait(60) == 0, w.log_tail()
        assert w.close_reason() == "finished"

    counts = site_counts(site)
    assert counts[poison] == 3
    assert_every_page_fetched(site, counts)
    assert {p for p, c in counts.items() if c != 1} == {poison}
    dead = st.dead()
    assert len(dead) == 1
    (rid, entry), = dead.items()
    assert entry["attempts"] == 3
    assert "boom" in entry["reason"] and entry["reason"].startswith("callback error: RuntimeError")
    assert path_of(url_of(Envelope.parse(entry["envelope"]))) == poison
    assert not st.is_done(rid)
    stats = st.stats()
    assert stats["done"] == n_pages - 1
    assert stats["failed"] == 3 and stats["dead"] == 1
    assert "recovered" not in stats
    st.assert_drained()
    assert sum(w.stats().get("leased/failed", 0) + w.stats().get("leased/dead", 0)
               for w in workers) == 3
    stored = Counter(path_of(i["url"]) for w in workers for i in w.items())
    assert set(stored) == site.all_page_paths() - {poison} and set(stored.values()) == {1}


def test_worker_killing_callback_dead_lettered_and_neighbours_spared(
        redis_server, crawl_id, make_site, start_worker):
    n_pages, poison, max_attempts = 150, "/p/137", 3
    site = make_site(pages=n_pages)
    st = CrawlState(redis_server, crawl_id)
    settings = {**BASE, "LEASED_MAX_ATTEMPTS": max_attempts}

    def start(k: int):
        return start_worker(redis_server.url, crawl_id, site.url + "/p/0", settings=settings,
                            args={"exit_path": poison}, name=f"w{k}")

    workers = [start(1), start(2)]
    handled: set[int] = set()
    crashes = 0
    max_restarts = 2 * max_attempts  # bound: the test cannot loop forever
    deadline = time.monotonic() + 120
    while True:
        for i, w in enumerate(list(workers)):
            if i in handled or w.running:
                continue
            handled.add(i)
            if w.returncode == EXIT_CODE:
                crashes += 1
                assert crashes <= max_restarts, f"{crashes} crashes: the poison page cycles"
                workers.append(start(len(workers) + 1))
        if all(not w.running for w in workers) and len(handled) == len(workers):
            break
        assert time.monotonic() < deadline, "crawl did not end"
        time.sleep(0.05)

    rcs = [w.returncode for w in workers]
    print(f"\nworkers: {len(workers)}, exit codes {rcs}")
    assert crashes == max_attempts
    assert sorted(rcs) == [0] * (len(workers) - max_attempts) + [EXIT_CODE] * max_attempts
    for w in workers:
        if w.returncode == 0:
            assert w.close_reason() == "finished"
    counts = site_counts(site)
    assert counts[poison] == max_attempts
    assert_every_page_fetched(site, counts)

    dead = st.dead()
    # (path, attempts charged, times downloaded): a neighbour charged more attempts
    # than it was downloaded was charged for crashes while it sat unstarted
    summary = sorted((path_of(url_of(Envelope.parse(e["envelope"]))), e["attempts"],
                      counts[path_of(url_of(Envelope.parse(e["envelope"])))])
                     for e in dead.values())
    print(f"dead letters (path, attempts, fetched): {summary}")
    # only the page that kills its worker is dead: its neighbours in flight were
    # recovered and processed alone, never charged for its crashes
    assert len(dead) == 1, f"neighbours of the poison page dead-lettered: {summary}"
    (rid, entry), = dead.items()
    assert path_of(url_of(Envelope.parse(entry["envelope"]))) == poison
    assert entry["attempts"] == max_attempts
    assert "lease expired" in entry["reason"]
    stats = st.stats()
    assert stats["done"] == n_pages - 1
    assert stats["dead"] == 1
    st.assert_drained()
    stored = {path_of(i["url"]) for w in workers for i in w.items()}
    assert stored == site.all_page_paths() - {poison}


# -- 3. ack timing -------------------------------------------------------------------

def test_kill9_before_items_stored_means_processed_again(
        redis_server, crawl_id, make_site, start_worker):
    n_pages, slow = 150, "/p/137"
    site = make_site(pages=n_pages)
    st = CrawlState(redis_server, crawl_id)
    w1 = start_worker(redis_server.url, crawl_id, site.url + "/p/0", name="w1",
                      settings={**BASE, "RECORD_DELAY": 60, "RECORD_DELAY_PATH": slow})
    # everything else is done; /p/137 is downloaded, its item waits in the pipeline
    w1.wait_until(lambda: st.stat("done") == n_pages - 1 and site_counts(site)[slow] == 1,
                  timeout=30, what="all but the slow page done")
    time.sleep(0.3)
    assert slow not in {path_of(i["url"]) for i in w1.items()}
    (token, env), = st.inflight().items()
    assert path_of(url_of(env)) == slow
    assert token in st.leases()

    w1.kill9()
    # not acked: still leased, its done bit clear, counters unchanged
    assert token in st.leases()
    assert not st.is_done(env.rid)
    stats = st.stats()
    assert stats["done"] == stats["acked"] == n_pages - 1
    assert len(w1.items()) == n_pages - 1

    w2 = start_worker(redis_server.url, crawl_id, site.url + "/p/0", name="w2", settings=BASE)
    assert w2.wait(60) == 0, w2.log_tail()
    assert w2.close_reason() == "finished"
    counts = site_counts(site)
    assert counts[slow] == 2
    assert {p for p, c in counts.items() if c != 1} == {slow}
    assert [path_of(i["url"]) for i in w2.items()] == [slow]
    stats = st.stats()
    assert stats["done"] == n_pages and stats["recovered"] == 1
    assert st.dead() == {}
    assert st.is_done(env.rid)
    st.assert_drained()


class ChildrenMonitor(threading.Thread):
    """Checks, in atomic Redis snapshots taken every few ms, that every request marked
    done has all the links of its page in the seen set (enqueued or processed): an ack
    must never precede the children its callback yielded. Request ids are mapped to
    pages from the envelopes seen in the queue and in flight."""

    def __init__(self, server, crawl_id: str, site, bits: int = 14) -> None:
        super().__init__(daemon=True)
        self.r = server.client()
        self.k = CrawlKeys(crawl_id)
        self.n = site.pages
        fp = RequestFingerprinter()
        self.seen_keys = []
        for i in range(self.n):
            bucket, member = split_fingerprint(fp.fingerprint(Request(site.page_url(i))), bits)
            self.seen_keys.append((self.k.seen_bucket(bucket), member))
        self.page_of_rid: dict[int, int] = {}
        self.checked: set[int] = set()
        self.violations: list[tuple[int, int, list[int]]] = []
        self.snapshots = 0
        self.stop_event = threading.Event()

    def _learn(self, env_raw: bytes | str) -> None:
        env = Envelope.parse(env_raw.decode() if isinstance(env_raw, bytes) else env_raw)
        if env.rid not in self.page_of_rid:
            self.page_of_rid[env.rid] = int(path_of(url_of(env)).rsplit("/", 1)[1])

    def run(self) -> None:
        while not self.stop_event.is_set():
            self.check()
            time.sleep(0.01)

    def check(self) -> None:
        p = self.r.pipeline(transaction=True)
        p.get(self.k.done).hvals(self.k.inflight)
        pipe_queue(p, self.k, LANE)
        for key, member in self.seen_keys:
            p.sismember(key, member)
        done, inflight, *rest = p.execute()
        n = 2 + len(CRAWL_TIERS)
        queue, seen = queue_of(rest[:n]), rest[n:]
        self.snapshots += 1
        for m in queue:
            self._learn(m)
        for v in inflight:
            self._learn(v)
        done = done or b""
        for rid, page in self.page_of_rid.items():
            if rid // 8 < len(done) and done[rid // 8] >> (7 - rid % 8) & 1:
                self.checked.add(rid)
                missing = [c for c in page_links(page, self.n) if not seen[c]]
                if missing:
                    self.violations.append((rid, page, missing))

    def stop(self) -> None:
        self.stop_event.set()
        self.join(10)
        self.check()


def test_ack_never_precedes_children_under_random_kills(
        redis_server, crawl_id, make_site, start_worker):
    n_pages, kills = 300, 3
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    site = make_site(pages=n_pages)
    st = CrawlState(redis_server, crawl_id)
    # slow callbacks on /p/1, /p/1x, /p/1xx (a window between download and children)
    # and a slow pipeline on every item (a window between children and ack)
    settings = {**BASE, "LEASED_MAX_ATTEMPTS": 20, "CONCURRENT_REQUESTS": 8, "RECORD_DELAY": 0.1}
    args = {"slow_path": "/p/1", "slow_seconds": 0.3}
    monitor = ChildrenMonitor(redis_server, crawl_id, site)
    monitor.start()
    names = iter(f"w{k}" for k in range(1, 100))

    def start():
        return start_worker(redis_server.url, crawl_id, site.url + "/p/0", settings=settings,
                            args=args, name=next(names))

    def holding() -> list:  # live workers holding the lease of a page the site holds
        p = st.r.pipeline(transaction=True)
        p.hgetall(st.k.owners).hgetall(st.k.inflight)
        owners, inflight = p.execute()
        held = site.held()
        pids = {int(owner.rsplit(":", 2)[1])  # worker id host:pid:rand
                for token, owner in owners.items()
                if token in inflight and path_of(url_of(Envelope.parse(inflight[token]))) in held}
        return [w for w in live if w.running and w.pid in pids]

    live = [start(), start()]
    killed = []
    try:
        # random moments spread over the crawl (by progress), each killing a worker
        # while it holds the lease of a page: the site holds the pages from then on
        # (callbacks and pipelines already running go on), so the victim cannot ack that
        # lease before the kill however fast the crawl runs
        for threshold in sorted(rng.sample(range(20, n_pages - 80), kills)):
            wait_for(lambda: st.stat("done") >= threshold, 60, f"{threshold} pages done")
            site.hold()
            time.sleep(rng.uniform(0, 0.3))
            busy = wait_for(holding, 30, "a worker holding a lease of a held page")
            victim = rng.choice(busy)
            victim.kill9()
            killed.append((victim.name, st.stat("done"), st.r.zcard(st.k.leases)))
            site.release()
            live.remove(victim)
            live.append(start())
        for w in live:
            assert w.wait(90) == 0, w.log_tail()
            assert w.close_reason() == "finished"
            assert_clean_log(w)
    finally:
        monitor.stop()

    stats = st.stats()
    counts = site_counts(site)
    print(f"\nseed {seed}; kills (worker, done, leases at kill): {killed}; "
          f"recovered {stats.get('recovered', 0)}; skipped_done {stats.get('skipped_done', 0)}; "
          f"pages fetched more than once: "
          f"{sum(1 for c in counts.values() if c > 1)}; monitor: {monitor.snapshots} snapshots, "
          f"{len(monitor.checked)}/{n_pages} acked requests checked")
    assert len(killed) == kills
    assert stats["recovered"] >= kills  # every victim held leases
    assert monitor.violations == [], monitor.violations[:5]
    assert len(monitor.checked) >= n_pages // 2
    # the fingerprints the monitor checks are the ones the crawl stored (all pages but
    # /p/0: the start request keeps dont_filter=True, so, as in Scrapy, it is not recorded)
    assert all(st.r.sismember(key, member) for key, member in monitor.seen_keys[1:])
    assert not st.r.sismember(*monitor.seen_keys[0])
    # no child was lost: every page reached, done once each, nothing dead
    assert_every_page_fetched(site, counts)
    assert stats["done"] == n_pages
    assert stats["enqueued"] == n_pages
    assert st.dead() == {}
    st.assert_drained()
    stored = {path_of(i["url"]) for w in start_worker.workers for i in w.items()}
    assert stored == site.all_page_paths()


# -- 4. a callback slower than the lease ---------------------------------------------

def test_callback_three_times_the_lease_is_not_handed_to_another_worker(
        redis_server, crawl_id, make_site, start_worker):
    n_pages, slow, slow_seconds = 150, "/p/137", 3 * LEASE
    site = make_site(pages=n_pages)
    st = CrawlState(redis_server, crawl_id)
    workers = [start_worker(redis_server.url, crawl_id, site.url + "/p/0", settings=BASE,
                            args={"slow_path": slow, "slow_seconds": slow_seconds},
                            name=f"w{i}") for i in (1, 2)]
    # while the callback sleeps, its lease is renewed (the deadline keeps moving)
    wait_for(lambda: site_counts(site)[slow] == 1, 30, "the slow page downloaded")
    (token, env), = wait_for(lambda: [(t, e) for t, e in st.inflight().items()
                                      if path_of(url_of(e)) == slow], 5, "its claim")
    deadlines = set()
    t0 = time.monotonic()
    while time.monotonic() - t0 < slow_seconds - 1.5:
        score = st.r.zscore(st.k.leases, token)
        assert score is not None, "the slow page's lease was lost"
        deadlines.add(int(score))
        time.sleep(0.1)
    assert len(deadlines) >= 4, deadlines

    for w in workers:
        assert w.wait(60) == 0, w.log_tail()
        assert w.close_reason() == "finished"
        ws = w.stats()
        assert "leased/lease_lost" not in ws and "leased/acked_stale" not in ws
        assert "Lost the lease" not in w.log_text()
    counts = site_counts(site)
    assert counts[slow] == 1
    assert set(counts.values()) == {1} and set(counts) == site.all_page_paths()
    stats = st.stats()
    assert stats["done"] == stats["acked"] == stats["claimed"] == n_pages
    assert "recovered" not in stats
    assert st.dead() == {}
    st.assert_drained()
    stored = Counter(path_of(i["url"]) for w in workers for i in w.items())
    assert stored[slow] == 1 and set(stored.values()) == {1}


# -- 5. a stalled worker -------------------------------------------------------------

def test_sigstopped_worker_loses_leases_others_redo_and_done_counts_once(
        redis_server, crawl_id, make_site, start_worker, tmp_path):
    n_pages, conc = 150, 8
    site = make_site(pages=n_pages)
    st = CrawlState(redis_server, crawl_id)
    # The staller holds 8 downloaded requests whose items wait in its pipeline until the
    # test lets them go: after it is resumed and its first renewal found the leases gone.
    release = tmp_path / "release-items"
    stalled, held = hold_all_claims(start_worker, redis_server, crawl_id, site, st, "stalled",
                                    conc, extra={"RECORD_DELAY": 0,
                                                 "RECORD_HOLD_FILE": str(release)})
    held_paths = {path_of(url_of(e)) for e in held.values()}
    stalled.sigstop()
    stopped_at = time.monotonic()
    other = start_worker(redis_server.url, crawl_id, site.url + "/p/0", settings=BASE,
                         name="other")
    # the other worker recovers the stalled worker's leases and finishes the crawl
    wait_for(lambda: st.stat("recovered") == conc, LEASE + SWEEP + 10, "recovery")
    print(f"\nstalled worker's {conc} leases recovered {time.monotonic() - stopped_at:.2f}s "
          f"after SIGSTOP")
    assert other.wait(60) == 0, other.log_tail()
    assert other.close_reason() == "finished"
    assert st.stat("done") == n_pages
    assert stalled.running  # still frozen
    stalled.sigcont()
    stalled.wait_until(lambda: "Lost the lease" in stalled.log_text(), timeout=60,
                       what="its first renewal after SIGCONT")
    release.touch()
    assert stalled.wait(60) == 0, stalled.log_tail()
    assert stalled.close_reason() == "finished"
    assert_clean_log(stalled)
    text = stalled.log_text()
    assert "Lost the lease" in text
    ws = stalled.stats()
    print(f"stalled worker stats: { {k: v for k, v in ws.items() if k.startswith('leased/')} }")
    assert ws["leased/lease_lost"] == conc
    assert ws["leased/claimed"] == conc
    assert ws["leased/acked_stale"] == conc  # it finished them late: not counted again
    assert "leased/acked" not in ws

    stats = st.stats()
    assert stats["done"] == n_pages
    assert stats["recovered"] == conc
    assert stats["claimed"] == n_pages + conc
    assert stats["acked"] == n_pages  # acks with the lease held: the other worker's
    assert st.dead() == {}
    st.assert_drained()
    counts = site_counts(site)
    assert_every_page_fetched(site, counts)
    assert {p for p, c in counts.items() if c > 1} == held_paths
    assert set(counts.values()) == {1, 2}
    # at least once: the other worker processed every page, the staller its 8 again
    assert Counter(path_of(i["url"]) for i in other.items()) == Counter(site.all_page_paths())
    assert {path_of(i["url"]) for i in stalled.items()} == held_paths
