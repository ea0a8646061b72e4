"""A request as the frontier stores it in Redis (lua/lib_envelope.lua builds it)."""

from __future__ import annotations

from dataclasses import dataclass

from .scripts import as_str


@dataclass(frozen=True)
class Envelope:
    """A request as stored: ``<rid>|<attempts>|<expiries>|<priority>|<lane>|<payload>``
    (built by lua/lib_envelope.lua)."""

    rid: int
    attempts: int
    expiries: int
    priority: int
    lane: str
    payload: str

    @classmethod
    def parse(cls, raw: str | bytes) -> Envelope:
        rid, attempts, expiries, priority, lane, payload = as_str(raw).split("|", 5)
        return cls(int(rid), int(attempts), int(expiries), int(priority), lane, payload)
