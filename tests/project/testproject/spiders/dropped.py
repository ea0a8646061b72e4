"""A spider that yields, beside the links of the test site, requests that cannot be
stored (tests/test_dropped.py): each must become a dead letter, never a silent drop.

Every page yields an item with its URL and follows the site's links. Besides:

- page ``i`` with ``i % 10 == 3`` yields ``/bad/meta/<i>`` with ``meta={"obj": Opaque(),
  "ok": i}`` (``obj`` cannot be stored, ``ok`` can);
- page ``i`` with ``i % 10 == 7`` yields ``/bad/kwargs/<i>`` to ``parse_detail`` with
  ``cb_kwargs={"when": Opaque()}``;
- page ``i`` with ``i % 20 == 5`` yields ``/bad/shared`` with ``meta={"obj": Opaque()}``
  (the same request from several pages: one dead letter, each drop counted).
"""

from __future__ import annotations

from typing import Any

import scrapy

from ._base import StartUrlSpider


class Opaque:
    """An object the codec cannot store (not an item, not JSON)."""


def bad_requests(pages: int) -> tuple[dict[str, str], int]:
    """(path of each dead letter -> the key named in its reason, drops in all)."""
    letters, drops = {}, 0
    for i in range(pages):
        if i % 10 == 3:
            letters[f"/bad/meta/{i}"] = "meta['obj']"
            drops += 1
        if i % 10 == 7:
            letters[f"/bad/kwargs/{i}"] = "cb_kwargs['when']"
            drops += 1
        if i % 20 == 5:
            letters["/bad/shared"] = "meta['obj']"
            drops += 1
    return letters, drops


class DroppedSpider(StartUrlSpider):
    name = "dropped"

    def parse(self, response: scrapy.http.Response) -> Any:
        i = int(response.url.rsplit("/", 1)[1])
        base = response.url.split("/p/")[0]
        yield {"url": response.url, "worker": self.worker}
        if i % 10 == 3:
            yield scrapy.Request(f"{base}/bad/meta/{i}", meta={"obj": Opaque(), "ok": i})
        if i % 10 == 7:
            yield scrapy.Request(f"{base}/bad/kwargs/{i}", callback=self.parse_detail,
                                 cb_kwargs={"when": Opaque()})
        if i % 20 == 5:
            yield scrapy.Request(f"{base}/bad/shared", meta={"obj": Opaque()})
        yield from response.follow_all(css="a", callback=self.parse)

    def parse_detail(self, response: scrapy.http.Response, when: Any = None) -> Any:
        yield {"url": response.url, "worker": self.worker}
