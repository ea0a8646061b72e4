"""Instructions a worker runs per page, against plain Scrapy's, counted by callgrind.

    python benchmarks/bench_worker_instructions.py [--modes plain,leased_defaults]
                                                   [--pages 200,700]

Seconds on this kind of machine drift by 10 % and more between runs; instructions do
not: ``valgrind --tool=callgrind`` counts what a process runs, whatever else the machine
does. Each mode crawls the CPU-bound test site (``bench_e2e.run``: one worker, its own
private redis-server) twice under callgrind, a site of 200 pages and one of 700; the
difference of the two totals over the 500 pages between them is the cost of a page,
start-up and shutdown cancelled out. Under valgrind the worker runs about 50 times
slower, so what depends on timing (how many pages a claim or a commit carries) is not
what it is at full speed; the work per page is. Two crawls run at once (2 cores).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

import bench_e2e  # noqa: E402

from tests.support.redis_server import RedisServer  # noqa: E402

TOTAL_RE = re.compile(r"^(?:summary|totals): (\d+)", re.M)
#: The controls of LEASED_GC_FREEZE: plain Scrapy doing the same gc.freeze() (the bench
#: project's GcFreeze extension), and the add-on without it
PLAIN_FROZEN = "plain:BENCH_GC_FREEZE=1"
LEASED_UNFROZEN = "leased_defaults:LEASED_GC_FREEZE=False"


def split_mode(spec: str) -> tuple[str, dict[str, str]]:
    """``mode[:NAME=VALUE...]`` (e.g. ``plain:BENCH_GC_FREEZE=1``,
    ``leased_defaults:LEASED_GC_FREEZE=False``): the bench_e2e mode and the settings
    given to its worker with -s."""
    mode, *pairs = spec.split(":")
    return mode, bench_e2e.parse_settings(pairs)


def instructions(spec: str, pages: int, workdir: Path) -> int:
    """Instructions of one worker's whole crawl of a ``pages``-page site (``spec``:
    split_mode)."""
    mode, settings = split_mode(spec)
    out = workdir / f"callgrind-{abs(hash(spec))}-{pages}.out"
    redis = RedisServer(appendonly=False).start() if mode != "plain" else None
    try:
        result = bench_e2e.run(mode, 1, pages, redis, workdir, timeout=3600.0,
                               settings=settings, prefix=["valgrind", "--tool=callgrind",
                                       f"--callgrind-out-file={out}"])
    finally:
        if redis is not None:
            redis.close()
    if "error" in result or result["site"]["distinct"] != pages:
        raise RuntimeError(f"{spec} crawl of {pages} pages: {result.get('error')}")
    found = TOTAL_RE.search(out.read_text(errors="replace"))
    if found is None:
        raise RuntimeError(f"no total in {out}")
    return int(found.group(1))


def run(modes: list[str], small: int = 200, large: int = 700) -> dict[str, Any]:
    """{mode: {small, large, per_1000}}: instructions per 1,000 pages per mode."""
    workdir = Path(tempfile.mkdtemp(prefix="leased-instr-"))
    jobs = [(mode, pages) for mode in modes for pages in (small, large)]
    try:
        with ThreadPoolExecutor(2) as pool:
            counts = list(pool.map(lambda job: instructions(job[0], job[1], workdir), jobs))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    got = dict(zip(jobs, counts))
    return {mode: {"small": got[(mode, small)], "large": got[(mode, large)],
                   "per_1000": (got[(mode, large)] - got[(mode, small)]) * 1000
                   / (large - small)} for mode in modes}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modes", default="plain,leased_defaults",
                    help="bench_e2e modes, each with settings of its own if any: "
                    "mode[:NAME=VALUE...] (split_mode)")
    ap.add_argument("--pages", default="200,700", help="the two site sizes")
    ns = ap.parse_args()
    small, large = (int(x) for x in ns.pages.split(","))
    print(json.dumps(run(ns.modes.split(","), small, large), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
