"""Every ``request.meta`` key scrapy_leased reads or writes, in one place.

Keys starting with ``PRIVATE_META_PREFIX`` are this worker's bookkeeping: they are never
stored in Redis (a request another worker claims gets its own). The user's own key is
``META_LANE``.
"""

from __future__ import annotations

import decimal
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scrapy import Request

#: Meta keys starting with this are per-process bookkeeping: never stored.
PRIVATE_META_PREFIX = "_leased"
#: ``_leased_claim`` (int, set by LeasedScheduler): the claim token (also the fencing
#: token) of a request this worker claimed from Redis. Copied with the meta by retries
#: and redirects, and by anything else that copies meta (``meta=response.meta``,
#: ``request.replace()``): the scheduler trusts it only for Scrapy's own continuations
#: (see worker/scheduler.py), never for a new request. Read it with ``claim_token``.
META_CLAIM = "_leased_claim"
#: ``_leased_not_before`` (float seconds, set by LeasedRateMiddleware): how long the
#: scheduler must wait before handing the request out again (no rate budget for it yet).
META_NOT_BEFORE = "_leased_not_before"
#: ``_leased_free_since`` (float, ``time.monotonic()``, set by LeasedScheduler): when the
#: claim call that claimed the request was sent, set when its lane had nothing to
#: enforce then; read by
#: LeasedRateMiddleware (LEASED_RATE_FREE_GRACE).
META_FREE_SINCE = "_leased_free_since"
#: ``_leased_budget_taken`` (int, ms of Redis server time, set by LeasedRateMiddleware):
#: when the request took its lane's rate budget (the moment the fleet-wide guarantee
#: counts). Set again by each attempt (a retry takes budget again). For observation:
#: the demo sends it to its test site to check the budget from the requests' start.
META_BUDGET_TAKEN = "_leased_budget_taken"
#: ``leased_lane`` (str, set by the user): the request's lane, the key of its rate
#: budget, instead of its host (LEASED_RATE_KEY). Stored with the request.
META_LANE = "leased_lane"
#: ``leased_revisit_after`` (seconds, set by the user): once the request is done, queue it
#: again this long after its ack, instead of LEASED_REVISIT_AFTER; 0: never. Stored with
#: the request, so the request queued again is revisited again.
META_REVISIT_AFTER = "leased_revisit_after"

#: The longest revisit interval (ms): about 142,000 years; Redis's time plus this stays
#: an exact Lua number (a double).
MAX_REVISIT_MS = 2**52

__all__ = ["MAX_REVISIT_MS", "META_BUDGET_TAKEN", "META_CLAIM", "META_FREE_SINCE", "META_LANE",
           "META_NOT_BEFORE", "META_REVISIT_AFTER", "PRIVATE_META_PREFIX", "claim_token",
           "revisit_ms"]


def shown(value: Any, limit: int = 100) -> str:
    """``repr(value)`` for a message: at most ``limit`` characters, lone surrogates
    escaped (repr does), an int too long to print (Python refuses past 4300 digits) by
    its size."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        return f"an integer of {value.bit_length()} bits"
    try:
        text = repr(value)
    except Exception as exc:  # a value whose repr raises
        return f"a {type(value).__qualname__} ({type(exc).__name__} in its repr)"
    return text if len(text) <= limit else text[:limit] + "..."


def claim_token(request: Request) -> int | None:
    """The claim token (a crawl-wide, only-growing fencing token) of a request; None
    when it has none (or holds something else than a token under the key)."""
    token = request.meta.get(META_CLAIM)
    if isinstance(token, bool) or not isinstance(token, int):
        return None
    return int(token)


def revisit_ms(request: Request, default_ms: int) -> int:
    """The request's revisit interval in ms (``leased_revisit_after``, else
    ``default_ms``: LEASED_REVISIT_AFTER); 0: not revisited. Raises ValueError (and
    nothing else) when the meta value is not a number of seconds >= 0 (an int, a float
    or a Decimal: not a bool, not a string) of at most ``MAX_REVISIT_MS`` / 1000."""
    raw = request.meta.get(META_REVISIT_AFTER)
    if raw is None:
        return default_ms
    seconds = math.nan
    if isinstance(raw, (int, float, decimal.Decimal)) and not isinstance(raw, bool):
        try:
            seconds = float(raw)
        except (OverflowError, ValueError):  # an int too large for a float
            seconds = math.inf
    ms = seconds * 1000
    if not 0 <= ms <= MAX_REVISIT_MS:  # nan, inf and negatives included
        raise ValueError(f"meta {META_REVISIT_AFTER!r} ({shown(raw)}) must be a number of "
                         f"seconds >= 0 and <= {MAX_REVISIT_MS // 1000}")
    return int(ms)
