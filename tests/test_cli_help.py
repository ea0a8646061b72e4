"""``scrapy leased --help`` reads as a help page at any terminal width (#25 item 8).

Scrapy's help formatter takes every help line that ends with ``:`` for a section heading
(it title-cases it and underlines it), so a help text wrapped after a colon printed a row
of ``=====`` in the middle of an option. No Redis is needed: the help is printed before
the command connects to anything."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1] / "example_project"
HEADINGS = {"Usage", "Options", "Global Options", "Scrapy Leased"}
#: Options of one subcommand, each shown in the usage lines of that subcommand
SUBCOMMAND_OPTIONS = ["--json", "--sample", "--watch", "--interval", "--limit", "--requeue",
                      "--purge", "--yes", "--records", "--all-crawls", "--bind", "--port",
                      "--allow-writes"]


def help_text(columns: int) -> str:
    env = {**os.environ, "COLUMNS": str(columns)}
    result = subprocess.run([sys.executable, "-m", "scrapy", "leased", "--help"], cwd=PROJECT,
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def headings(lines: list[str]) -> list[str]:
    return [lines[i - 1].strip() for i, line in enumerate(lines)
            if i and re.fullmatch(r"[=-]{3,}", line.strip())]


@pytest.mark.parametrize("columns", [64, 80, 100, 132, 200])
def test_help_has_only_its_own_headings(columns: int) -> None:
    assert set(headings(help_text(columns).splitlines())) == HEADINGS


@pytest.mark.parametrize("columns", [40, 50])
def test_the_add_ons_options_stay_readable_on_a_narrow_terminal(columns: int) -> None:
    """Below 64 columns Scrapy's own ``--loglevel`` help wraps after ``(default:`` and is
    taken for a heading (Scrapy's formatter); the add-on's own options never are."""
    lines = help_text(columns).splitlines()
    ours = lines[lines.index("Scrapy Leased"):]
    assert headings(ours) == ["Scrapy Leased"], headings(ours)


def test_usage_lines_name_every_option_of_a_subcommand() -> None:
    text = help_text(200)
    usage = text[:text.index("Watch and run")]
    missing = [opt for opt in SUBCOMMAND_OPTIONS if opt not in usage]
    assert not missing, missing


def test_no_maintenance_notification_flood_at_debug(redis_server) -> None:
    """#25 item 8: redis-py's DEBUG line on each connection to a Redis without
    maintenance notifications (Redis 7 here) is not in a worker's log; other redis-py
    DEBUG lines still are."""
    import asyncio
    import logging

    from scrapy_leased.connection import make_client

    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = Keep(level=logging.DEBUG)
    root = logging.getLogger()
    old = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        async def use() -> None:
            client = make_client(redis_server.url)
            try:
                await asyncio.gather(*(client.blpop(["nothing"], 0.05) for _ in range(5)))
            finally:
                await client.aclose()
        asyncio.run(use())
    finally:
        root.removeHandler(handler)
        root.setLevel(old)
    assert not [m for m in seen if "maintenance notifications" in m], seen
