"""Crawling again (#13 item 4): ``scrapy leased forget``, ``reset`` keeping UpsertPipeline's
records, revisits (LEASED_REVISIT_AFTER, ``leased_revisit_after``), a fresh run on
purpose (LEASED_FLUSH_ON_START). Real ``scrapy crawl`` workers (tests/project, spider
``site``), a real private redis-server, the local test site and its request log.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter

import pytest

from scrapy_leased.frontier import Envelope, as_str
from scrapy_leased.frontier.keys import CrawlKeys
from tests.support.workers import wait_for
from tests.test_commands import assert_finished, leased, ok, one_error, stat

WAIT = 120  # hang guard for a crawl, not a check


def crawl_keys(r, crawl_id: str) -> set[str]:
    prefix = CrawlKeys(crawl_id).prefix
    return {as_str(k) for k in r.scan_iter(match=prefix.replace("{", "\\{").replace(
        "}", "\\}") + "*") if as_str(k).startswith(prefix)}


# --------------------------------------------------------------------------- forget


def test_forget_10_urls_of_a_finished_crawl_a_new_start_fetches_exactly_those(
        redis_server, make_site, start_worker, crawl_id, tmp_path):
    """A finished crawl whose start requests are every page (deduplicated, not
    ``dont_filter``): started again, it fetches nothing. After ``forget`` of 10 of its
    URLs (arguments, a file and stdin), a new start fetches exactly those 10, once each
    (their links are still seen)."""
    pages = 40
    site = make_site(pages=pages)
    url = redis_server.url
    starts = [site.page_url(i) for i in range(pages)]
    args = {"start_filter": "1"}
    assert_finished(start_worker(url, crawl_id, starts, args=args, name="first"))
    assert site.count_by_path() == Counter({f"/p/{i}": 1 for i in range(pages)})

    # started again as it is: every start request is seen, nothing is fetched
    site.clear_log()
    assert_finished(start_worker(url, crawl_id, starts, args=args, name="again"))
    assert site.count_by_path() == Counter()

    forget = [site.page_url(i) for i in range(5, 15)]
    listing = tmp_path / "forget.txt"
    listing.write_text("# refresh these\n" + "\n".join(forget[4:9]) + "\n")
    never = site.url + "/p/999?never=1"  # never seen: reported, not an error
    out = ok(leased("forget", crawl_id, *forget[:4], "-f", str(listing), "-", never,
                    "--redis-url", url, input=forget[9] + "\n"))
    assert f"forgot 10 of 11 URLs of crawl '{crawl_id}' (1 not seen)" in out, out
    assert stat(redis_server.client(), crawl_id, "forgotten") == 10
    # forgotten already: nothing left to forget
    out = ok(leased("forget", crawl_id, forget[0], "--redis-url", url))
    assert "forgot 0 of 1 URL" in out, out
    one_error(leased("forget", crawl_id, "not-a-url", "--redis-url", url), "not a URL")
    one_error(leased("forget", crawl_id, "--redis-url", url), "nothing to forget")
    one_error(leased("forget", "no-such-crawl", forget[0], "--redis-url", url),
              "unknown crawl")

    site.clear_log()
    w = start_worker(url, crawl_id, starts, args=args, name="refresh")
    assert_finished(w)
    assert site.count_by_path() == Counter({f"/p/{i}": 1 for i in range(5, 15)})
    assert len(w.items()) == 10
    st = json.loads(ok(leased("status", crawl_id, "--json", "--sample", "0",
                              "--redis-url", url)))
    assert (st["done"], st["todo"], st["processing"], st["dead"]) == (pages + 10, 0, 0, 0)


# --------------------------------------------------------------------------- reset


def test_reset_keeps_the_upsert_records_unless_asked(redis_server, make_site, start_worker,
                                                      crawl_id):
    """``reset --yes`` deletes the crawl's frontier and keeps UpsertPipeline's records
    hashes (with the project's LEASED_UPSERT_PREFIX); the crawl then runs again from
    scratch, into the same records; ``reset --yes --records`` deletes them too."""
    pages = 20
    site = make_site(pages=pages)
    url = redis_server.url
    r = redis_server.client()
    k = CrawlKeys(crawl_id)
    prefix = "kept"
    settings = {"LEASED_UPSERT_ENABLED": True, "LEASED_UPSERT_PREFIX": prefix}
    assert_finished(start_worker(url, crawl_id, site.url + "/p/0", settings=settings))
    records = k.records("dict", prefix)
    stored = {as_str(f): json.loads(v) for f, v in r.hgetall(records).items()}
    assert len(stored) == pages
    frontier = crawl_keys(r, crawl_id) - {records}
    assert len(frontier) > 10

    with_prefix = ("-s", f"LEASED_UPSERT_PREFIX={prefix}")
    one_error(leased("reset", crawl_id, "--redis-url", url, *with_prefix),
              f"deletes {len(frontier)} keys", "keeping 1 records hash", "add --yes")
    out = ok(leased("reset", crawl_id, "--yes", "--redis-url", url, *with_prefix))
    assert f"deleted {len(frontier)} keys of crawl '{crawl_id}'" in out, out
    assert f"kept 1 records hash of UpsertPipeline ({k.prefix}{prefix}:*" in out, out
    assert crawl_keys(r, crawl_id) == {records}
    assert {as_str(f): json.loads(v) for f, v in r.hgetall(records).items()} == stored

    # the crawl starts from scratch (every page again), upserting into the same records:
    # the new claims' fencing tokens are above the stored ones (lua/lib_guard.lua)
    site.clear_log()
    assert_finished(start_worker(url, crawl_id, site.url + "/p/0", settings=settings,
                                 name="again"))
    assert site.count_by_path() == Counter({f"/p/{i}": 1 for i in range(pages)})
    again = {as_str(f): json.loads(v) for f, v in r.hgetall(records).items()}
    assert set(again) == set(stored)
    assert all(again[key]["fence"] > stored[key]["fence"] for key in stored)

    out = ok(leased("reset", crawl_id, "--yes", "--records", "--redis-url", url,
                    *with_prefix))
    assert "kept" not in out, out
    assert crawl_keys(r, crawl_id) == set()
    res = leased("status", crawl_id, "--records", "--redis-url", url)
    assert res.returncode == 2 and "--records" in res.stderr, res


# --------------------------------------------------------------------------- revisits


def _fetch_times(site) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for e in site.entries():
        out.setdefault(e["path"], []).append(e["t"])
    return {path: sorted(ts) for path, ts in out.items()}


def test_revisit_after_2_s_fetches_again_after_2_s_and_not_before(
        redis_server, make_site, start_worker, crawl_id):
    """LEASED_REVISIT_AFTER = 2: each page acked is queued again 2 s after its ack (Redis
    time, the score of its ``revisit`` entry) and fetched then, not before; a page whose
    request says ``leased_revisit_after: 0`` is not revisited. A keep-alive worker
    revisits for as long as it runs; a worker without it finishes when nothing is queued,
    and the revisits due by the next start are fetched by it."""
    site = make_site(pages=3)  # /p/0 -> /p/1, /p/2
    url = redis_server.url
    r = redis_server.client()
    k = CrawlKeys(crawl_id)
    settings = {"LEASED_REVISIT_AFTER": 2, "LEASED_SWEEP_INTERVAL": 0.3}
    args = {"start_filter": "1", "revisit_path": "/p/2", "revisit_after": "0"}
    w = start_worker(url, crawl_id, site.url + "/p/0", args=args,
                     settings={**settings, "LEASED_KEEP_ALIVE": True}, name="keep")
    dues: dict[int, tuple[str, float]] = {}  # rid -> (path, due ms), as Redis scheduled

    def poll() -> bool:
        for member, score in r.zrange(k.revisit, 0, -1, withscores=True):
            env = Envelope.parse(member)
            path = json.loads(env.payload)["u"].split(site.url, 1)[1]
            dues[env.rid] = (path, score)
        times = _fetch_times(site)
        return all(len(times.get(p, [])) >= 3 for p in ("/p/0", "/p/1"))

    wait_for(poll, WAIT, "/p/0 and /p/1 fetched 3 times", [w])
    w.sigterm()
    assert w.wait(WAIT) == 0, w.log_tail(60)
    assert "Traceback" not in w.log_text(), w.log_tail(80)
    times = _fetch_times(site)
    assert len(times["/p/2"]) == 1  # fetched once: never revisited
    assert all(path != "/p/2" for path, _ in dues.values())
    for path in ("/p/0", "/p/1"):
        fetched = times[path]
        due = sorted(d for p, d in dues.values() if p == path)
        assert len(due) >= len(fetched) - 1, (path, fetched, due)
        for i in range(len(fetched) - 1):
            # acked after its fetch, due 2 s after the ack (Redis TIME, whole ms: 1 ms of
            # rounding allowed); fetched again once due, not before
            assert due[i] >= fetched[i] * 1000 + 2000 - 1, (path, i, fetched, due)
            assert fetched[i + 1] * 1000 >= due[i], (path, i, fetched, due)
            assert fetched[i + 1] - fetched[i] >= 2.0 - 0.001, (path, fetched)
    assert w.stats()["leased/revisited"] >= 4

    # Without LEASED_KEEP_ALIVE: the worker queues the revisits due by its start, fetches
    # them, and finishes with nothing queued (the next revisits wait for the next start).
    wait_for(lambda: r.zcard(k.revisit) == 2 and all(
        s / 1000 < time.time() for _, s in r.zrange(k.revisit, 0, -1, withscores=True)),
        WAIT, "both revisits due", [])
    site.clear_log()
    assert_finished(start_worker(url, crawl_id, site.url + "/p/0", args=args,
                                 settings=settings, name="once"))
    assert site.count_by_path() == Counter({"/p/0": 1, "/p/1": 1})
    assert r.zcard(k.revisit) == 2


# --------------------------------------------------------------------------- flush


FLUSHED = "LEASED_FLUSH_ON_START: flushed crawl"


def test_flush_on_start_begins_a_fresh_run_only_when_none_is_on(
        redis_server, make_site, start_worker, crawl_id):
    """LEASED_FLUSH_ON_START: a finished crawl started again with it fetches every page
    again (its frontier deleted, UpsertPipeline's records kept and updated); a worker
    started with it while another worker of the crawl is alive flushes nothing and joins
    that run, naming the live worker; of two started together, one flushes and the
    other joins its run: every page is fetched once."""
    pages = 30
    site = make_site(pages=pages, delay=0.05)
    url = redis_server.url
    r = redis_server.client()
    k = CrawlKeys(crawl_id)
    base = {"LEASED_UPSERT_ENABLED": True, "CONCURRENT_REQUESTS": 4}
    flush = {**base, "LEASED_FLUSH_ON_START": True}
    args = {"start_filter": "1"}
    every = Counter({f"/p/{i}": 1 for i in range(pages)})
    assert_finished(start_worker(url, crawl_id, site.url + "/p/0", args=args, settings=base,
                                 name="first"))
    assert site.count_by_path() == every
    records = {as_str(f): json.loads(v) for f, v in r.hgetall(k.records("dict")).items()}
    assert len(records) == pages

    site.clear_log()
    w = start_worker(url, crawl_id, site.url + "/p/0", args=args, settings=flush,
                     name="fresh")
    assert_finished(w)
    assert FLUSHED in w.log_text() and w.stats()["leased/flushed_keys"] > 10
    assert site.count_by_path() == every  # a fresh run: everything again, once
    assert stat(r, crawl_id, "done") == pages  # fresh counters
    again = {as_str(f): json.loads(v) for f, v in r.hgetall(k.records("dict")).items()}
    assert set(again) == set(records)
    assert all(again[key]["fence"] > records[key]["fence"] for key in records)

    # a worker of the crawl is alive: nothing is flushed, the new worker joins its run
    site.clear_log()
    keep = start_worker(url, crawl_id, site.url + "/p/0", args=args,
                        settings={**base, "LEASED_KEEP_ALIVE": True}, name="keep")
    keep.wait_log("Leased frontier", timeout=WAIT)
    (kept_id,) = [as_str(m) for m in r.zrange(k.workers, 0, -1)]
    late = start_worker(url, crawl_id, site.url + "/p/0", args=args, settings=flush,
                        name="late")
    assert_finished(late)
    assert FLUSHED not in late.log_text()
    assert "not flushing crawl" in late.log_text() and kept_id in late.log_text()
    assert site.count_by_path() == Counter()  # still seen: nothing fetched again
    assert stat(r, crawl_id, "done") == pages
    keep.sigterm()
    assert keep.wait(WAIT) == 0

    # two started together: one flushes, the other joins its run
    site.clear_log()
    together = start_worker.barrier(2)  # both have flushed or joined before crawling
    ws = [start_worker(url, crawl_id, site.url + "/p/0", args=args,
                       settings={**flush, **together}, name=f"w{i}") for i in range(2)]
    for w in ws:
        assert_finished(w)
    assert sum(FLUSHED in w.log_text() for w in ws) == 1, [w.log_tail() for w in ws]
    assert site.count_by_path() == every
    assert stat(r, crawl_id, "done") == pages


# --------------------------------------------------------------------------- seen TTL


def redis_ms(r) -> int:
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


def test_seen_entries_expire_between_ttl_and_twice_ttl(redis_server, crawl_id):
    """LEASED_SEEN_TTL keeps the compact seen set in generations (Redis TIME // ttl): an
    entry added in generation g is seen until generation g + 2 begins, never less than
    ttl after it was added, and queued again after; the keys of a generation expire; a
    caller whose generation is stale has its call refused unchanged and sent again with
    the current keys; ``forget`` finds an entry in either generation; a worker with
    another LEASED_SEEN_TTL is refused, naming the setting."""
    from scrapy_leased.frontier import NewRequest
    from tests.test_crawl import payload, run_frontier

    r = redis_server.client()
    keys = CrawlKeys(crawl_id)
    ttl = 1000

    async def body(f):
        await f.check_layout(14, ttl)
        req = NewRequest(payload("https://example.com/a"), bucket=3, member=42)
        assert await f.enqueue([req]) == [True]
        added = redis_ms(r)  # at or after the add
        gen = f.seen_gen
        boundary = (gen + 2) * ttl  # the entry is seen until then
        again = await f.enqueue([req])
        if redis_ms(r) < boundary:  # the second call ran before the boundary: seen
            assert again == [False]
        assert 0 < r.pttl(keys.seen_bucket(3, gen)) <= boundary - added + 1000
        while redis_ms(r) < boundary:  # a condition on Redis time, not a sleep of ours
            await asyncio.sleep(0.05)
        f.seen_gen = gen  # stale on purpose: the script names the current generation
        assert await f.enqueue([req]) == [True]  # expired: queued again
        assert f.seen_gen >= gen + 2
        other = NewRequest(payload("https://example.com/b"), bucket=3, member=43)
        assert await f.enqueue([other]) == [True]
        return gen

    run_frontier(redis_server.url, crawl_id, body)
    assert stat(r, crawl_id, "enqueued") == 3

    async def forget(f):
        from scrapy_leased.fleet import FleetAdmin

        admin = FleetAdmin(f.client, keys)
        assert await admin.forget([(3, 43), (3, 44)]) == [True, False]
        await f.check_layout(14, ttl)
        other = NewRequest(payload("https://example.com/b"), bucket=3, member=43)
        assert await f.enqueue([other]) == [True]
        with pytest.raises(ValueError, match=r"LEASED_SEEN_TTL \(0\) differs .*\(1;"):
            await f.check_layout(14, 0)

    run_frontier(redis_server.url, crawl_id, forget)

    # a crawl started before LEASED_SEEN_TTL existed (bucket bits, no TTL recorded):
    # its seen set never expires, and a worker asking for an expiry is refused
    old = crawl_id + "-old"
    r.hset(CrawlKeys(old).meta, "seen_bucket_bits", 14)

    async def started_before(f):
        with pytest.raises(ValueError, match=r"LEASED_SEEN_TTL \(1\) differs .*\(0;"):
            await f.check_layout(14, ttl)
        await f.check_layout(14, 0)

    run_frontier(redis_server.url, old, started_before)


def test_a_crawl_with_a_seen_ttl_fetches_its_pages_again_once_they_expired(
        redis_server, make_site, start_worker, crawl_id):
    """A finished crawl with LEASED_SEEN_TTL = 1, started again once Redis time passed
    the expiry of every entry it added: the new run fetches every page again."""
    pages = 30
    site = make_site(pages=pages)
    r = redis_server.client()
    settings = {"LEASED_SEEN_TTL": 1}
    assert_finished(start_worker(redis_server.url, crawl_id, site.url + "/p/0",
                                 settings=settings, name="first"))
    assert set(site.count_by_path()) == {f"/p/{i}" for i in range(pages)}
    gens = [int(as_str(k).split(":")[-2]) for k in
            r.scan_iter(match=CrawlKeys(crawl_id).prefix.replace("{", "\\{")
                        .replace("}", "\\}") + "seen:*")]
    if gens:  # none left: on a slow machine every entry expired before the worker ended
        wait_for(lambda: redis_ms(r) >= (max(gens) + 2) * 1000, 30, "every seen entry expired")
    site.clear_log()
    assert_finished(start_worker(redis_server.url, crawl_id, site.url + "/p/0",
                                 settings=settings, name="again"))
    assert set(site.count_by_path()) == {f"/p/{i}" for i in range(pages)}
    res = leased("status", crawl_id, "--redis-url", redis_server.url)
    assert res.returncode == 0
    worker = start_worker(redis_server.url, crawl_id, site.url + "/p/0", name="no-ttl")
    assert worker.wait(WAIT) != 0
    assert "LEASED_SEEN_TTL (0) differs" in worker.log_text()


def test_a_late_ack_keeps_the_revisit_schedule(redis_server, crawl_id):
    """A worker acks a request with a revisit interval after its lease expired and the
    request was requeued: the ack marks it done (its requeued copy is dropped as done),
    and schedules the revisit all the same, from the request the worker claimed."""
    from scrapy_leased.frontier import NewRequest, Revisit
    from tests.test_crawl import payload, run_frontier

    r = redis_server.client()
    k = CrawlKeys(crawl_id)

    async def body(f):
        f.lease_ms = 300
        await f.check_layout(14)
        await f.enqueue([NewRequest(payload("https://example.com/r"), bucket=1, member=7)])
        (token, env), = (await f.claim(1, "slow")).claims
        deadline = r.zscore(k.leases, token)
        while redis_ms(r) <= deadline:  # until the lease expired (Redis time)
            await asyncio.sleep(0.02)
        assert (await f.recover())[0] == 1  # requeued, the same rid
        revisit = Revisit(2000, env.priority, env.lane, env.payload)
        result = await f.commit(acks=[(token, env.rid)], revisits={token: revisit})
        assert result.acks == [2]  # the lease was not held; newly done
        (member, due), = r.zrange(k.revisit, 0, -1, withscores=True)
        again = Envelope.parse(member)
        assert (again.rid, again.attempts, again.payload) == (env.rid, 0, env.payload)
        assert due >= deadline + 2000
        assert (await f.claim(1, "other")).claims == []  # the copy is dropped as done
        assert stat(r, crawl_id, "skipped_done") == 1

    run_frontier(redis_server.url, crawl_id, body)
