"""Redis Sentinel and Redis Cluster, for real: ``redis-server --sentinel`` processes
watching a master and its replicas, a 3-master (+ 3 replicas) cluster made with
``redis-cli --cluster create`` (tests/support/redis_ha.py), real ``scrapy crawl``
workers (tests/project, spider ``site``), the local test site, and ``scrapy leased``
commands run as processes.

Faults are caused, not simulated: the Sentinel master is killed with kill -9 mid-crawl
and Sentinel promotes a replica; the crawl's cluster slot is migrated to another master
mid-crawl (what ``redis-cli --cluster reshard`` does, paced so the workers meet ASK and
TRYAGAIN), then the master now serving it is killed and its replica takes over.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from collections import Counter
from typing import Any

import pytest
import redis

from scrapy_leased._redis.connection import LeasedRedisError, check_reachable, connect, make_client
from scrapy_leased._redis.url import RedisUrlError, parse_redis_url, redact
from scrapy_leased.fleet import FleetAdmin
from scrapy_leased.frontier import Frontier, NewRequest, as_str
from scrapy_leased.frontier.keys import CrawlKeys
from scrapy_leased.frontier.scripts import WAIT_TIMEOUT_MS, script_source
from scrapy_leased.settings import LeasedConfig, LeasedConfigError, check_redis_url
from tests.support.queue import queue_len
from tests.support.redis_ha import RedisCluster, SentinelGroup, SlotMove, find_redis_cli
from tests.support.workers import wait_for
from tests.test_commands import dead_json, leased, ok, one_error, status_json

WAIT = 180  # hang guard for a whole crawl, not a check
# Leases outlive an outage of a few seconds (no expiry while Redis fails over), and a
# claim whose reply was lost in the kill comes back within seconds.
# UpsertPipeline on (into the crawl's Redis): the records follow the failover too
HA = {"LEASED_LEASE_SECONDS": 6, "LEASED_RENEW_INTERVAL": 1, "LEASED_SWEEP_INTERVAL": 0.5,
      "LEASED_UPSERT_ENABLED": True}


def _cli_or_skip() -> None:
    try:
        find_redis_cli()
    except RuntimeError as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{exc}; CI=true, where the cluster tests must run", pytrace=False)
        pytest.skip(str(exc))


@pytest.fixture
def sentinel_group():
    with SentinelGroup(replicas=2, sentinels=3, password="data-secret",
                       sentinel_password="sentinel-secret") as group:
        yield group


@pytest.fixture
def cluster():
    _cli_or_skip()
    with RedisCluster(masters=3, replicas=1) as c:
        yield c


async def queued_frontier(url: str, k: CrawlKeys, n: int = 5) -> Frontier:
    """A Frontier on the cluster ``url`` with the seen-set layout recorded and five
    ``n`` requests queued (its client closed by the caller)."""
    f = Frontier(await connect(url), k, lease_ms=30_000, max_attempts=4)
    await f.check_layout(14)
    await f.enqueue([NewRequest(json.dumps({"u": f"http://h/{i}"}), 0, i, i) for i in range(n)])
    return f


def assert_finished(w, timeout: float = WAIT, clean: bool = True) -> None:
    """Exit status 0, close reason 'finished' and (``clean``) no traceback logged."""
    rc = w.wait(timeout)
    assert rc == 0, f"worker {w.name} rc={rc}\n{w.log_tail(60)}"
    assert w.close_reason() == "finished", f"worker {w.name}\n{w.log_tail(60)}"
    if clean:
        assert "Traceback" not in w.log_text(), f"worker {w.name}\n{w.log_tail(80)}"


def read_crawl(r: Any, crawl_id: str) -> dict[str, Any]:
    """The crawl's state read key by key (a sync client of the master or the cluster;
    no MULTI: the cluster client has no cross-command transaction with TIME)."""
    k = CrawlKeys(crawl_id)
    lanes = [as_str(x) for x in r.zrange(k.lanes, 0, -1)]
    return {
        "stats": {as_str(a): int(b) for a, b in r.hgetall(k.stats).items()},
        "queued": sum(queue_len(r, k, x) for x in lanes),
        "leases": r.zcard(k.leases),
        "inflight": r.hlen(k.inflight),
        "owners": r.hlen(k.owners),
        "dead": r.hlen(k.dead),
        "done_bits": r.bitcount(k.done),
        "workers": r.zcard(k.workers),
        "records": r.hlen(k.records("dict")),
    }


def assert_complete(st: dict[str, Any], pages: int) -> None:
    assert st["stats"].get("done") == pages, st
    assert st["done_bits"] == pages, st
    assert (st["queued"], st["leases"], st["inflight"], st["owners"], st["workers"]) \
        == (0, 0, 0, 0, 0), st


def assert_every_page_fetched(site, pages: int) -> Counter:
    counts = site.count_by_path(include_query=False)
    missing = site.all_page_paths() - set(counts)
    assert not missing, f"{len(missing)} pages never fetched: {sorted(missing)[:20]}"
    assert set(counts) == site.all_page_paths(), set(counts) - site.all_page_paths()
    return counts


def script_sha(name: str) -> str:
    return hashlib.sha1(script_source(name).encode()).hexdigest()


# --------------------------------------------------------------------------- URLs


@pytest.mark.parametrize("url, kind, hosts, extra", [
    ("redis+sentinel://s1,s2:26380,[::1]:26381/mymaster", "sentinel",
     (("s1", 26379), ("s2", 26380), ("::1", 26381)), {"master_name": "mymaster", "db": 0}),
    ("redis+sentinel://:p%40ss@s1:1/m/3?sentinel_password=sp&socket_timeout=2", "sentinel",
     (("s1", 1),), {"master_name": "m", "db": 3, "password": "p@ss",
                    "sentinel_password": "sp", "options": {"socket_timeout": 2.0}}),
    ("redis+sentinel://u:p@s1/m?sentinel_username=su&sentinel_password=sp", "sentinel",
     (("s1", 26379),), {"username": "u", "password": "p", "sentinel_username": "su"}),
    ("redis+cluster://n1,n2:7001", "cluster", (("n1", 6379), ("n2", 7001)), {"db": 0}),
    ("redis+cluster://:pw@n1:7000/0?health_check_interval=5", "cluster", (("n1", 7000),),
     {"password": "pw", "options": {"health_check_interval": 5}}),
    ("redis://h:6379/2", "server", (), {}),
    ("redis://h:6379/2?wait_replicas=1&socket_timeout=3", "server", (),
     {"wait_replicas": 1, "url": "redis://h:6379/2?socket_timeout=3"}),
    ("redis+sentinel://s1/m/0?wait_replicas=2&sentinel_password=x", "sentinel",
     (("s1", 26379),), {"wait_replicas": 2, "sentinel_password": "x"}),
    ("unix:///tmp/r.sock", "server", (), {}),
])
def test_urls_name_a_topology(url, kind, hosts, extra):
    t = parse_redis_url(url)
    assert (t.kind, t.hosts) == (kind, hosts)
    for name, value in extra.items():
        assert getattr(t, name) == value, name
    assert check_redis_url(url) == url
    assert LeasedConfig.from_settings(_settings(LEASED_REDIS_URL=url)).redis_url == url


def _settings(**kw: Any):
    from scrapy.settings import Settings

    return Settings(kw)


@pytest.mark.parametrize("setting, url, words", [
    ("LEASED_REDIS_URL", "redis+sentinel://s1:26379", ["must name the master", "mymaster"]),
    ("LEASED_REDIS_URL", "redis+sentinel://s1/m/0/x", ["more than a master name"]),
    ("LEASED_REDIS_URL", "redis+sentinel://s1/m/zero", ["'zero'", "database number"]),
    ("LEASED_REDIS_URL", "redis+sentinel://s1:port/m", ["invalid port", "s1:port"]),
    ("LEASED_REDIS_URL", "redis+sentinel://s1,,s2/m", ["empty host"]),
    ("LEASED_REDIS_URL", "redis+cluster://n1/3", ["database other than 0"]),
    ("LEASED_REDIS_URL", "redis+cluster://n1?ssl=true", ["unknown option 'ssl'"]),
    ("LEASED_REDIS_URL", "redis+cluster://n1?socket_timeout=soon", ["invalid value",
                                                                     "socket_timeout"]),
    ("LEASED_REDIS_URL", "redis+sentinels://s1/m", ["redis+sentinel://", "redis+cluster://"]),
    ("LEASED_REDIS_URL", "redis://h/0?wait_replicas=all", ["wait_replicas='all'"]),
    ("LEASED_REDIS_URL", "redis+cluster://n1?wait_replicas=1", ["wait_replicas",
                                                               "redis+cluster:// URLs do not"]),
    ("LEASED_UPSERT_URL", "redis+sentinel://s1", ["LEASED_UPSERT_URL", "must name the master"]),
])
def test_bad_urls_are_refused_naming_the_setting(setting, url, words):
    with pytest.raises(LeasedConfigError) as err:
        if setting == "LEASED_UPSERT_URL":
            from scrapy_leased.upsert import UpsertConfig

            UpsertConfig.from_settings(_settings(**{setting: url}))
        else:
            LeasedConfig.from_settings(_settings(**{setting: url}))
    message = str(err.value)
    assert message.startswith(setting), message
    for word in words:
        assert word in message, (word, message)


def test_passwords_never_shown():
    url = "redis+sentinel://user:data-pw@s1,s2/m/0?sentinel_password=sent-pw&socket_timeout=1"
    shown = redact(url)
    assert "data-pw" not in shown and "sent-pw" not in shown, shown
    assert shown == ("redis+sentinel://user:***@s1,s2/m/0?sentinel_password=***"
                     "&socket_timeout=1")
    assert redact("redis://:pw@h:1/0") == "redis://:***@h:1/0"
    assert redact("redis://h:1/0") == "redis://h:1/0"
    with pytest.raises(LeasedConfigError) as err:
        check_redis_url("redis+sentinel://:data-pw@s1?sentinel_password=sent-pw")
    assert "data-pw" not in str(err.value) and "sent-pw" not in str(err.value)
    with pytest.raises(RedisUrlError):
        parse_redis_url("redis+sentinel://s1")


# --------------------------------------------------------------------------- Sentinel


def test_sentinel_clients_follow_the_master_and_fail_clearly(sentinel_group):
    """make_client finds the master through the sentinels (with the sentinels' own
    password), writes there, and after a failover writes to the promoted replica; a
    wrong master name or sentinel password is one clear error naming the setting."""
    g = sentinel_group
    url = g.url

    async def main() -> None:
        client = await connect(url)
        try:
            await client.set("k", "before")
            old = g.kill_master()
            new = await asyncio.to_thread(g.wait_failover, old)
            await _until(lambda: client.set("k", "after"))
            assert new.client().get("k") == b"after"
            assert (await client.info("server"))["tcp_port"] == new.port
        finally:
            await client.aclose()

    asyncio.run(main())
    check_reachable(url)
    bad_name = url.replace("/mymaster/", "/nomaster/")
    with pytest.raises(LeasedRedisError) as err:
        check_reachable(bad_name)
    assert "LEASED_REDIS_URL" in str(err.value) and "nomaster" in str(err.value)
    assert "sentinel-secret" not in str(err.value) and "data-secret" not in str(err.value)
    bad_pass = url.replace("sentinel_password=sentinel-secret", "sentinel_password=wrong")
    with pytest.raises(LeasedRedisError) as err:
        asyncio.run(connect(bad_pass))
    assert "cannot reach Redis" in str(err.value) and "wrong" not in str(err.value)


async def _until(call, timeout: float = 30) -> Any:
    """Retry ``call()`` (a coroutine factory) on Redis errors until it works."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await call()
        except (redis.RedisError, OSError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


@pytest.mark.parametrize("wait_replicas", [0, 1])
def test_sentinel_failover_mid_crawl_loses_nothing(sentinel_group, make_site, start_worker,
                                                  crawl_id, wait_replicas):
    """3 workers, 2,000 pages, items upserted into the crawl's Redis: the master is killed
    with kill -9 at 600 pages done and Sentinel promotes a replica. Every worker ends
    'finished', every page is fetched, done == 2,000, nothing queued or leased, no dead
    letter, a record for every page; then ``scrapy leased status`` reads the crawl
    through the sentinels. The promoted replica never saw the scripts (SCRIPT LOAD is
    not replicated): the workers' NOSCRIPT reload is exercised too. Run without and
    with ``wait_replicas=1``."""
    g = sentinel_group
    pages = 2000
    site = make_site(pages=pages)
    url = g.url + (f"&wait_replicas={wait_replicas}" if wait_replicas else "")
    ws = [start_worker(url, crawl_id, site.url + "/p/0", name=f"w{i}", settings=HA)
          for i in range(3)]
    k = CrawlKeys(crawl_id)
    r = g.client()
    wait_for(lambda: int(r.hget(k.stats, "done") or 0) >= 600, WAIT, "600 pages done", ws)
    claim_sha = script_sha("claim")
    assert r.script_exists(claim_sha) == [True]
    assert all(srv.client().script_exists(claim_sha) == [False]
               for srv in g.servers if srv is not g.master())
    old = g.kill_master()
    t_kill = time.monotonic()
    fetched_at_kill = len(site.entries())
    new = g.wait_failover(old)
    t_promoted = time.monotonic()
    for w in ws:
        assert_finished(w)

    assert g.master().port == new.port  # the one failover this test caused, no other
    r = new.client()
    assert r.script_exists(claim_sha) == [True]  # loaded again after NOSCRIPT
    st = read_crawl(r, crawl_id)
    counts = assert_every_page_fetched(site, pages)
    twice = sum(1 for n in counts.values() if n > 1)
    print(f"\nkill -9 of the master at {fetched_at_kill} fetches; replica promoted after "
          f"{t_promoted - t_kill:.1f} s; pages fetched twice: {twice}; stats {st['stats']}")
    assert_complete(st, pages)
    assert st["dead"] == 0, st
    assert st["records"] == pages, st  # UpsertPipeline's store followed the failover too
    assert fetched_at_kill < sum(counts.values())  # the crawl went on after the failover
    doc = status_json(g.url, crawl_id, "--sample", "0")
    assert (doc["done"], doc["todo"], doc["processing"], doc["dead"]) == (pages, 0, 0, 0), doc
    assert "sentinel-secret" not in json.dumps(doc) and "data-secret" not in json.dumps(doc)


def test_fleet_commands_through_sentinel(sentinel_group, crawl_id):
    """seed, status, dead and reset with a redis+sentinel:// URL (passwords for the
    servers and the sentinels), after a failover as before it."""
    g = sentinel_group
    url = g.url
    out = ok(leased("seed", crawl_id, "http://127.0.0.1:9/p/1", "http://127.0.0.1:9/p/2",
                    "--redis-url", url))
    assert "2 URLs, 2 queued" in out, out
    g.wait_failover(g.kill_master())
    doc = status_json(url, crawl_id, "--sample", "0")
    assert (doc["todo"], doc["done"], doc["dead"]) == (2, 0, 0), doc
    assert "***" in doc["redis"] and "secret" not in doc["redis"], doc["redis"]
    assert dead_json(url, crawl_id)["dead"] == 0
    out = ok(leased("reset", crawl_id, "--yes", "--redis-url", url))
    assert "deleted" in out, out
    one_error(leased("status", crawl_id, "--redis-url", url), "unknown crawl")
    bad = url.replace("sentinel_password=sentinel-secret", "sentinel_password=nope")
    line = one_error(leased("status", crawl_id, "--redis-url", bad), "cannot reach Redis",
                     "--redis-url", "AuthenticationError")
    assert "nope" not in line and "secret" not in line, line


# --------------------------------------------------------------------------- Cluster


def crawl_key_slots(c: RedisCluster, crawl_id: str) -> dict[int, set[str]]:
    """slot -> keys of the crawl, from a SCAN of every master."""
    out: dict[int, set[str]] = {}
    prefix = CrawlKeys(crawl_id).prefix
    for node in c.masters():
        r = node.client()
        for key in r.scan_iter(match="leased:*", count=1000):
            key = as_str(key)
            if key.startswith(prefix):
                out.setdefault(c.keyslot(key), set()).add(key)
        r.close()
    return out


def test_cluster_crawls_keep_their_keys_in_one_slot_spread_over_the_masters(
        cluster, make_site, start_worker):
    """Three crawls at once, one worker each, crawl ids hashing to three different
    masters: each crawl's keys (queues, seen buckets, leases, records, ...) all sit in
    the slot of its {crawl id}, and ``scrapy leased status`` of an unknown crawl lists
    the crawls of every master."""
    by_master: dict[int, str] = {}
    i = 0
    while len(by_master) < 3:  # deterministic: the first ids that land on each master
        cid = f"spread-{i}"
        by_master.setdefault(cluster.owner(cluster.keyslot(CrawlKeys(cid).meta)).port, cid)
        i += 1
    site = make_site(pages=300)
    ws = [start_worker(cluster.url, cid, site.url + "/p/0", name=cid,
                       settings={"LEASED_UPSERT_ENABLED": True}) for cid in
          by_master.values()]
    for w in ws:
        assert_finished(w)
    r = cluster.client()
    for port, cid in by_master.items():
        slots = crawl_key_slots(cluster, cid)
        assert list(slots) == [cluster.keyslot(CrawlKeys(cid).meta)], slots
        keys = slots.popitem()[1]
        assert len(keys) > 100, len(keys)  # seen buckets, lanes, records, ... all there
        assert cluster.owner(cluster.keyslot(CrawlKeys(cid).meta)).port == port
        st = read_crawl(r, cid)
        assert_complete(st, 300)
        assert st["records"] == 300 and st["dead"] == 0, st
    line = one_error(leased("status", "no-such-crawl", "--redis-url", cluster.url),
                     "unknown crawl")
    for cid in by_master.values():
        assert cid in line, line
    r.close()


def test_cluster_slot_migration_and_shard_failover_mid_crawl(cluster, make_site,
                                                             start_worker, crawl_id):
    """3 workers, 2,000 pages on a 3-master cluster. At 500 pages done the crawl's slot
    is migrated to another master, 5 keys at a time, 20 ms apart (the workers meet ASK
    and TRYAGAIN for its whole length, then MOVED); at 1,300 done the master now serving
    the slot is killed with kill -9 and its replica takes over (the site holds its pages
    over the failover, so that work is left for the promoted replica). done == 2,000, all
    workers 'finished', every page fetched, nothing queued or leased, no dead letter."""
    pages = 2000
    # Every page takes 0.5 s: with 3 x 8 downloads at a time (one host), the 1,500 pages
    # after the first 500 take at least 31 s however fast the machine, so the crawl is
    # still on when the slot has migrated (7 s on a loaded machine).
    site = make_site(pages=pages, delay=0.5)
    k = CrawlKeys(crawl_id)
    slot = cluster.keyslot(k.meta)
    source = cluster.owner(slot)
    dest = next(m for m in cluster.masters() if m is not source)
    ws = start_worker.fleet(3, cluster.url, crawl_id, site.url + "/p/0", HA)
    r = cluster.client()

    def done() -> int:
        return int(r.hget(k.stats, "done") or 0)

    wait_for(lambda: done() >= 500, WAIT, "500 pages done", ws)
    doc = status_json(cluster.url, crawl_id, "--sample", "0")  # read while it crawls
    assert doc["done"] >= 500 and doc["workers_alive"] == 3, doc
    assert doc["budget"]["lanes_total"] in (0, 1), doc
    t0 = time.monotonic()
    done_before = done()
    moved = cluster.migrate_slot(slot, dest, batch=5, pause=0.02)
    t_migrated = time.monotonic()
    done_after = done()
    assert cluster.owner(slot) is dest
    wait_for(lambda: done() >= 1300, WAIT, "1,300 pages done", ws)
    replica = cluster.replicas_of(dest.port)[0]
    assert replica.client().script_exists(script_sha("claim")) == [False]
    # Held again over the failover, so that what is left is claimed from the promoted
    # replica however fast the workers would have crawled meanwhile.
    site.hold()
    try:
        wait_for(lambda: done() + int(r.zcard(k.leases)) < pages, WAIT,
                 "work left for after the failover", ws)
        cluster.kill(dest)
        t_kill = time.monotonic()
        cluster.wait_failover(dest)
        t_promoted = time.monotonic()
    finally:
        site.release()
    for w in ws:
        assert_finished(w)

    r.close()
    r = cluster.client()
    assert cluster.owner(slot) is replica
    assert replica.client().script_exists(script_sha("claim")) == [True]  # after NOSCRIPT
    st = read_crawl(r, crawl_id)
    counts = assert_every_page_fetched(site, pages)
    logs = "\n".join(w.log_text() for w in ws)
    refused = logs.count("Redis Cluster refuses commands while a slot migrates")
    print(f"\nslot {slot}: {moved} keys migrated in {t_migrated - t0:.1f} s (done "
          f"{done_before} -> {done_after} meanwhile); workers that waited out the "
          f"migration: {refused}; replica promoted {t_promoted - t_kill:.1f} s after the "
          f"kill; pages fetched twice: {sum(1 for n in counts.values() if n > 1)}; "
          f"stats {st['stats']}")
    assert_complete(st, pages)
    assert st["dead"] == 0 and st["records"] == pages, st
    assert moved > 100  # the crawl's slot held its seen buckets, queues, leases, ...
    assert refused >= 1, "no worker met a refused command during the migration"
    assert list(crawl_key_slots(cluster, crawl_id)) == [slot]
    r.close()


def test_fleet_commands_on_a_cluster(cluster, make_site, start_worker, crawl_id, tmp_path):
    """status, dead (list, requeue, purge), seed and reset against a cluster URL."""
    url = cluster.url
    site = make_site(pages=60)
    poison = "/p/57"
    w = start_worker(url, crawl_id, site.url + "/p/0", name="w1",
                     settings={**HA, "LEASED_MAX_ATTEMPTS": 1}, args={"raise_path": poison})
    assert_finished(w, clean=False)  # the poison page's callback raises
    doc = status_json(url, crawl_id, "--sample", "0")
    assert (doc["done"], doc["todo"], doc["processing"], doc["dead"]) == (59, 0, 0, 1), doc
    assert doc["redis_used_memory"] > 0  # INFO of the master serving the crawl's slot
    assert "todo" in ok(leased("status", crawl_id, "--sample", "0", "--redis-url", url))
    dead = dead_json(url, crawl_id)
    assert dead["dead"] == 1 and dead["letters"][0]["url"] == site.url + poison, dead
    ok(leased("dead", crawl_id, "--requeue", "--redis-url", url))
    assert status_json(url, crawl_id, "--sample", "0")["todo"] == 1
    out = ok(leased("seed", crawl_id, site.page_url(3), site.url + "/p/5?again=1",
                    "--redis-url", url))
    assert "2 URLs, 1 queued, 1 already seen" in out, out
    w2 = start_worker(url, crawl_id, site.url + "/p/0", name="w2",
                      settings={**HA, "LEASED_MAX_ATTEMPTS": 1}, args={"raise_path": poison})
    assert_finished(w2, clean=False)
    assert dead_json(url, crawl_id)["dead"] == 1
    ok(leased("dead", crawl_id, "--purge", "--redis-url", url))
    assert dead_json(url, crawl_id)["dead"] == 0
    n_keys = sum(len(v) for v in crawl_key_slots(cluster, crawl_id).values())
    assert n_keys > 10
    # (--records: UpsertPipeline's records too, which reset keeps without it)
    out = ok(leased("reset", crawl_id, "--yes", "--records", "--redis-url", url))
    assert f"deleted {n_keys:,} keys" in out, out
    assert crawl_key_slots(cluster, crawl_id) == {}
    one_error(leased("status", crawl_id, "--redis-url", url), "unknown crawl")


def test_crawl_keys_found_on_both_masters_of_a_migrating_slot(cluster, crawl_id):
    """Half-way through a migration, a crawl's keys sit on two masters: crawl_keys (what
    reset deletes) and list_crawls scan every master and find all of them."""
    k = CrawlKeys(crawl_id)
    slot = cluster.keyslot(k.meta)
    source = cluster.owner(slot)
    dest = next(m for m in cluster.masters() if m is not source)

    async def fill() -> None:
        await (await queued_frontier(cluster.url, k, 40)).client.aclose()

    asyncio.run(fill())
    expected = set().union(*crawl_key_slots(cluster, crawl_id).values())
    assert len(expected) > 40
    move = SlotMove(slot, source, dest)
    move.begin(*move.src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 20))
    assert move.dst.dbsize() >= 20 and move.src.dbsize() >= 20

    async def scan() -> tuple[list[str], list[str]]:
        client = make_client(cluster.url)
        try:
            admin = FleetAdmin(client, k)
            return await admin.crawl_keys(), await FleetAdmin.list_crawls(client)
        finally:
            await client.aclose()

    found, crawls = asyncio.run(scan())
    assert set(found) == expected
    assert crawls == [crawl_id]


