"""Environments users run in (issue #24, item 7), for real: a Redis Cluster resharded
onto a master new to the cluster (ASK to a node no client knows yet), TLS to a Sentinel
group and a Cluster, a connection pool used past its size, read-only commands through
a proxy that drops a connection right after Redis answered, and the start-up check of
the add-on on a running event loop.

Real redis-server processes (tests/support/redis_server.py, redis_ha.py, tls.py), real
``scrapy crawl`` workers and ``scrapy leased`` commands; no mocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

import pytest
from scrapy.settings import Settings

from scrapy_leased._redis.connection import LeasedRedisError, check_reachable, make_client
from scrapy_leased._redis.scan import keys_with_prefix
from scrapy_leased._redis.url import parse_redis_url
from scrapy_leased.fleet.admin import FleetAdmin
from scrapy_leased.frontier import NewRequest
from scrapy_leased.frontier.keys import CrawlKeys
from scrapy_leased.observe.reader import FleetReader
from scrapy_leased.settings import Budgets, LeasedConfigError, check_redis_url
from tests.support.dropproxy import DropProxyProcess
from tests.support.redis_ha import (
    ClusterNodeServer,
    RedisCluster,
    SentinelGroup,
    SlotMove,
    wait_until,
)
from tests.support.redis_server import free_port
from tests.support.tls import TLSCluster, TLSFiles, TLSSentinelGroup
from tests.support.workers import wait_for
from tests.test_commands import dead_json, leased, ok, status_json
from tests.test_ha import (
    _cli_or_skip,
    assert_complete,
    assert_every_page_fetched,
    assert_finished,
    queued_frontier,
    read_crawl,
)

WAIT = 180  # hang guard for a whole crawl, not a check
FAST = {"LEASED_LEASE_SECONDS": 6, "LEASED_RENEW_INTERVAL": 1, "LEASED_SWEEP_INTERVAL": 0.5}


# --------------------------------------------------------------------------- Cluster ASK


@pytest.fixture
def small_cluster():
    """3 masters, no replicas: what resharding needs, and no more."""
    _cli_or_skip()
    with RedisCluster(masters=3, replicas=0) as c:
        yield c


def add_empty_master(cluster: RedisCluster) -> ClusterNodeServer:
    """A new master joined with CLUSTER MEET, owning no slot (so not in CLUSTER SLOTS,
    nor in any client's node cache), once every node sees it connected."""
    node = ClusterNodeServer(cluster.node_timeout_ms).start()
    cluster.nodes.append(node)
    ids = [n.node_id() for n in cluster.live()]
    first = cluster.nodes[0].client()
    try:
        first.execute_command("CLUSTER", "MEET", "127.0.0.1", node.port, node.bus_port)
    finally:
        first.close()

    def known_everywhere() -> bool:  # every node knows every other, handshakes done
        for n in cluster.live():
            c = n.client(decode_responses=True, socket_timeout=2)
            try:
                nodes = c.execute_command("CLUSTER", "NODES")
            finally:
                c.close()
            rows = {v["node_id"]: v for v in nodes.values()} if isinstance(nodes, dict) \
                else {x.split()[0]: {"flags": x.split()[2], "connected": "connected" in x}
                      for x in nodes.splitlines()}
            for i in ids:
                row = rows.get(i)
                if row is None or "handshake" in row["flags"] or "noaddr" in row["flags"] \
                        or not (row["connected"] or "myself" in row["flags"]):
                    return False
        return True

    wait_until(known_everywhere, 30, f"every node knowing {node.address}")
    cluster.wait_ok(30)  # the new node too knows who serves every slot
    return node


def test_ask_to_a_master_new_to_the_cluster(small_cluster, crawl_id):
    """Half-way through a migration of the crawl's slot onto a master just added (no
    slot of its own, so in no client's node cache): commands on the keys already moved
    are answered by it through ASK (redis-py looked the ASK target up in its cache and
    sent ASKING to None: AttributeError), and once the migration ends the crawl's state
    is all there, each request once."""
    cluster = small_cluster
    k = CrawlKeys(crawl_id)
    slot = cluster.keyslot(k.meta)
    source = cluster.owner(slot)

    async def main() -> None:
        f = await queued_frontier(cluster.url, k)
        client = f.client
        try:
            new = await asyncio.to_thread(add_empty_master, cluster)
            assert client.nodes_manager.get_node("127.0.0.1", new.port) is None
            move = SlotMove(slot, source, new)
            move.begin(k.meta, k.seen_bucket(1))
            got = await asyncio.gather(*[client.hget(k.meta, "seen_bucket_bits")
                                         for _ in range(10)])
            assert got == [b"14"] * 10
            assert await client.sismember(k.seen_bucket(1), 1) == 1
            assert client.nodes_manager.get_node("127.0.0.1", new.port) is not None
            move.finish(cluster.live())
            queued = await f.enqueue([NewRequest(json.dumps({"u": "http://h/new"}), 0, 9, 99)])
            assert queued == [True]
            counts = await f.counts()
            assert (counts["todo"], counts["total_enqueued"]) == (6, 6), counts
        finally:
            await client.aclose()

    asyncio.run(main())
    wait_until(lambda: cluster.owner(slot).port == cluster.nodes[-1].port, 30,
               "the new master owning the slot")


def test_crawl_resharded_onto_a_new_master_loses_nothing(small_cluster, make_site,
                                                         start_worker, crawl_id):
    """2 workers, 600 pages: at 150 done a master joins the cluster and the crawl's slot
    is migrated onto it, 5 keys at a time (the workers meet ASK to a node they never
    heard of, and TRYAGAIN). Both workers 'finished', every page fetched, done == 600,
    nothing queued or leased, no dead letter."""
    cluster = small_cluster
    pages = 600
    site = make_site(pages=pages, delay=0.2)
    k = CrawlKeys(crawl_id)
    slot = cluster.keyslot(k.meta)
    ws = start_worker.fleet(2, cluster.url, crawl_id, site.url + "/p/0", FAST)
    r = cluster.client()

    def done() -> int:
        return int(r.hget(k.stats, "done") or 0)

    wait_for(lambda: done() >= 150, WAIT, "150 pages done", ws)
    t0 = time.monotonic()
    new = add_empty_master(cluster)
    t1 = time.monotonic()
    moved = cluster.migrate_slot(slot, new, batch=5, pause=0.02)
    t2 = time.monotonic()
    done_after = done()
    for w in ws:
        assert_finished(w)
    print(f"\nnew master joined in {t1 - t0:.1f} s; {moved} keys migrated in {t2 - t1:.1f} s "
          f"(done {done_after} after); crawl over {time.monotonic() - t2:.1f} s later")
    r.close()
    r = cluster.client()
    assert cluster.owner(slot) is new
    st = read_crawl(r, crawl_id)
    r.close()
    assert_every_page_fetched(site, pages)
    assert_complete(st, pages)
    assert st["dead"] == 0, st
    assert moved > 50 and done_after < pages, (moved, done_after)
    logs = "\n".join(w.log_text() for w in ws)
    asked = logs.count(f"ASK to 127.0.0.1:{new.port}, a node not in the slots map")
    epochs = logs.count("went back in time")
    print(f"workers that met ASK to the new master: {asked}; epoch warnings: {epochs}")
    assert asked >= 1, "no worker met an ASK to the new master"


# --------------------------------------------------------------------------- reads retried


@pytest.fixture
def seeded(redis_server, crawl_id):
    """A crawl with 3 URLs queued on a real Redis (``scrapy leased seed``)."""
    ok(leased("seed", crawl_id, "http://127.0.0.1:9/p/1", "http://127.0.0.1:9/p/2",
              "http://h2.invalid/p/3", "--redis-url", redis_server.url))
    return redis_server


@pytest.mark.parametrize("command", ["EVALSHA", "INFO", "HMGET"])
def test_status_json_through_a_connection_dropped_after_the_reply(seeded, crawl_id, command):
    """``scrapy leased status --json`` through a proxy that closes the connection instead
    of forwarding the first reply to ``command`` (the read script, INFO memory, the lane
    reads' pipeline): Redis answered, the client never heard it; the read is sent again
    on a new connection and the JSON is the crawl's."""
    with DropProxyProcess(seeded.port, [command], drops=1) as proxy:
        doc = status_json(proxy.url, crawl_id, "--sample", "0")
        assert proxy.status()["dropped"] == 1, proxy.status()
    assert (doc["todo"], doc["done"], doc["dead"]) == (3, 0, 0), doc


def test_dead_and_the_observers_reader_through_dropped_connections(seeded, crawl_id):
    """``scrapy leased dead --json`` and the reader behind ``metrics`` and the dashboard
    (observe/reader.py) through dropped replies of HSCAN, EVALSHA and SCAN."""
    with DropProxyProcess(seeded.port, ["HSCAN", "HLEN"], drops=2) as proxy:
        assert dead_json(proxy.url, crawl_id)["dead"] == 0
        assert proxy.status()["dropped"] >= 1, proxy.status()

    async def observe(url: str) -> tuple[list[str], int, list[Any]]:
        client = make_client(url)
        try:
            reader = FleetReader(client, url, Budgets.from_settings(Settings()),
                                 worker_ttl_ms=10_000,
                                 lease_ms=30_000, max_attempts=4, default_capacity=8)
            crawls = await reader.crawls()
            reading = await reader.read(crawl_id)
            return crawls, reading.doc["todo"], await reader.dead_letters(crawl_id)
        finally:
            await client.aclose()

    with DropProxyProcess(seeded.port, ["SCAN", "EVALSHA", "HSCAN"], drops=3) as proxy:
        crawls, todo, letters = asyncio.run(observe(proxy.url))
        assert proxy.status()["dropped"] == 3, proxy.status()
    assert crawl_id in crawls and (todo, letters) == (3, []), (crawls, todo, letters)


@pytest.fixture
def one_node_cluster():
    """A Redis Cluster of one master holding every slot (CLUSTER ADDSLOTSRANGE): what a
    managed cluster's single configuration endpoint looks like to a client."""
    node = ClusterNodeServer(1000).start()
    c = node.client(decode_responses=True)
    try:
        c.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
        def ready() -> bool:
            info = c.execute_command("CLUSTER INFO")
            return (info.get("cluster_state") == "ok" if isinstance(info, dict)
                    else "cluster_state:ok" in str(info))

        wait_until(ready, 30, "cluster_state ok")
        yield node, c
    finally:
        c.close()
        node.close()


@contextlib.contextmanager
def announced_through(node: ClusterNodeServer, c: Any, proxy: DropProxyProcess) -> Any:
    """The node announces the proxy's port (CLUSTER SLOTS names it), so that every
    connection of a cluster client, the first one and those it learns, goes through
    the proxy."""
    c.config_set("cluster-announce-port", proxy.port)
    try:
        yield f"redis+cluster://127.0.0.1:{proxy.port}"
    finally:
        c.config_set("cluster-announce-port", 0)


@pytest.mark.parametrize("command", ["HELLO", "CLUSTER", "INFO"])
def test_status_json_on_a_cluster_through_a_dropped_connection(one_node_cluster, crawl_id,
                                                               command):
    """``scrapy leased status --json`` on a redis+cluster:// URL of one startup node,
    the connection dropped right after Redis answered the handshake (HELLO), the layout
    (CLUSTER SLOTS) or the crawl master's INFO memory. redis-py's cluster client sends a
    command aimed at one node (INFO, SCAN) once, and gives up at once when its one
    startup node's connection drops while it learns the layout: on b7e0046 the command
    printed ``Error: Redis: ConnectionError: Connection closed by server.`` (or cannot
    reach Redis), no JSON. The read is sent again (LeasedRedisCluster, LOST_RETRIES)."""
    node, c = one_node_cluster
    ok(leased("seed", crawl_id, "http://127.0.0.1:9/p/1", "http://h2.invalid/p/2",
              "--redis-url", f"redis+cluster://127.0.0.1:{node.port}"))
    with DropProxyProcess(node.port, [command], drops=1) as proxy, \
            announced_through(node, c, proxy) as url:
        doc = status_json(url, crawl_id, "--sample", "0")
        assert proxy.status()["dropped"] == 1, proxy.status()
    assert (doc["todo"], doc["done"], doc["dead"]) == (2, 0, 0), doc
    assert doc["redis"].startswith("redis+cluster://"), doc


def test_crawl_list_and_key_scan_on_a_cluster_through_dropped_connections(
        one_node_cluster, crawl_id):
    """The SCAN of every master (FleetAdmin.list_crawls, behind ``metrics`` and the
    dashboard's crawl list, and keys_with_prefix, behind ``reset`` and a fresh run) on a
    cluster, two of its replies dropped: redis-py sends a SCAN aimed at a node once, so
    on b7e0046 the first drop failed the listing."""
    node, c = one_node_cluster
    ok(leased("seed", crawl_id, "http://127.0.0.1:9/p/1",
              "--redis-url", f"redis+cluster://127.0.0.1:{node.port}"))

    async def listing(url: str) -> tuple[list[str], list[str]]:
        client = make_client(url)
        try:
            crawls = await FleetAdmin.list_crawls(client)
            keys = await keys_with_prefix(client, CrawlKeys(crawl_id).prefix)
            return crawls, keys
        finally:
            await client.aclose()

    with DropProxyProcess(node.port, ["SCAN"], drops=2) as proxy, \
            announced_through(node, c, proxy) as url:
        crawls, keys = asyncio.run(listing(url))
        assert proxy.status()["dropped"] == 2, proxy.status()
    assert crawl_id in crawls, crawls
    assert CrawlKeys(crawl_id).meta in keys, keys


# --------------------------------------------------------------------------- start-up check


def test_start_up_check_never_blocks_a_running_event_loop(redis_server):
    """check_reachable (the add-on's update_settings) called on a running event loop, as
    an AsyncCrawlerRunner of a running application does: with nothing listening it
    returns at once (the scheduler's ``connect`` waits, without blocking), where it
    slept up to LEASED_CONNECT_TIMEOUT on the loop. A bad URL is still refused at once,
    and without a loop the check still waits and names the setting."""
    nowhere = f"redis://127.0.0.1:{free_port()}/0"

    async def on_loop() -> float:
        t = time.monotonic()
        check_reachable(nowhere, timeout=5)
        elapsed = time.monotonic() - t
        with pytest.raises(LeasedRedisError, match="LEASED_REDIS_URL"):
            check_reachable("redis+cluster://127.0.0.1:1/3", timeout=5)
        check_reachable(redis_server.url, timeout=5)
        return elapsed

    assert asyncio.run(on_loop()) < 1.0
    t = time.monotonic()
    with pytest.raises(LeasedRedisError, match="cannot reach Redis.*LEASED_REDIS_URL"):
        check_reachable(nowhere, timeout=1)
    assert time.monotonic() - t >= 0.5  # it waited (it gives up when the next try is late)


# --------------------------------------------------------------------------- pool size

POOL = 5
CONCURRENT = 40
HOLD_S = 0.1  # each command holds its connection this long (BLPOP on an empty list)


async def _many_at_once(client: Any) -> float:
    """CONCURRENT commands at once, each holding its connection HOLD_S; the time taken."""
    t = time.monotonic()
    got = await asyncio.gather(*[client.blpop([f"{{pool}}:empty:{i}"], timeout=HOLD_S)
                                 for i in range(CONCURRENT)])
    assert got == [None] * CONCURRENT
    return time.monotonic() - t


@pytest.fixture
def one_sentinel():
    with SentinelGroup(replicas=0, sentinels=1) as group:
        yield group


@pytest.mark.integration
@pytest.mark.parametrize("kind", ["server", "sentinel", "cluster"])
def test_commands_past_the_pool_size_wait_for_a_connection(kind, request):
    """40 commands at once on a client of 5 connections (max_connections=5, as an
    option and in the URL): none fails (redis-py's asyncio pools raised "Too many
    connections", and its cluster nodes MaxConnectionsError), they take turns: at least
    40 / 5 x 0.1 s."""
    if kind == "server":
        url = request.getfixturevalue("redis_server").url
    elif kind == "sentinel":
        url = request.getfixturevalue("one_sentinel").url
    else:
        url = request.getfixturevalue("small_cluster").url

    async def main(url: str, **options: Any) -> float:
        client = make_client(url, **options)
        try:
            return await _many_at_once(client)
        finally:
            await client.aclose()

    floor = CONCURRENT / POOL * HOLD_S * 0.9
    assert asyncio.run(main(url, max_connections=POOL)) >= floor
    sep = "&" if "?" in url else "?"
    assert asyncio.run(main(f"{url}{sep}max_connections={POOL}")) >= floor


# --------------------------------------------------------------------------- TLS


@pytest.fixture
def tls_files(tmp_path):
    return TLSFiles.make(tmp_path / "tls")


@pytest.fixture
def tls_sentinel_group(tls_files):
    with TLSSentinelGroup(tls_files, replicas=1, sentinels=3) as group:
        yield group


@pytest.fixture
def tls_cluster(tls_files):
    _cli_or_skip()
    with TLSCluster(tls_files, masters=3, replicas=0) as c:
        yield c


def _two_worker_crawl(url: str, r: Any, make_site, start_worker, crawl_id: str) -> None:
    pages = 200
    site = make_site(pages=pages)
    ws = start_worker.fleet(2, url, crawl_id, site.url + "/p/0", FAST)
    for w in ws:
        assert_finished(w)
    assert_every_page_fetched(site, pages)
    st = read_crawl(r, crawl_id)
    assert_complete(st, pages)
    assert st["dead"] == 0, st


def test_tls_sentinel_group_crawl(tls_sentinel_group, make_site, start_worker, crawl_id):
    """A Sentinel group that speaks TLS (sentinels and servers, client certificates
    required): a rediss+sentinel:// URL with the CA and the client certificate runs a
    2-worker crawl to 'finished', done == 200, nothing lost. The sentinels name the
    master's TLS port, and a client without the certificate options is refused."""
    g = tls_sentinel_group
    assert g.sentinels[0].master_address() == ("127.0.0.1", g.servers[0].tls_port)
    r = g.client()
    _two_worker_crawl(g.url, r, make_site, start_worker, crawl_id)
    bare = g.url.split("?")[0]
    with pytest.raises(LeasedRedisError, match="cannot reach Redis"):
        check_reachable(bare, timeout=0.5)


def test_tls_cluster_crawl(tls_cluster, make_site, start_worker, crawl_id):
    """A Redis Cluster with a TLS bus and TLS clients: a rediss+cluster:// URL runs a
    2-worker crawl to 'finished', done == 200, nothing lost; the slots map a TLS client
    gets names the TLS ports only."""
    c = tls_cluster

    async def slots() -> set[int]:
        client = make_client(c.url)
        try:
            await client.initialize()
            return {n.port for n in client.get_nodes()}
        finally:
            await client.aclose()

    assert asyncio.run(slots()) == {n.tls_port for n in c.nodes}
    r = c.client()
    try:
        _two_worker_crawl(c.url, r, make_site, start_worker, crawl_id)
    finally:
        r.close()


def test_tls_urls_parse_and_refuse_clearly():
    """rediss+sentinel:// and rediss+cluster:// carry redis-py's TLS options; a TLS option
    on a plain scheme, or a bad value, is refused naming the option."""
    t = parse_redis_url("rediss+sentinel://:pw@s1,s2:26380/m/2?ssl_ca_certs=/etc/ca.crt"
                        "&ssl_certfile=/c/cl.crt&ssl_keyfile=/c/cl.key&ssl_cert_reqs=Required"
                        "&max_connections=7&wait_replicas=1")
    assert (t.kind, t.tls, t.hosts, t.master_name, t.db, t.password, t.wait_replicas) == \
        ("sentinel", True, (("s1", 26379), ("s2", 26380)), "m", 2, "pw", 1)
    assert t.options == {"ssl_ca_certs": "/etc/ca.crt", "ssl_certfile": "/c/cl.crt",
                         "ssl_keyfile": "/c/cl.key", "ssl_cert_reqs": "required",
                         "max_connections": 7}
    t = parse_redis_url("rediss+cluster://n1:7000?ssl_check_hostname=false")
    assert (t.kind, t.tls, t.hosts, t.options) == \
        ("cluster", True, (("n1", 7000),), {"ssl_check_hostname": False})
    assert not parse_redis_url("redis+cluster://n1").tls
    for url, words in [
        ("redis+cluster://n1?ssl_ca_certs=/ca", ["ssl_ca_certs", "rediss+cluster://"]),
        ("redis+sentinel://s1/m?ssl_certfile=/c", ["ssl_certfile", "rediss+sentinel://"]),
        ("rediss+cluster://n1?ssl_cert_reqs=maybe", ["invalid value", "ssl_cert_reqs"]),
        ("rediss+cluster://n1/3", ["database other than 0"]),
    ]:
        with pytest.raises(LeasedConfigError) as exc:
            check_redis_url(url)
        for word in ["LEASED_REDIS_URL", *words]:
            assert word in str(exc.value), (word, str(exc.value))


def test_a_connection_torn_down_inside_redis_py_is_a_lost_connection():
    """Seen in a Cluster failover mid-crawl: redis-py's asyncio connection, its writer
    gone, raised ``AttributeError: 'NoneType' object has no attribute 'writelines'``
    from a command; the loops took it for a bug and stopped the worker (leased_error).
    It is a lost connection (retried); an AttributeError from anywhere else, redis-py's
    cluster code included (8.2 raised one for the ASK target it did not know), stays
    one. redis-py 8.2 raises ConnectionError itself for a connection without a writer."""
    import asyncio as _asyncio

    import redis.asyncio.cluster
    import redis.asyncio.connection
    from redis.asyncio.connection import Connection
    from redis.exceptions import ConnectionError as RedisConnectionError

    from scrapy_leased._redis.cluster import _lost_connection

    async def send_unconnected() -> Exception:
        conn = Connection(host="127.0.0.1", port=1)  # never connected: no writer
        try:
            await conn._send_packed_command([b"PING\r\n"])
        except (AttributeError, RedisConnectionError) as exc:
            return exc
        raise AssertionError("redis-py sent on a connection without a writer")

    inside = _asyncio.run(send_unconnected())
    if isinstance(inside, AttributeError):  # redis-py 8.1
        inside = _lost_connection(inside)
    assert isinstance(inside, RedisConnectionError)

    def raised_in(filename: str) -> AttributeError:
        try:
            exec(compile("None.writelines", filename, "exec"))
        except AttributeError as exc:
            return exc
        raise AssertionError("None has no writelines")

    assert isinstance(_lost_connection(raised_in(redis.asyncio.connection.__file__)),
                      RedisConnectionError)
    for elsewhere in [redis.asyncio.cluster.__file__, __file__]:
        exc = raised_in(elsewhere)
        assert _lost_connection(exc) is exc, elsewhere
