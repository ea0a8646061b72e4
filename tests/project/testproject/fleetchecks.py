"""Test-only close-time checks of the whole fleet (tests/test_fleet_checks.py).

- ``FleetCloseSuite``: Spidermon's ItemCountMonitor (SPIDERMON_MIN_ITEMS),
  FinishReasonMonitor and FieldCoverageMonitor (SPIDERMON_FIELD_COVERAGE_RULES), with an
  action appending one JSON line per run of the suite to ``TEST_MONITOR_FILE``: the
  worker's pid, whether the monitors passed, the item count and the coverage they saw.
- ``FleetClosedRecorder``: a project's own extension on ``scrapy_leased.signals.
  fleet_closed`` (plain Scrapy API), appending one JSON line per signal to
  ``TEST_FLEET_CLOSED_FILE``.
"""

from __future__ import annotations

import json
import os
from datetime import datetime

from scrapy.exceptions import NotConfigured
from spidermon import MonitorSuite
from spidermon.contrib.scrapy.monitors import (
    FieldCoverageMonitor,
    FinishReasonMonitor,
    ItemCountMonitor,
)
from spidermon.core.actions import Action

from scrapy_leased.signals import fleet_closed


def _append(path: str, line: dict) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


class RecordRun(Action):
    def run_action(self) -> None:
        stats = self.data.stats
        _append(self.data.crawler.settings.get("TEST_MONITOR_FILE"), {
            "pid": os.getpid(), "passed": not self.monitors_failed,
            "items": stats.get("item_scraped_count"),
            "finish_reason": stats.get("finish_reason"),
            "url_coverage": stats.get("spidermon_field_coverage/dict/url")})


class FleetCloseSuite(MonitorSuite):
    monitors = [ItemCountMonitor, FinishReasonMonitor, FieldCoverageMonitor]
    monitors_finished_actions = [RecordRun]


class FleetClosedRecorder:
    def __init__(self, path: str) -> None:
        self.path = path

    @classmethod
    def from_crawler(cls, crawler):
        path = crawler.settings.get("TEST_FLEET_CLOSED_FILE")
        if not path:
            raise NotConfigured
        ext = cls(path)
        crawler.signals.connect(ext.fleet_closed, signal=fleet_closed)
        return ext

    def fleet_closed(self, stats, reason, spider) -> None:
        _append(self.path, {
            "pid": os.getpid(), "reason": reason, "spider": spider.name,
            "items": stats.get("item_scraped_count"),
            "responses": stats.get("response_received_count"),
            "finish_reason": stats.get("finish_reason"),
            "start_time_is_datetime": isinstance(stats.get("start_time"), datetime),
            "elapsed": stats.get("elapsed_time_seconds")})
