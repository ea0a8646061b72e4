"""``scrapy leased status`` says what the crawl is doing (#25 item 8): a crawl whose
last worker finished is ``finished``, not ``running`` with 0 workers; work seeded with
no worker alive is ``idle``. Real redis-server, a real ``scrapy crawl`` worker."""

from __future__ import annotations

import json

from tests.test_commands import FAST, assert_finished, leased, ok, status_json, text_value


def state_line(url: str, crawl_id: str) -> str:
    text = ok(leased("status", crawl_id, "--sample", "0", "--redis-url", url))
    return next(line.split()[1] for line in text.splitlines()
                if line.strip().startswith("state "))


def test_status_tells_idle_running_and_finished(redis_server, make_site, start_worker,
                                                crawl_id):
    site = make_site(pages=20)
    url = redis_server.url
    ok(leased("seed", crawl_id, site.url + "/p/0", "--redis-url", url))
    assert status_json(url, crawl_id, "--sample", "0")["state"] == "idle"
    assert state_line(url, crawl_id) == "idle"

    assert_finished(start_worker(url, crawl_id, site.url + "/p/0", settings=FAST))
    doc = status_json(url, crawl_id, "--sample", "0")
    assert (doc["state"], doc["todo"], doc["workers_alive"]) == ("finished", 0, 0), doc
    assert doc["control"]["state"] == "running"  # the control state: nobody paused it
    assert state_line(url, crawl_id) == "finished"

    ok(leased("pause", crawl_id, "--redis-url", url))
    assert status_json(url, crawl_id, "--sample", "0")["state"] == "paused"
    text = ok(leased("status", crawl_id, "--sample", "0", "--redis-url", url))
    assert "paused" in text and text_value(text, "workers alive") == 0
    json.dumps(doc)  # the document stays plain JSON