# --------------------------------------------------------------------------- WAIT


def _commandstat(r: redis.Redis, name: str) -> int:
    return int(r.info("commandstats").get(f"cmdstat_{name}", {}).get("calls", 0))


def test_wait_replicas_puts_writes_on_replicas_before_the_reply(sentinel_group, crawl_id):
    """With wait_replicas=2 every claim and commit comes back only once both replicas
    have it: read from each replica right after the call, the requests just queued and
    the claim just made are there. Other scripts (renew, read) are not followed by WAIT."""
    g = sentinel_group
    k = CrawlKeys(crawl_id)
    replicas = [srv for srv in g.servers if srv is not g.master()]
    master = g.client()
    waits0 = _commandstat(master, "wait")

    async def main() -> None:
        client = await connect(g.url + "&wait_replicas=2")
        f = Frontier(client, k, lease_ms=30_000, max_attempts=4)
        try:
            for i in range(20):
                queued = await f.enqueue([NewRequest(json.dumps({"u": f"http://h/{i}"}),
                                                     0, 1, i)])
                assert queued == [True]
                for rep in replicas:
                    assert rep.client().sismember(k.seen_bucket(1), i), (i, rep)
                claim = await f.claim(1, "w1")
                token = claim.claims[0][0]
                for rep in replicas:
                    assert rep.client().zscore(k.leases, token) is not None, (i, rep)
            await f.renew("w1", [])
            await f.counts()
        finally:
            await client.aclose()

    asyncio.run(main())
    assert _commandstat(master, "wait") - waits0 == 40  # 20 commits + 20 claims


