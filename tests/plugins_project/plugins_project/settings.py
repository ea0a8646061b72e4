"""A small project using scrapy-playwright (spider ``pw``) and scrapy-poet (spider
``poet``), each set up as its README says, for tests/test_plugins.py.

Environment: ``PLUGINS_NO_ADDON=1`` runs plain Scrapy (no scrapy_leased add-on);
``PLUGINS_POET=1`` enables scrapy-poet's add-on. ``PYTHONPATH`` holds tests/project, for
its RecordPipeline and start barrier.
"""

import os

BOT_NAME = "plugins_project"
SPIDER_MODULES = ["plugins_project.spiders"]
NEWSPIDER_MODULE = "plugins_project.spiders"

ADDONS = {}
if os.environ.get("PLUGINS_NO_ADDON", "") in ("", "0"):
    ADDONS["scrapy_leased.Addon"] = 100
if os.environ.get("PLUGINS_POET", "") not in ("", "0"):
    ADDONS["scrapy_poet.Addon"] = 300

ROBOTSTXT_OBEY = False
LOG_LEVEL = "INFO"
TELNETCONSOLE_ENABLED = False
CONCURRENT_REQUESTS = 4

ITEM_PIPELINES = {"testproject.pipelines.RecordPipeline": 500}
RECORD_PATH = None
EXTENSIONS = {"testproject.extensions.FleetBarrier": 0}
TEST_BARRIER_DIR = None
TEST_BARRIER_SIZE = 0
