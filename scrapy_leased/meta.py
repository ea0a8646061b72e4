"""Every ``request.meta`` key scrapy_leased reads or writes, in one place.

Keys starting with ``PRIVATE_META_PREFIX`` are this worker's bookkeeping: they are never
stored in Redis (a request another worker claims gets its own).
"""

#: Meta keys starting with this are per-process bookkeeping: never stored.
PRIVATE_META_PREFIX = "_leased"
#: The claim token (also the fencing token) of a request this worker claimed from
#: Redis. Copied with the meta by retries and redirects, and by anything else that
#: copies meta (``meta=response.meta``, ``request.replace()``): the scheduler trusts it
#: only for Scrapy's own continuations (see scheduler.py), never for a new request.
META_CLAIM = "_leased_claim"
#: Seconds the scheduler must wait before handing the request out again (no rate
#: budget for it yet; set by LeasedRateMiddleware).
META_NOT_BEFORE = "_leased_not_before"
#: ``time.monotonic()`` of the claim, set when its lane had nothing to enforce then.
META_FREE_SINCE = "_leased_free_since"
# The user's own key, ``leased_lane`` (a request's lane), is budget.META_LANE.
