"""Request serialization cost: scrapy_leased's codec vs Scrapy's Request.to_dict.

Request.to_dict(spider=...) finds a callback's name with inspect.getmembers(spider)
for every request; scrapy_leased.codec looks the bound method up by its name.

    python benchmarks/bench_codec.py [--n 20000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import scrapy
from benchspider import BenchSpider
from scrapy.utils.request import request_from_dict

from scrapy_leased.codec import decode_request, encode_request


class CodecSpider(BenchSpider):
    def parse_page(self, response: Any) -> None:
        """The measured requests' callback."""


def to_json(d: dict) -> str:
    """Request.to_dict output made JSON-able (bytes headers and body as latin-1)."""
    d = dict(d, headers={k.decode("latin-1"): [v.decode("latin-1") for v in vs]
                         for k, vs in d["headers"].items()}, body=d["body"].decode("latin-1"))
    return json.dumps(d)


def from_json(p: str, spider: scrapy.Spider) -> scrapy.Request:
    d = json.loads(p)
    d["body"] = d["body"].encode("latin-1")
    return request_from_dict(d, spider=spider)


def requests(spider: CodecSpider, n: int) -> list[scrapy.Request]:
    return [scrapy.Request(f"http://example.com/p/{i}", callback=spider.parse_page,
                           meta={"depth": 3}, headers={"Referer": "http://example.com/"})
            for i in range(n)]


def best_rate(fn, reps: int = 5) -> tuple[float, float, float]:
    rates = []
    for _ in range(reps):
        t0 = time.perf_counter()
        n = fn()
        rates.append(n / (time.perf_counter() - t0))
    return statistics.median(rates), min(rates), max(rates)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20_000)
    n = ap.parse_args().n
    spider = CodecSpider()
    reqs = requests(spider, n)
    ours = [encode_request(r, spider) for r in reqs]
    theirs = [to_json(r.to_dict(spider=spider)) for r in reqs]
    rows = [
        ("encode", lambda: len([encode_request(r, spider) for r in reqs]),
         lambda: len([to_json(r.to_dict(spider=spider)) for r in reqs])),
        ("decode", lambda: len([decode_request(p, spider) for p in ours]),
         lambda: len([from_json(p, spider) for p in theirs])),
    ]
    print(f"{n:,} requests with a callback, meta and a Referer header; median (min-max) of 5 runs")
    print(f"{'':8}{'scrapy_leased req/s':>28}{'Request.to_dict req/s':>30}{'ratio':>8}")
    for name, a, b in rows:
        (am, alo, ahi), (bm, blo, bhi) = best_rate(a), best_rate(b)
        print(f"{name:8}{am:>12,.0f} ({alo:,.0f}-{ahi:,.0f}){bm:>14,.0f} ({blo:,.0f}-{bhi:,.0f})"
              f"{am / bm:>7.1f}x")
    print(f"payload bytes: scrapy_leased {len(ours[0])}, to_dict JSON {len(theirs[0])}")


if __name__ == "__main__":
    main()
