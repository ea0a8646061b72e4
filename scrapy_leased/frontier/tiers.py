"""The top tier of each lane as one caller last learnt it (lua/claim.lua): a claim
passes the LIST of the tier it knows, and a lane whose top tier is another is left by
that call (``stale``) and named with its tier in the reply."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .keys import tier_code, tier_rank
from .model import NewRequest, is_start

#: Lanes whose top tier a Frontier remembers (lua/claim.lua); past this many, the
#: oldest quarter is forgotten (a forgotten lane costs one call that learns it again)
TIER_CACHE_LANES = 65_536


class TierCache:
    """lane -> the code of its top tier other than p0, as last learnt; a lane without
    an entry has none as far as this caller knows."""

    def __init__(self, size: int = TIER_CACHE_LANES) -> None:
        self.size = size
        self._tiers: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._tiers)

    def get(self, lane: str) -> str:
        """The lane's top tier ('': none but p0 as far as known)."""
        return self._tiers.get(lane, "")

    def learn(self, lane: str, code: str) -> None:
        """The lane's top tier is ``code`` ('': none but p0)."""
        if not code:
            self._tiers.pop(lane, None)
            return
        if lane not in self._tiers and len(self._tiers) >= self.size:
            for old in list(self._tiers)[:self.size // 4]:
                del self._tiers[old]
        self._tiers[lane] = code

    def learn_all(self, tiers: Mapping[str, str]) -> None:
        for lane, code in tiers.items():
            self.learn(lane, code)

    def learn_pushes(self, enqueue: Sequence[NewRequest], queued: Sequence[bool]) -> None:
        """A request this caller queued in a tier that outranks the top tier it knows of
        its lane (or in a lane it knows no tier of) is its lane's top tier now, unless
        another caller queued a higher one (lua/claim.lua then names it)."""
        for r, q in zip(enqueue, queued):
            if q and (r.priority or is_start(r.order)):
                code = tier_code(r.priority, is_start(r.order))
                known = self._tiers.get(r.lane)
                if known is None or tier_rank(code) < tier_rank(known):
                    self.learn(r.lane, code)
