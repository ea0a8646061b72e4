"""BudgetStampMiddleware: sends when each request took its rate budget, for observing
the budget from the site's side.

The fleet-wide budget is kept on Redis's clock at the moment LeasedRateMiddleware takes
it (``request.meta["_leased_budget_taken"]``, ms of Redis time). A site's log shows when
requests arrived, which trails that moment by a transit time a loaded machine stretches:
a window at the site may hold requests that bunched up on the way. With this middleware
each request carries its budget time in the ``X-Leased-Budget-Taken`` header, and a test
site (scrapy_leased.testing.site logs it as ``budget_taken``) can check the budget
exactly. The demo's workers use it; it is not for real sites (it adds a header).
"""

from __future__ import annotations

from typing import Any

from ..meta import META_BUDGET_TAKEN
from .middleware import RATE_MIDDLEWARE_ORDER

#: The header the budget time is sent in (scrapy_leased.testing.site reads it).
BUDGET_TAKEN_HEADER = "X-Leased-Budget-Taken"
#: Its place in DOWNLOADER_MIDDLEWARES: after LeasedRateMiddleware, which took the budget.
BUDGET_STAMP_ORDER = RATE_MIDDLEWARE_ORDER + 10


class BudgetStampMiddleware:
    """Adds ``X-Leased-Budget-Taken: <ms of Redis time>`` to every request that took
    rate budget (none to a request the budget let through free: a lane with nothing to
    enforce)."""

    def process_request(self, request: Any, spider: object = None) -> None:
        taken = request.meta.get(META_BUDGET_TAKEN)
        if taken is not None:
            request.headers[BUDGET_TAKEN_HEADER] = str(taken)


#: The DOWNLOADER_MIDDLEWARES entry that turns it on (the demo's workers, the rate tests).
BUDGET_STAMP_MIDDLEWARES = {f"{__name__}.{BudgetStampMiddleware.__name__}": BUDGET_STAMP_ORDER}
