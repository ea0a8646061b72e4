"""A spider whose start page yields child requests that cannot be stored beside good
ones (tests/test_edges_inputs.py): each bad child must be dropped alone, the parent
acked and the good children crawled.

``/p/0`` yields, in this order: ``/p/1`` (good), the bad children of ``BAD_CHILDREN``
(each to its own page ``/p/100 + i``), ``/p/2`` (good, with ordinary meta),
``/redirect/3`` (a redirect to ``/p/3``) and ``/p/4`` with ``parse_raise``, a callback
that raises an error whose text holds a lone surrogate (the dead letter's reason).
Every other page yields an item with its URL.
"""

from __future__ import annotations

import enum
from typing import Any

import scrapy

from ._base import StartUrlSpider


class Prio(enum.IntEnum):
    HIGH = 5


def _circular() -> dict[str, Any]:
    meta: dict[str, Any] = {}
    meta["self"] = meta
    return meta


#: (what is wrong, Request keyword arguments)
BAD_CHILDREN: list[tuple[str, dict[str, Any]]] = [
    ("surrogate in meta", {"meta": {"title": "caf\ud83d"}}),
    ("surrogate in a meta key", {"meta": {"\udc00": 1}}),
    ("surrogate in cb_kwargs", {"cb_kwargs": {"q": ["ok", "\ud83d"]}}),
    ("surrogate in the method", {"method": "G\ud83dT"}),
    ("bool priority", {"priority": True}),
    ("huge priority", {"priority": 10**30}),
    ("huge revisit", {"meta": {"leased_revisit_after": 1e306}}),
    ("nan revisit", {"meta": {"leased_revisit_after": float("nan")}}),
    ("string revisit", {"meta": {"leased_revisit_after": "3600"}}),
    ("int revisit beyond a float", {"meta": {"leased_revisit_after": 10**400}}),
    ("surrogate lane", {"meta": {"leased_lane": "lane\ud83d"}}),
    ("meta holding itself", {"meta": _circular()}),
    ("int of 5000 digits", {"meta": {"n": 10**5000}}),
]


class EdgesInputsSpider(StartUrlSpider):
    name = "edges_inputs"

    def parse(self, response: scrapy.http.Response) -> Any:
        if not response.url.endswith("/p/0"):
            yield {"url": response.url, "worker": self.worker}
            return
        base = response.url[: -len("/p/0")]
        yield scrapy.Request(f"{base}/p/1")
        for i, (_, kwargs) in enumerate(BAD_CHILDREN):
            yield scrapy.Request(f"{base}/p/{100 + i}", **kwargs)
        yield scrapy.Request(f"{base}/p/2", meta={"page": 2, "title": "café ☕"},
                             priority=Prio.HIGH)
        yield scrapy.Request(f"{base}/redirect/3")
        yield scrapy.Request(f"{base}/p/4", callback=self.parse_raise)
        yield {"url": response.url, "worker": self.worker}

    def parse_raise(self, response: scrapy.http.Response) -> Any:
        raise ValueError(f"cannot read {response.url}: title 'caf\ud83d'")
