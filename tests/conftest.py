"""Shared fixtures for the scrapy_leased tests.

redis_server   session  RedisServer, no AOF (share it; keep tests apart with crawl_id)
redis_fresh    function RedisServer of the test's own, no AOF
redis_aof      function RedisServer with AOF (appendfsync always), for restart/crash tests
crawl_id       function unique crawl id string, "t-<testname>-<random>"
site           function Site(pages=200), started
make_site      function factory make_site(pages=200, ports=1, log_path=None, **kw) -> Site (started)
make_site_process function factory make_site_process(pages=500, ports=1, log_path=None, **kw)
                        -> SiteProcess (the site in a subprocess; log only in the file)
start_worker   function WorkerFactory: start_worker(redis_url, crawl_id, start_url,
                        settings={}, args={}, name="w1", env=None, record=True) -> Worker
worker         function alias of start_worker
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from scrapy_leased.testing.process import SiteProcess
from scrapy_leased.testing.site import Site
from tests.support.redis_server import RedisServer
from tests.support.workers import WorkerFactory

# Scrapy's CookiesMiddleware splits domains with tldextract, which fetches the Public
# Suffix List on first use (per virtualenv) and logs a traceback when there is no
# network: the suite and the workers it starts use tldextract's bundled copy instead.
os.environ.setdefault("TLDEXTRACT_PUBLIC_SUFFIX_LIST_URLS", "")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    # remember each phase's report so fixtures can tell whether the test failed
    rep = yield
    setattr(item, f"rep_{rep.when}", rep)
    return rep


#: fixtures that start a site, a worker process or a server per test (or share the
#: session's): a test that uses one, directly or through another fixture, is an
#: ``integration`` test; every other test is ``unit``
_INTEGRATION_FIXTURES = frozenset({
    "redis_server", "redis_aof", "redis_fresh", "make_site", "site", "make_site_process", "start_worker",
    "worker", "target", "server", "tls_sentinel_group", "tls_cluster", "small_cluster",
    "sentinel_group", "one_sentinel", "one_node_cluster", "cluster", "browser", "login_site",
    "seeded",
})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test ``unit`` or ``integration``: ``pytest -m unit`` runs the fast ones
    in well under a minute; a test that starts a server or a process in its body, or takes
    seconds, is marked ``integration`` in its file."""
    for item in items:
        if item.get_closest_marker("integration") is not None:
            continue
        names = set(getattr(item, "fixturenames", ()))
        item.add_marker("integration" if names & _INTEGRATION_FIXTURES else "unit")


def _test_failed(request) -> bool:
    rep = getattr(request.node, "rep_call", None)
    return rep is None or rep.failed


@pytest.fixture(scope="session")
def redis_server():
    with RedisServer(appendonly=False) as srv:
        yield srv


def _own_server(appendonly: bool):
    with RedisServer(appendonly=appendonly) as srv:
        yield srv


@pytest.fixture
def redis_fresh():
    """A RedisServer of the test's own, no AOF: for a test whose keys have fixed names."""
    yield from _own_server(appendonly=False)


@pytest.fixture
def redis_aof():
    yield from _own_server(appendonly=True)


@pytest.fixture
def crawl_id(request) -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)[:60]
    return f"t-{name}-{uuid.uuid4().hex[:8]}"


@contextmanager
def _stopped_after(start: Callable[..., Any]) -> Iterator[Callable[..., Any]]:
    """``start`` as a factory whose products are stopped when the test ends."""
    made: list[Any] = []

    def make(*args: Any, **kwargs: Any) -> Any:
        made.append(start(*args, **kwargs))
        return made[-1]

    try:
        yield make
    finally:
        for x in made:
            x.stop()


@pytest.fixture
def make_site():
    def start(pages: int = 200, ports: int = 1, log_path=None, **kwargs) -> Site:
        return Site(pages=pages, ports=ports, log_path=log_path, **kwargs).start()

    with _stopped_after(start) as make:
        yield make


@pytest.fixture
def site(make_site) -> Site:
    return make_site(pages=200)


@pytest.fixture
def make_site_process(tmp_path: Path):
    count = iter(range(1, 1_000_000))

    def start(pages: int = 500, ports: int = 1, log_path=None, **kwargs) -> SiteProcess:
        log_path = log_path or tmp_path / f"site-{next(count)}.jsonl"
        return SiteProcess(pages=pages, log_path=log_path, ports=ports, **kwargs).start()

    with _stopped_after(start) as make:
        yield make


@pytest.fixture
def start_worker(request, tmp_path: Path):
    factory = WorkerFactory(tmp_path)
    yield factory
    failed = _test_failed(request)
    factory.cleanup()
    if failed and factory.workers:
        # shown under "Captured stdout teardown" of the failing test
        print(factory.report())


@pytest.fixture
def worker(start_worker):
    return start_worker


@pytest.fixture(params=["redis", "sqlite", "postgresql"])
def target(request, redis_server, crawl_id, tmp_path):
    """An UpsertPipeline backend (tests/support/upsert.py), cleaned up afterwards."""
    from tests.support.upsert import make_target

    t = make_target(request.param, redis_server=redis_server, crawl_id=crawl_id,
                    tmp_path=tmp_path)
    yield t
    for fn in t.cleanup:
        fn()
