"""Settings of the end-to-end benchmark project (``benchmarks/run_all.py`` runs it).

One spider, four setups, chosen by the environment variable ``BENCH_MODE``:

* ``plain``: Scrapy alone (default scheduler and dupefilter, in memory, one process);
* ``scrapy_redis``: scrapy-redis's scheduler and dupefilter (``REDIS_URL`` given with
  ``-s``), ``SCHEDULER_PERSIST = True`` so the first worker to close does not delete the
  shared queue and dupefilter, and ``IdleClose`` so each worker ends by itself;
* ``leased``: the scrapy_leased add-on (``LEASED_REDIS_URL`` / ``LEASED_CRAWL_ID`` given
  with ``-s``), with ``LEASED_UPSERT_ENABLED = False`` (the other two store nothing);
* ``leased_defaults``: the add-on at its defaults, as a user gets it (every middleware
  and extension on; ``UpsertPipeline`` off, as by default without ``LEASED_UPSERT_URL``).

Everything else is Scrapy's defaults (``CONCURRENT_REQUESTS`` 16,
``CONCURRENT_REQUESTS_PER_DOMAIN`` 8, no download delay), with no item pipeline.
"""

import os

BOT_NAME = "benchproject"
SPIDER_MODULES = ["benchproject.spiders"]
NEWSPIDER_MODULE = "benchproject.spiders"

LOG_LEVEL = "WARNING"
TELNETCONSOLE_ENABLED = False
ROBOTSTXT_OBEY = False
ITEM_PIPELINES = {}
EXTENSIONS = {"benchproject.extensions.BenchReport": 0,
              "benchproject.extensions.GcFreeze": 0}
# GcFreeze: gc.freeze() once the spider has opened, as LEASED_GC_FREEZE does (a control
# for plain Scrapy; the add-on's own freeze is its setting)
BENCH_GC_FREEZE = False

# BenchReport writes this worker's close reason, stats and Redis round trips here
BENCH_REPORT = None

MODE = os.environ.get("BENCH_MODE", "plain")
if MODE == "leased":
    ADDONS = {"scrapy_leased.Addon": 100}
    LEASED_UPSERT_ENABLED = False
elif MODE == "leased_defaults":
    # the add-on exactly as a user gets it: every middleware and setting at its default
    # (UpsertPipeline off: it is on only with LEASED_UPSERT_URL or LEASED_UPSERT_ENABLED)
    ADDONS = {"scrapy_leased.Addon": 100}
elif MODE == "scrapy_redis":
    SCHEDULER = "scrapy_redis.scheduler.Scheduler"
    DUPEFILTER_CLASS = "scrapy_redis.dupefilter.RFPDupeFilter"
    SCHEDULER_PERSIST = True
    EXTENSIONS["benchproject.extensions.IdleClose"] = 0
    # seconds without a response before a worker closes (see IdleClose)
    BENCH_IDLE_CLOSE = 6
elif MODE != "plain":
    raise ValueError(f"BENCH_MODE ({MODE!r}) must be plain, scrapy_redis, leased or "
                     "leased_defaults")
