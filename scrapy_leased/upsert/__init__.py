"""Idempotent item output: ``UpsertPipeline`` writes each item as one record keyed by
a stable key (Redis, SQLite or PostgreSQL), fenced by the claim token of the request
that produced it (noted by ``UpsertFenceMiddleware``). The add-on enables both."""

from ..settings import UpsertConfig
from .fence import UpsertFenceMiddleware
from .pipeline import UpsertPipeline
from .records import MissingKey
from .stores import StoreError

__all__ = ["MissingKey", "StoreError", "UpsertConfig", "UpsertFenceMiddleware",
           "UpsertPipeline"]
