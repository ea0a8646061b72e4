"""The demo (example_project/demo.py), run exactly as a newcomer runs it: a fleet surviving
a kill -9. The 5,000-page test site, three ``scrapy crawl`` workers, one killed with kill -9 and
restarted, a shared per-host rate budget, and the embedded Redis (no LEASED_REDIS_URL).
Takes about half a minute."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scrapy_leased._redis.embedded import stop_embedded_redis

pytestmark = pytest.mark.integration  # the demo: a site, workers, Redis

REPO = Path(__file__).resolve().parents[1]


def test_demo_run(tmp_path: Path, crawl_id: str) -> None:
    data_dir = tmp_path / "redis"
    report_path = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SCRAPY_") and k != "LEASED_REDIS_URL"}
    cmd = [sys.executable, str(REPO / "example_project" / "demo.py"),
           "--crawl-id", crawl_id, "--embedded-dir", str(data_dir),
           "--out", str(tmp_path / "run"), "--report", str(report_path)]
    try:
        res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                             timeout=600)
    finally:
        stop_embedded_redis(data_dir)  # already stopped by the demo, unless it failed
    out = res.stdout + res.stderr
    print(out)  # the live progress and the report, in the test's captured output
    assert res.returncode == 0, out[-6000:]
    assert "Redis: embedded" in out and "started" in out

    report = json.loads(report_path.read_text())
    assert report["done"] == 5000
    assert "[OK  ] done == 5,000: done is 5,000" in res.stdout
    assert report["pages_fetched"] == 5000 and report["dead"] == 0
    assert report["ok"] and all(report["checks"].values()), report["checks"]

    killed = report["killed"]
    assert killed["worker"] == "w2" and killed["leases"] >= 1
    assert report["recovered_total"] == killed["leases"] == len(report["returned"])
    for x in report["returned"]:
        assert x["recovered"] >= x["deadline"], x  # requeued only once its lease expired
        assert any(f["t"] >= x["deadline"] and f["worker"] != "w2" for f in x["fetches"]), x
    assert set(report["fetched_twice"]) <= {x["url"] for x in report["returned"]}
    budget = report["budget"]
    assert budget["rate"] == "100/s"
    assert len(report["rates"]) == (3 if sys.platform.startswith("linux") else 1)
    for host, x in report["rates"].items():
        assert x["unstamped"] == 0, (host, x)  # every request's budget time reached the site
        assert x["max_taken_in_window"] <= budget["allowed_in_window"], (host, x)
