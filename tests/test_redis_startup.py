"""Starting against a Redis that is not there yet, or not fit for a crawl, with real
``redis-server`` processes and real workers.

- A worker started while Redis is unreachable (restarting, failing over) waits for it,
  up to ``LEASED_CONNECT_TIMEOUT``, and joins the crawl once it answers.
- A Redis whose ``maxmemory-policy`` evicts keys would silently delete queued requests,
  leases or seen URLs when full: the worker refuses it at start, naming the policy and
  the fix (the policy is read from ``INFO memory``: CONFIG may be disabled on managed
  Redis).
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from scrapy_leased._redis.connection import LeasedRedisError, connect
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.integration  # starts redis-server itself


def test_a_worker_started_while_redis_is_unreachable_for_3_s_joins_once_it_is_back(
        make_site, start_worker, crawl_id):
    pages = 100
    site = make_site(pages=pages)
    with RedisServer() as srv:
        srv.stop()  # the port and the data dir stay: the same server comes back
        w = start_worker(srv.url, crawl_id, site.url + "/p/0")
        w.wait_log("does not answer yet", timeout=60)
        waiting_since = time.monotonic()
        time.sleep(3)  # Redis stays away for 3 s while the worker waits
        assert w.running and not site.entries()
        srv.start()
        back_at = time.monotonic()
        assert w.wait(60) == 0, w.log_tail()
        r = srv.client(decode_responses=True)
        done = int(r.hget(f"leased:{{{crawl_id}}}:stats", "done") or 0)
    print(f"\nthe worker waited {back_at - waiting_since:.1f} s for Redis (after its first "
          f"attempt), then crawled {len(site.entries())} pages")
    assert w.close_reason() == "finished"
    assert done == pages
    assert set(site.count_by_path(include_query=False)) == site.all_page_paths()
    assert " ERROR: " not in w.log_text(), w.log_tail()


def test_connect_waits_for_redis_then_names_the_setting(crawl_id):
    with RedisServer() as srv:
        srv.stop()

        async def joins() -> float:
            t0 = time.monotonic()
            threading.Timer(1.0, srv.start).start()
            client = await connect(srv.url, "LEASED_REDIS_URL", timeout=30)
            await client.aclose()
            return time.monotonic() - t0

        assert 1.0 <= asyncio.run(joins()) < 10
        srv.stop()

        async def gives_up() -> None:
            await connect(srv.url, "LEASED_UPSERT_URL", timeout=0.5)

        t0 = time.monotonic()
        with pytest.raises(LeasedRedisError, match=r"LEASED_UPSERT_URL.*within 0.5 s "
                                                    r"\(LEASED_CONNECT_TIMEOUT\)"):
            asyncio.run(gives_up())
        assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-ttl"])
def test_an_evicting_maxmemory_policy_is_refused_at_start_naming_it(
        make_site, start_worker, crawl_id, policy):
    site = make_site(pages=5)
    with RedisServer(extra_config={"maxmemory-policy": policy}) as srv:
        w = start_worker(srv.url, crawl_id, site.url + "/p/0")
        rc = w.wait(60)
        text = w.log_text()
        keys = srv.client().keys(f"leased:{{{crawl_id}}}:*")

        async def direct() -> None:
            await connect(srv.url)

        with pytest.raises(LeasedRedisError, match=f"maxmemory-policy {policy}"):
            asyncio.run(direct())
    # one error line (CRITICAL: scrapy crawl then exits 1, _command.py), no traceback
    assert rc != 0
    assert len([ln for ln in text.splitlines() if " ERROR: " in ln or " CRITICAL: " in ln]) \
        == 1, text
    assert "Traceback" not in text, text
    named = [ln for ln in text.splitlines() if f"maxmemory-policy {policy}" in ln
             and "noeviction" in ln and "LEASED_REDIS_URL" in ln]
    assert named, text
    print(f"\n{named[0][:400]}")
    assert not site.entries() and keys == []
