"""A worker that cannot start says why in one line and exits 1 (#25 item 8): an
unreachable Redis and a bad setting, under ``scrapy crawl`` in both reactor modes. No
traceback, no "Task exception was never retrieved". Real ``scrapy crawl`` processes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.redis_server import free_port

pytestmark = pytest.mark.integration  # scrapy processes

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


# -- the same bad setting under `scrapy leased` ---------------------------------------


def leased(*args: str, cwd: Path = PROJECT) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCRAPY_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "scrapy", "leased", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def crawl_in(project: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCRAPY_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "scrapy", "crawl", "site", "-a",
                           "start_url=http://127.0.0.1:1/"], cwd=project, env=env,
                          capture_output=True, text=True, timeout=120)


def critical_message(result: subprocess.CompletedProcess[str]) -> str:
    """The message of `scrapy crawl`'s one CRITICAL line (exit status 1, no traceback)."""
    assert result.returncode == 1, (result.returncode, result.stderr[-3000:])
    critical = [line for line in result.stderr.splitlines() if "CRITICAL" in line]
    assert len(critical) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    return critical[0].split(" CRITICAL: ", 1)[1]


def error_message(result: subprocess.CompletedProcess[str]) -> str:
    """The message of `scrapy leased`'s one error line: exit status 1, nothing else on
    stderr (no traceback), nothing on stdout."""
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert not result.stdout, result.stdout
    return lines[0][len("Error: "):]


#: a subcommand of each kind: reading (status, dead), writing (seed), serving (dashboard)
SUBCOMMANDS = (["status", "c"], ["dead", "c"], ["seed", "c", "http://example.com/"],
               ["dashboard", "c", "--port", "0"])


@pytest.mark.parametrize("setting", ["LEASED_RATE=abc", "LEASED_RATE_BURST=abc",
                                     "LEASED_LEASE_SECONDS=-1", "LEASED_RATES={\"a\": \"x\"}"])
def test_a_bad_setting_is_the_crawls_one_line_under_scrapy_leased(setting: str) -> None:
    """#25 item 8: `scrapy leased` names a bad setting in one line on stderr, exit status
    1, no traceback: the same message `scrapy crawl` gives in its CRITICAL line, before
    reaching Redis (the URL given is unreachable). LEASED_RATE_BURST was ignored by both
    without LEASED_RATE, and named "burst of LEASED_RATE" with it."""
    name = setting.split("=")[0]
    expected = critical_message(crawl(setting, f"LEASED_REDIS_URL=redis://127.0.0.1:{free_port()}"))
    assert name in expected, expected
    url = f"redis://127.0.0.1:{free_port()}/0"
    for sub in SUBCOMMANDS:
        assert error_message(leased(*sub, "--redis-url", url, "-s", setting)) == expected, sub


def project_copy(tmp_path: Path, more_settings: str) -> Path:
    """The test project, copied, with lines added to its settings.py."""
    project = tmp_path / "project"
    shutil.copytree(PROJECT, project, ignore=shutil.ignore_patterns(".scrapy", "__pycache__"))
    settings = project / "testproject" / "settings.py"
    settings.write_text(settings.read_text() + "\n" + more_settings)
    return project


def test_a_bad_setting_in_settings_py_is_the_crawls_one_line_too(tmp_path: Path) -> None:
    """The same for a bad LEASED_RATE in the project's settings.py (the test project,
    copied): `scrapy crawl` and every `scrapy leased` subcommand, embedded included."""
    project = project_copy(tmp_path, f'LEASED_RATE = "abc"\n'
                                     f'LEASED_REDIS_URL = "redis://127.0.0.1:{free_port()}/0"\n')
    expected = critical_message(crawl_in(project))
    assert "LEASED_RATE ('abc')" in expected, expected
    for sub in (*SUBCOMMANDS, ["embedded", "status"]):
        assert error_message(leased(*sub, cwd=project)) == expected, sub
    assert not (project / ".scrapy").exists()  # no embedded Redis started on the way


def test_bad_scrapy_settings_a_command_reads_are_one_line(tmp_path: Path) -> None:
    """Scrapy's own settings that `scrapy leased` reads: CONCURRENT_REQUESTS (status, the
    dashboard: a worker's capacity) and REQUEST_FINGERPRINTER_CLASS (seed, forget) were a
    traceback, the latter after reaching Redis (and `seed` started the embedded Redis
    first). Now one line, before Redis is reached or started. (`scrapy crawl` itself
    reports a bad CONCURRENT_REQUESTS with Scrapy's traceback, with or without the
    add-on.)"""
    url = f"redis://127.0.0.1:{free_port()}/0"  # unreachable: the error comes first
    for sub in (["status", "c"], ["dashboard", "c", "--port", "0"]):
        for value, words in (("abc", "must be an integer"), ("0", "must be at least 1")):
            line = error_message(leased(*sub, "--redis-url", url, "-s",
                                        f"CONCURRENT_REQUESTS={value}"))
            assert line.startswith(f"CONCURRENT_REQUESTS ('{value}') {words}"), line
    for sub in ("seed", "forget"):
        line = error_message(leased(sub, "c", "http://example.com/x", "--redis-url", url, "-s",
                                    "REQUEST_FINGERPRINTER_CLASS=no.Such"))
        assert line.startswith("REQUEST_FINGERPRINTER_CLASS ('no.Such') cannot be loaded"), line
    project = project_copy(tmp_path, 'REQUEST_FINGERPRINTER_CLASS = "no.Such"\n')
    line = error_message(leased("seed", "c", "http://example.com/", cwd=project))
    assert line.startswith("REQUEST_FINGERPRINTER_CLASS ('no.Such')"), line
    assert not (project / ".scrapy").exists()  # no embedded Redis started for it