def test_wait_replicas_without_replicas_stalls_once_per_pause(redis_server, crawl_id, caplog):
    """wait_replicas=1 on a Redis with no replica: the first write waits WAIT_TIMEOUT_MS,
    is used anyway, one warning says so, and the next writes go without WAIT."""
    r = redis_server.client()
    waits0 = _commandstat(r, "wait")

    async def main() -> list[bool]:
        client = await connect(redis_server.url + "?wait_replicas=1")
        f = Frontier(client, CrawlKeys(crawl_id), lease_ms=30_000, max_attempts=4)
        try:
            t = time.monotonic()
            out = await f.enqueue([NewRequest(json.dumps({"u": "http://h/0"}), 0, 1, 0)])
            assert time.monotonic() - t >= WAIT_TIMEOUT_MS / 1000 * 0.9
            for i in range(1, 21):
                out += await f.enqueue([NewRequest(json.dumps({"u": f"http://h/{i}"}),
                                                   0, 1, i)])
            return out
        finally:
            await client.aclose()

    with caplog.at_level("WARNING", logger="scrapy_leased.frontier.scripts"):
        assert asyncio.run(main()) == [True] * 21
    assert _commandstat(r, "wait") - waits0 == 1
    warnings = [rec.getMessage() for rec in caplog.records]
    assert len(warnings) == 1 and "Only 0 of 1 replicas" in warnings[0], warnings


