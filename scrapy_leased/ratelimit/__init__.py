"""Shared per-lane rate budgets: the budgets (settings), the downloader middleware that
enforces them, and the decoding of a lane's rate state in Redis (also used by
``scrapy leased status``).

``scrapy_leased.ratelimit.LeasedRateMiddleware`` is the middleware's public path; the
names are loaded on first use, so ``scrapy_leased.ratelimit.state`` imports no Scrapy.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "Budgets": "budgets",
    "parse_rate": "budgets",
    "LeasedRateMiddleware": "middleware",
    "retry_after_seconds": "middleware",
    "RateState": "state",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{module}"), name)
