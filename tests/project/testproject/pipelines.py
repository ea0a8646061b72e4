import asyncio
import json
import os
import time

from itemadapter import ItemAdapter


class RecordPipeline:
    """Append each item as one JSON line (plus ``pid`` and ``t``) to the file
    named by the ``RECORD_PATH`` setting (no-op if unset).

    ``RECORD_DELAY`` (seconds): wait that long with ``asyncio.sleep`` BEFORE
    writing, so a test can kill the worker while items are not stored yet;
    ``RECORD_DELAY_PATH`` restricts the delay to item URLs containing it.
    ``RECORD_HOLD_FILE``: as the delay, but wait until that file exists (a test creates
    it when it is ready for the items).
    """

    def __init__(self, path, delay=0.0, delay_path=None, hold_file=None):
        self.path = path
        self.hold_file = hold_file
        self.delay = delay
        self.delay_path = delay_path
        self.file = None

    @classmethod
    def from_crawler(cls, crawler):
        s = crawler.settings
        return cls(
            path=s.get("RECORD_PATH") or None,
            delay=s.getfloat("RECORD_DELAY", 0.0),
            delay_path=s.get("RECORD_DELAY_PATH") or None,
            hold_file=s.get("RECORD_HOLD_FILE") or None,
        )

    # Scrapy >= 2.14 style: no spider argument
    def open_spider(self):
        if self.path:
            self.file = open(self.path, "a", encoding="utf-8")

    def close_spider(self):
        if self.file is not None:
            self.file.close()
            self.file = None

    async def process_item(self, item):
        if self.file is None:
            return item
        data = ItemAdapter(item).asdict()
        if self.delay > 0 and (not self.delay_path or self.delay_path in str(data.get("url", ""))):
            await asyncio.sleep(self.delay)
        while self.hold_file and not os.path.exists(self.hold_file):
            await asyncio.sleep(0.05)
        data["pid"] = os.getpid()
        data["t"] = time.time()
        self.file.write(json.dumps(data) + "\n")
        self.file.flush()
        return item


class FaultPipeline:
    """For the outcomes spider: an item with ``fault="raise"`` makes this pipeline
    raise, ``fault="drop"`` drops it (DropItem is not a failure)."""

    async def process_item(self, item):
        from scrapy.exceptions import DropItem

        fault = ItemAdapter(item).get("fault")
        if fault == "raise":
            raise ValueError(f"pipeline refuses {ItemAdapter(item).get('url')}")
        if fault == "drop":
            raise DropItem("dropped on purpose")
        return item
