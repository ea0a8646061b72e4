"""Every ``request.meta`` key scrapy_leased reads or writes, in one place.

Keys starting with ``PRIVATE_META_PREFIX`` are this worker's bookkeeping: they are never
stored in Redis (a request another worker claims gets its own). The user's own key is
``META_LANE``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scrapy import Request

#: Meta keys starting with this are per-process bookkeeping: never stored.
PRIVATE_META_PREFIX = "_leased"
#: ``_leased_claim`` (int, set by LeasedScheduler): the claim token (also the fencing
#: token) of a request this worker claimed from Redis. Copied with the meta by retries
#: and redirects, and by anything else that copies meta (``meta=response.meta``,
#: ``request.replace()``): the scheduler trusts it only for Scrapy's own continuations
#: (see scheduler.py), never for a new request. Read it with ``claim_token``.
META_CLAIM = "_leased_claim"
#: ``_leased_not_before`` (float seconds, set by LeasedRateMiddleware): how long the
#: scheduler must wait before handing the request out again (no rate budget for it yet).
META_NOT_BEFORE = "_leased_not_before"
#: ``_leased_free_since`` (float, ``time.monotonic()``, set by LeasedScheduler): when the
#: request was claimed, set when its lane had nothing to enforce then; read by
#: LeasedRateMiddleware (LEASED_RATE_FREE_GRACE).
META_FREE_SINCE = "_leased_free_since"
#: ``leased_lane`` (str, set by the user): the request's lane, the key of its rate
#: budget, instead of its host (LEASED_RATE_KEY). Stored with the request.
META_LANE = "leased_lane"

__all__ = ["META_CLAIM", "META_FREE_SINCE", "META_LANE", "META_NOT_BEFORE",
           "PRIVATE_META_PREFIX", "claim_token"]


def claim_token(request: Request) -> int | None:
    """The claim token (a crawl-wide, only-growing fencing token) of a request."""
    token = request.meta.get(META_CLAIM)
    return None if token is None else int(token)
