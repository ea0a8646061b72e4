"""LEASED_GC_FREEZE (scrapy_leased/worker/gcfreeze.py): a worker's start-up objects are
frozen while it crawls and unfrozen when the last worker of the process closes; objects
frozen by someone else stay frozen."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from scrapy_leased.worker.gcfreeze import _Freezes
from tests.test_crawl import assert_each_once, assert_exit, page_paths


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """No object frozen before the test, none after it."""
    gc.unfreeze()
    yield
    gc.unfreeze()


@pytest.mark.unit
def test_frozen_while_a_worker_holds_it_unfrozen_after_the_last(unfrozen: None) -> None:
    freezes = _Freezes()
    first = freezes.hold()
    assert first == gc.get_freeze_count() > 1000  # pytest's and this package's objects
    kept = [object() for _ in range(10)]  # alive, made after the first freeze
    assert freezes.hold() >= first  # a second worker of the process freezes those too
    freezes.release()
    assert gc.get_freeze_count() >= first  # one worker still holds it
    freezes.release()
    assert gc.get_freeze_count() == 0
    freezes.release()  # a release without a hold changes nothing
    assert gc.get_freeze_count() == 0
    del kept


@pytest.mark.unit
def test_objects_frozen_by_someone_else_stay_frozen(unfrozen: None) -> None:
    gc.freeze()  # e.g. a server that freezes before it forks its crawl processes
    before = gc.get_freeze_count()
    freezes = _Freezes()
    freezes.hold()
    freezes.release()
    assert gc.get_freeze_count() >= before > 0


def test_a_worker_freezes_its_start_up_objects_unless_told_not_to(redis_server, make_site,
                                                                  start_worker, crawl_id):
    """The worker at its defaults reports what it froze (leased/gc_frozen) and crawls the
    site as without it; with LEASED_GC_FREEZE = False nothing is frozen."""
    pages = 30
    site = make_site(pages=pages)
    w = start_worker(redis_server.url, crawl_id, site.url + "/p/0", name="frozen")
    assert_exit(w, "finished")
    assert w.stats()["leased/gc_frozen"] > 10_000, w.stats()  # Scrapy's, Twisted's, ...
    assert_each_once(site.count_by_path(), page_paths(pages))

    w = start_worker(redis_server.url, crawl_id + "-off", site.url + "/p/0", name="off",
                     settings={"LEASED_GC_FREEZE": False})
    assert_exit(w, "finished")
    assert "leased/gc_frozen" not in w.stats(), w.stats()