def test_ask_and_tryagain_while_the_crawls_slot_migrates(cluster, crawl_id):
    """Half-way through a migration of the crawl's slot: commands on keys already moved
    are answered by the importing master at once (ASK, with ASKING on the command's own
    connection, however many connections the client holds there); a commit whose keys
    are split between the two masters is refused (TRYAGAIN), sent again until the
    migration ends, and runs exactly once."""
    k = CrawlKeys(crawl_id)
    slot = cluster.keyslot(k.meta)
    source = cluster.owner(slot)
    dest = next(m for m in cluster.masters() if m is not source)
    move = SlotMove(slot, source, dest)
    other = next(f"x{i}" for i in range(10_000) if cluster.owner(cluster.keyslot(f"x{i}")) is dest)

    async def main() -> None:
        f = await queued_frontier(cluster.url, k)
        client = f.client
        try:
            # several pooled connections to the importing master
            await asyncio.gather(*[client.set(other, i) for i in range(20)])
            move.begin(k.meta, k.seen_bucket(1))
            # ASK: answered by the importing master, nothing refused
            got = await asyncio.gather(*[client.hget(k.meta, "seen_bucket_bits")
                                         for _ in range(30)])
            assert got == [b"14"] * 30
            assert await client.sismember(k.seen_bucket(1), 1) == 1
            assert client.migration_retries == 0

            def finish_migration() -> None:  # once a refused commit was seen
                wait_for(lambda: client.migration_retries > 0, 30, "a refused command")
                move.finish([dest, source] + [m for m in cluster.masters()
                                              if m not in (source, dest)])

            done = asyncio.ensure_future(asyncio.to_thread(finish_migration))
            queued = await f.enqueue([NewRequest(json.dumps({"u": "http://h/new"}), 0, 9, 99)])
            await done
            assert queued == [True] and client.migration_retries > 0
            counts = await f.counts()
            assert (counts["todo"], counts["total_enqueued"]) == (6, 6), counts  # ran once
        finally:
            await client.aclose()

    asyncio.run(main())
    assert cluster.owner(slot) is dest
