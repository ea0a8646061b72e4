"""The suite's reliability check (issue #15): run the README's test command on fresh
clones, one after another, each beside a running 2-worker crawl.

    python benchmarks/check_suite.py --runs 5 [--repo .] [--out DIR]

For each run: a fresh ``git clone`` of the repo's HEAD, a new virtualenv with
``pip install -e '.[test]'`` (the README's install), then ``python -m pytest -q`` (the
README's test command). Beside it, for the whole run, two ``scrapy crawl`` workers of
the test project crawl a site answering each page after 0.1 s (2,000,000 pages, so the
crawl outlasts the run) on their own redis-server on a free port (never the Redis on
6379). Prints one line per run (passed/failed counts, seconds) and stops at the first
failing run unless ``--keep-going``; exit status 1 if any run failed.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scrapy_leased.testing.process import SiteProcess  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402

SUMMARY_RE = re.compile(r"^=*\s*(.*\d+ (?:passed|failed).*?)\s*=*$", re.M)


def side_crawl(tmp: Path):
    srv = RedisServer(appendonly=False).start()
    site = SiteProcess(pages=2_000_000, log_path=tmp / "side-site.jsonl", delay=0.1).start()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    workers = []
    for i in (1, 2):
        log = open(tmp / f"side-w{i}.log", "w")
        workers.append(subprocess.Popen(
            [sys.executable, "-m", "scrapy", "crawl", "site",
             "-s", f"LEASED_REDIS_URL={srv.url}", "-s", "LEASED_CRAWL_ID=beside",
             "-s", "CONCURRENT_REQUESTS=16", "-s", "LOG_LEVEL=WARNING",
             "-a", f"worker=side{i}", "-a", f"start_url={site.url}/p/0"],
            cwd=REPO / "tests" / "project", env=env, stdout=log, stderr=subprocess.STDOUT))
    return srv, site, workers


def one_run(repo: Path, out: Path, k: int) -> tuple[bool, str, float]:
    run_dir = Path(tempfile.mkdtemp(prefix=f"beside-{k}-", dir=out))
    clone = run_dir / "clone"
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
    venv = run_dir / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    subprocess.run([py, "-m", "pip", "install", "-q", "-e", ".[test]"], cwd=clone, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    srv, site, workers = side_crawl(run_dir)
    try:
        t0 = time.monotonic()
        with open(run_dir / "pytest.log", "w") as log:
            rc = subprocess.run([py, "-m", "pytest", "-q"], cwd=clone, stdout=log,
                                stderr=subprocess.STDOUT).returncode
        seconds = time.monotonic() - t0
        alive = [w.poll() is None for w in workers]
    finally:
        for w in workers:
            w.kill()
            w.wait()
        side_pages = len(site.entries())
        site.stop()
        srv.close()
    text = (run_dir / "pytest.log").read_text(errors="replace")
    found = SUMMARY_RE.findall(text)
    summary = found[-1] if found else f"rc={rc}"
    ok = rc == 0 and all(alive)
    return ok, (f"{summary}; side crawl: {side_pages} pages, workers alive to the end: "
                f"{all(alive)}; log {run_dir / 'pytest.log'}"), seconds


def main() -> int:
    # SIGTERM ends the check like Ctrl-C: the side crawl's workers are killed on the way out
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--repo", type=Path, default=REPO)
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()))
    ap.add_argument("--keep-going", action="store_true")
    a = ap.parse_args()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=a.repo, text=True,
                          capture_output=True).stdout.strip()
    failed = 0
    for k in range(1, a.runs + 1):
        ok, line, seconds = one_run(a.repo, a.out, k)
        print(f"run {k}/{a.runs} of {head}: {'ok' if ok else 'FAILED'} in {seconds:.0f} s: {line}",
              flush=True)
        if not ok:
            failed += 1
            if not a.keep_going:
                break
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
