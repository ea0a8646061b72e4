"""A worker that cannot start says why in one line and exits 1 (#25 item 8): an
unreachable Redis and a bad setting, under ``scrapy crawl`` in both reactor modes. No
traceback, no "Task exception was never retrieved". Real ``scrapy crawl`` processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.redis_server import free_port

REPO = Path(__file__).resolve().parents[1]
PROJECT = REPO / "tests" / "project"


def crawl(*settings: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCRAPY_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    args = [sys.executable, "-m", "scrapy", "crawl", "site", "-a",
            "start_url=http://127.0.0.1:1/"]
    for s in settings:
        args += ["-s", s]
    return subprocess.run(args, cwd=PROJECT, env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("reactor", ["asyncio", "none"])
@pytest.mark.parametrize("case", ["unreachable", "bad_rate"])
def test_a_worker_that_cannot_start_says_why_in_one_line(case: str, reactor: str) -> None:
    mode = [] if reactor == "asyncio" else ["TWISTED_REACTOR_ENABLED=False"]
    if case == "unreachable":
        result = crawl(f"LEASED_REDIS_URL=redis://127.0.0.1:{free_port()}",
                       "LEASED_CONNECT_TIMEOUT=1", *mode)
        words = ["cannot reach Redis", "LEASED_REDIS_URL"]
    else:
        result = crawl("LEASED_RATE=abc", *mode)
        words = ["LEASED_RATE", "'abc'"]
    assert result.returncode == 1, (result.returncode, result.stderr[-3000:])
    critical = [line for line in result.stderr.splitlines() if "CRITICAL" in line]
    assert len(critical) == 1, result.stderr[-3000:]
    assert all(w in critical[0] for w in words), critical
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "never retrieved" not in result.stderr, result.stderr[-3000:]
