"""One worker of the fleet: Scrapy's scheduler interface (``scheduler.py``, thin) and
the parts it delegates to, each with one job: the claim loop, the claims held, their
sizing, the lease keeper, the fleet's control state, seeding, the dupefilter, failures,
commit bookkeeping, the open sequence, and the engine hooks (``_engine.py``).

The other components of the add-on find the worker through ``scrapy_leased.runtime``
(``worker_of``), never by importing this package."""
