"""One row of a Markdown table, as the benchmarks write their results."""

from __future__ import annotations


def row(*cells: object) -> str:
    """``| a | b |``: the cells, each as its ``str()``."""
    return "| " + " | ".join(str(c) for c in cells) + " |"
