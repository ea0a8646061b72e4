"""Settings of the fault-test Scrapy project (run from tests/project).

Set the env var TESTPROJECT_NO_ADDON=1 (or pass ``-s ADDONS={}``) to run
without the scrapy_leased add-on, i.e. a plain single-process Scrapy crawl.
"""

import os

BOT_NAME = "testproject"

SPIDER_MODULES = ["testproject.spiders"]
NEWSPIDER_MODULE = "testproject.spiders"

if os.environ.get("TESTPROJECT_NO_ADDON", "") not in ("", "0"):
    ADDONS = {}
else:
    ADDONS = {"scrapy_leased.Addon": 100}

# The fault tests restart crawls on purpose and check what carries over: a new run of a
# finished crawl continues it (LEASED_RESUME) instead of starting afresh, the plugin's
# default. tests/test_rerun.py sets TESTPROJECT_DEFAULT_RESUME=1 to run with the default.
if os.environ.get("TESTPROJECT_DEFAULT_RESUME", "") in ("", "0"):
    LEASED_RESUME = True

ROBOTSTXT_OBEY = False
LOG_LEVEL = "INFO"
TELNETCONSOLE_ENABLED = False
CONCURRENT_REQUESTS = 16
DOWNLOAD_DELAY = 0

ITEM_PIPELINES = {"testproject.pipelines.RecordPipeline": 500}

# RecordPipeline: append items as JSON lines here (unset -> no-op);
# RECORD_DELAY seconds before writing, only for item URLs containing
# RECORD_DELAY_PATH if that is set.
RECORD_PATH = None
RECORD_DELAY = 0
RECORD_DELAY_PATH = None

# Test-only start barrier for workers started together (off unless TEST_BARRIER_DIR and
# TEST_BARRIER_SIZE are set): see testproject/extensions.py.
EXTENSIONS = {"testproject.extensions.FleetBarrier": 0}
TEST_BARRIER_DIR = None
TEST_BARRIER_SIZE = 0
