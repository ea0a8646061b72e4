"""The fleet line in each worker's log (``scrapy_leased.observe.logstats.LeasedLogStats``),
from real ``scrapy crawl`` workers against a real redis-server."""

from __future__ import annotations

import re

import pytest

from scrapy_leased.frontier.keys import CrawlKeys

FLEET = re.compile(r"\[scrapy_leased\.observe\.logstats\] INFO: Fleet (?P<crawl>\S+): (?P<rate>[\d,]+) "
                   r"pages/min, todo (?P<todo>[\d,]+), in flight (?P<inflight>[\d,]+), done "
                   r"(?P<done>[\d,]+), dead (?P<dead>[\d,]+), workers (?P<workers>\d+)$", re.M)


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def test_each_worker_logs_the_fleet_line(redis_server, make_site_process, start_worker,
                                         crawl_id):
    pages = 1500
    site = make_site_process(pages=pages)
    ws = [start_worker(redis_server.url, crawl_id, site.url + "/p/0", name=f"w{i}",
                       settings={"LEASED_LOGSTATS_INTERVAL": 0.5, "CONCURRENT_REQUESTS": 4})
          for i in range(2)]
    for w in ws:
        assert w.wait(120) == 0, w.log_tail(60)
        assert w.close_reason() == "finished"
        text = w.log_text()
        assert "scrapy_leased.observe.logstats.LeasedLogStats" in text  # enabled by the add-on
        lines = [m.groupdict() for m in FLEET.finditer(text)]
        assert len(lines) >= 2, text[-3000:]
        assert {line["crawl"] for line in lines} == {crawl_id}
        dones = [_int(line["done"]) for line in lines]
        assert dones == sorted(dones) and 0 <= dones[-1] <= pages  # fleet-wide, growing
        assert all(_int(line["dead"]) == 0 for line in lines)
        assert all(1 <= int(line["workers"]) <= 2 for line in lines)
        assert any(_int(line["rate"]) > 0 for line in lines)
        assert "Traceback" not in text
    r = redis_server.client()
    assert int(r.hget(CrawlKeys(crawl_id).stats, "done")) == pages


def test_interval_zero_turns_it_off(redis_server, make_site, start_worker, crawl_id):
    site = make_site(pages=5)
    w = start_worker(redis_server.url, crawl_id, site.url + "/p/0",
                     settings={"LEASED_LOGSTATS_INTERVAL": 0})
    assert w.wait(60) == 0
    assert "LeasedLogStats" not in w.log_text() and not FLEET.search(w.log_text())


@pytest.mark.parametrize("value", ["-1", "abc", "nan"])
def test_bad_interval_stops_the_worker_naming_it(redis_server, make_site, start_worker,
                                                 crawl_id, value):
    site = make_site(pages=5)
    w = start_worker(redis_server.url, crawl_id, site.url + "/p/0",
                     settings={"LEASED_LOGSTATS_INTERVAL": value})
    assert w.wait(60) != 0
    text = w.log_text()
    assert [ln for ln in text.splitlines()
            if "LEASED_LOGSTATS_INTERVAL" in ln and repr(value) in ln], text
    assert site.entries() == []
