"""The crawl as a whole, seen from outside the workers: snapshots of the fleet, the
warning signs read from them, and the operator's mutations (dead letters, seeding,
reset). Used by ``scrapy leased`` and by the workers' fleet log line; no Scrapy here."""

from .admin import DeadLetter, FleetAdmin, Lease, RequeueResult, parse_dead_letter
from .diagnose import Diagnosis, diagnose
from .snapshot import LaneState, Snapshot, WorkerState

__all__ = ["DeadLetter", "Diagnosis", "FleetAdmin", "LaneState", "Lease", "RequeueResult",
           "Snapshot", "WorkerState", "diagnose", "parse_dead_letter"]
