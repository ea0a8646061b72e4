"""Plugins installed from PyPI, set up as their READMEs say, give the same items with
the add-on (2 workers started together, one real Redis) as plain Scrapy, on a local site
(tests/support/plugins_site.py; project: tests/plugins_project).

- scrapy-playwright, Chromium at /usr/bin/chromium: ``PageMethod``s in meta travel
  through Redis and run on the worker that downloads the page; a request reusing a live
  ``playwright_page`` is refused with an error naming the URL, the key and the fix.
- scrapy-poet: ``callback_for`` callbacks (stored by the spider attribute that holds
  them) and a ``web_poet.Retry`` raised from a callback or while a page object is built:
  the page is fetched again.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.support.plugins_site import PluginsSite
from tests.support.workers import REPO_ROOT, WorkerFactory

pytest.importorskip("scrapy_playwright")
pytest.importorskip("scrapy_poet")

PROJECT = REPO_ROOT / "tests" / "plugins_project"
CHROMIUM = "/usr/bin/chromium"


@pytest.fixture
def plugins_site():
    site = PluginsSite().start()
    yield site
    site.stop()


@pytest.fixture
def workers(request, tmp_path: Path):
    factory = WorkerFactory(tmp_path, project_dir=PROJECT)
    yield factory
    rep = getattr(request.node, "rep_call", None)
    factory.cleanup()
    if (rep is None or rep.failed) and factory.workers:
        print(factory.report(80))


def _env(**extra: str) -> dict[str, str]:
    path = [str(REPO_ROOT), str(REPO_ROOT / "tests" / "project")]
    if os.environ.get("PYTHONPATH"):
        path.append(os.environ["PYTHONPATH"])
    return {"PYTHONPATH": os.pathsep.join(path), **extra}


def _run_plain(workers: WorkerFactory, spider: str, start_url: str, **env: str):
    w = workers(None, None, start_url, spider=spider, name="plain",
                env=_env(PLUGINS_NO_ADDON="1", **env))
    assert w.wait(180) == 0, w.log_tail()
    assert w.close_reason() == "finished", w.log_tail()
    return w


def _run_fleet(workers: WorkerFactory, redis_url: str, crawl_id: str, spider: str,
               start_url: str, **env: str):
    barrier = workers.barrier(2)
    fleet = [workers(redis_url, crawl_id, start_url, spider=spider, name=f"w{i}",
                     settings=barrier, env=_env(**env)) for i in (1, 2)]
    for w in fleet:
        assert w.wait(240) == 0, w.log_tail()
        assert w.close_reason() == "finished", w.log_tail()
    return fleet


def _items(ws) -> list[tuple]:
    return sorted(tuple(sorted((k, v) for k, v in it.items() if k not in ("pid", "t")))
                  for w in ws for it in w.items())


@pytest.mark.skipif(not shutil.which(CHROMIUM), reason=f"no Chromium at {CHROMIUM}")
def test_playwright_page_methods_in_meta_two_workers_as_plain(redis_server, crawl_id,
                                                              workers, plugins_site):
    start = plugins_site.url + "/js/0"
    plain = _items([_run_plain(workers, "pw", start)])
    assert {dict(i)["url"] for i in plain} == plugins_site.js_urls()
    # the titles and links exist only after the page's script ran; "links" is the result
    # of a PageMethod
    assert all(dict(i)["title"] == "js page " + dict(i)["url"].rsplit("/", 1)[1]
               for i in plain)
    assert sum(dict(i)["links"] for i in plain) == plugins_site.js_pages - 1

    plugins_site.reset()
    fleet = _run_fleet(workers, redis_server.url, crawl_id, "pw", start)
    assert _items(fleet) == plain  # each page once, by one worker
    assert all(n == 1 for p, n in plugins_site.hits.items() if p != "/js/0")
    # the request reusing the live page (page 0) is refused: URL, key and fix named
    refused = [line for w in fleet for line in w.log_text().splitlines()
               if "meta['playwright_page']" in line]
    assert len(refused) == 1, refused
    assert f"<GET {start}>" in refused[0]
    assert "a live Playwright object" in refused[0]
    assert "playwright_page_methods" in refused[0]


def test_poet_callback_for_and_retry_two_workers_as_plain(redis_server, crawl_id, workers,
                                                          plugins_site):
    start = plugins_site.url + "/list/0"
    plain_worker = _run_plain(workers, "poet", start, PLUGINS_POET="1")
    plain = _items([plain_worker])
    items = {dict(i)["url"] for i in plain if dict(i)["kind"] == "item"}
    assert items == {f"{plugins_site.url}/item/{n}" for n in plugins_site.item_numbers()}
    assert len([i for i in plain if dict(i)["kind"] == "list"]) == plugins_site.lists
    retried = {f"/item/{n}" for n in plugins_site.item_numbers() if n % 3 in (0, 1)}
    assert {p for p, n in plugins_site.hits.items() if n == 2 and "/item/" in p} == retried
    assert plain_worker.stats()["retry/reason_count/page_object_retry"] == len(retried)

    plugins_site.reset()
    fleet = _run_fleet(workers, redis_server.url, crawl_id, "poet", start, PLUGINS_POET="1")
    assert _items(fleet) == plain
    # every page "loading" at first was fetched again (web_poet.Retry from the callback or
    # from building the page object), once
    assert {p for p, n in plugins_site.hits.items() if n == 2 and "/item/" in p} == retried
    assert sum(w.stats().get("retry/reason_count/page_object_retry", 0)
               for w in fleet) == len(retried)
    for w in fleet:
        assert "cannot store" not in w.log_text(), w.log_tail()
        assert w.stats().get("leased/unserializable", 0) == 0
