"""The defaults of the ``LEASED_*`` settings, as data, with their unit in the name
(docs/settings.md lists each with its setting)."""

from __future__ import annotations

# LEASED_CONNECT_TIMEOUT: how long a starting worker waits for Redis (defined where
# it is used, in _redis/connection.py, the layer below this one)
from .._redis.connection import CONNECT_TIMEOUT_SECONDS as CONNECT_TIMEOUT_SECONDS

LEASE_SECONDS = 30.0
MAX_ATTEMPTS = 4
SWEEP_INTERVAL_SECONDS = 2.0
IDLE_POLL_SECONDS = 0.2
WORKER_TTL_SECONDS = 30.0
WORKER_PRUNE_TTLS = 5  # registry entries silent for this many worker TTLs are removed
SEEN_BUCKET_BITS = 14
SEEN_CACHE = 100_000
RECOVER_BATCH = 500
LOGSTATS_INTERVAL_SECONDS = 60.0  # the fleet log line's period (0: off)
#: LEASED_RUN_GRACE inside a Scrapyd job (``in_scrapyd_job``): jobs scheduled together
#: start up to a poll interval (5 s) or more apart; 0 elsewhere
SCRAPYD_RUN_GRACE_SECONDS = 30.0
EMBEDDED_DIR = "leased-redis"  # under the project's .scrapy/ (embedded.embedded_data_dir)
#: LEASED_RATE_RECOVERY's default, in ms: the slowdown factor halves this often
HALF_LIFE_MS = 30_000
# UpsertPipeline (LEASED_UPSERT_*)
UPSERT_BATCH_SIZE = 500  # records per store round trip
UPSERT_PREFIX = "records"  # SQL table <prefix>_<type>, Redis hash leased:{crawl}:<prefix>:<type>
UPSERT_DEFAULT_KEY = ("url",)  # when neither the setting nor the item class names a key
