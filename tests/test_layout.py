"""The package's boundaries: what can be imported without what."""

import subprocess
import sys


def test_the_frontier_imports_no_scrapy():
    # The Redis state machine knows nothing of Scrapy (a fresh interpreter: this one
    # has Scrapy loaded already)
    subprocess.run([sys.executable, "-c",
                    "import scrapy_leased.frontier, sys; assert 'scrapy' not in sys.modules"],
                   check=True, timeout=60)


def test_the_documented_class_paths_load():
    from scrapy.utils.misc import load_object

    for path in ("scrapy_leased.Addon", "scrapy_leased.LeasedScheduler",
                 "scrapy_leased.LeasedDupeFilter", "scrapy_leased.LeasedFailureMiddleware",
                 "scrapy_leased.claim_token", "scrapy_leased.observe.logstats.LeasedLogStats",
                 "scrapy_leased.ratelimit.LeasedRateMiddleware",
                 "scrapy_leased.worker.seeding.LeasedStartMiddleware",
                 "scrapy_leased.upsert.UpsertPipeline",
                 "scrapy_leased.upsert.UpsertFenceMiddleware",
                 "scrapy_leased.commands.leased.Command"):
        assert callable(load_object(path)), path
