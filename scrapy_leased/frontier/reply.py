"""Reading a script's flat reply front to back, field by field, in the order of the
``Returns`` line of its header: each call names its fields once, in one parse."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .keys import CrawlKeys
from .scripts import as_str, header_keys


def fixed_keys(script: str, keys: CrawlKeys) -> list[str]:
    """A script's fixed KEYS (named in its header, scripts.header_keys) of one crawl."""
    return [getattr(keys, name) for name in header_keys(script)]


class Reader:
    """A flat reply, read in order."""

    def __init__(self, out: Sequence[Any]) -> None:
        self.out = out
        self.at = 0

    def take(self, n: int = 1) -> list[Any]:
        """The next ``n`` items."""
        got = list(self.out[self.at:self.at + n])
        if len(got) != n:
            raise ValueError(f"reply too short: {n} items wanted at {self.at} of "
                             f"{len(self.out)}")
        self.at += n
        return got

    def number(self) -> int:
        return int(self.take()[0])

    def text(self) -> str:
        return as_str(self.take()[0])

    def counted(self, width: int = 1) -> list[Any]:
        """A count n, then n groups of ``width`` items: the items."""
        return self.take(self.number() * width)

    def rest(self) -> list[Any]:
        got = list(self.out[self.at:])
        self.at = len(self.out)
        return got

