"""Scrapy's own tests, with and without scrapy_leased: what the add-on changes.

    python tests/scrapy_compat/run.py [--modes asyncio,none] [--files F ...] [-k EXPR]

1. Fetches the sdist of the installed Scrapy version (``pip download scrapy==<version>
   --no-binary :all: --no-deps``) into the cache (``$LEASED_COMPAT_CACHE``, default
   ``~/.cache/scrapy-leased-compat``) and unpacks its tests (not its ``scrapy`` package:
   the installed one is tested).
2. Makes a virtualenv in the cache with that Scrapy, this repository (editable) and what
   Scrapy's tests need (pytest-twisted, pytest-asyncio, ...); ``--in-place`` uses the
   current interpreter instead (installing what is missing).
3. Starts a private ``redis-server`` on a free port (tests/support/redis_server.py).
4. For each mode (``asyncio``: ``--reactor=asyncio -p no:asyncio``; ``none``:
   ``-p no:twisted --reactor=none``, Scrapy's tox flags), runs the test files once with
   Scrapy's defaults and once with ``leased_plugin.py`` (the add-on in Scrapy's default
   settings, a fresh ``LEASED_CRAWL_ID`` per crawler).
5. Prints, per mode, the tests that pass by default and not with the add-on. Those
   listed in ``allowlist.txt`` (next to this file, each with its reason; mirrored in
   docs/compatibility.md, which a test keeps complete) are expected; any other one makes
   the exit status 1. Allowed tests that pass now are reported (the list can shrink).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import venv
from dataclasses import dataclass
from importlib.metadata import version as dist_version
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

from tests.support.redis_server import RedisServer  # noqa: E402

FILES = [
    "tests/test_crawl.py",
    "tests/test_engine.py",
    "tests/test_engine_loop.py",
    "tests/test_closespider.py",
    "tests/test_engine_close_spider.py",
    "tests/test_request_attribute_binding.py",
    "tests/test_signals.py",
]
MODES = {
    "asyncio": ["--reactor=asyncio", "-p", "no:asyncio"],
    "none": ["-p", "no:twisted", "--reactor=none",
             "-o", "asyncio_default_fixture_loop_scope=function"],
}
# What the test files above need beyond Scrapy itself (from Scrapy's tox.ini).
TEST_DEPS = ["pytest>=8.4.1", "pytest-twisted>=1.14.3", "pytest-asyncio", "pytest-timeout",
             "attrs", "pexpect>=4.8.0", "psutil", "pygments"]
TEST_TIMEOUT_S = 120  # per test: a hang with the add-on is a failure, not a stuck CI


def log(msg: str) -> None:
    print(msg, flush=True)


def cache_dir() -> Path:
    base = os.environ.get("LEASED_COMPAT_CACHE") or Path.home() / ".cache" / "scrapy-leased-compat"
    path = Path(base)
    path.mkdir(parents=True, exist_ok=True)
    return path


def fetch_tests(cache: Path, scrapy_version: str) -> Path:
    """The unpacked sdist (without its scrapy package); downloaded once."""
    root = cache / f"scrapy-{scrapy_version}"
    if (root / ".complete").exists():
        return root
    sdist = cache / f"scrapy-{scrapy_version}.tar.gz"
    if not sdist.exists():
        log(f"Downloading the sdist of Scrapy {scrapy_version}")
        subprocess.run([sys.executable, "-m", "pip", "download", f"scrapy=={scrapy_version}",
                        "--no-binary", ":all:", "--no-deps", "-q", "-d", str(cache)], check=True)
    shutil.rmtree(root, ignore_errors=True)
    prefix = f"scrapy-{scrapy_version}/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)
                   and not m.name.startswith(prefix + "scrapy/") and (m.isfile() or m.isdir())]
        for m in members:
            m.name = m.name[len(prefix):]
        tar.extractall(root, members=members, filter="data")
    (root / ".complete").write_text("ok")
    return root


def prepare_python(cache: Path, scrapy_version: str, in_place: bool) -> str:
    if in_place:
        missing = [d for d in ("pytest_asyncio", "pytest_twisted", "pytest_timeout", "pexpect")
                   if subprocess.run([sys.executable, "-c", f"import {d}"],
                                     capture_output=True).returncode]
        if missing:
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", *TEST_DEPS], check=True)
        return sys.executable
    reqs = [f"scrapy=={scrapy_version}", *TEST_DEPS]
    # the repository's path too: the virtualenv holds it as an editable install, so one
    # made for another checkout would test that checkout's code
    stamp = hashlib.sha1(json.dumps([reqs, str(REPO), (REPO / "pyproject.toml").read_text()])
                         .encode()).hexdigest()
    env_dir = cache / f"venv-{scrapy_version}-py{sys.version_info[0]}{sys.version_info[1]}"
    python = env_dir / "bin" / "python"
    marker = env_dir / ".leased-compat"
    if not (marker.exists() and marker.read_text() == stamp and python.exists()):
        log(f"Preparing a virtualenv with Scrapy {scrapy_version} and the test dependencies "
            f"in {env_dir}")
        shutil.rmtree(env_dir, ignore_errors=True)
        venv.create(env_dir, with_pip=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *reqs, "-e", str(REPO)],
                       check=True)
        marker.write_text(stamp)
    return str(python)


@dataclass
class Run:
    outcomes: dict[str, str]
    details: dict[str, str]
    seconds: float
    returncode: int


def run_pytest(python: str, tests_root: Path, mode: str, leased: bool, files: list[str],
               extra: list[str], redis_url: str, out_dir: Path) -> Run:
    name = f"{mode}-{'leased' if leased else 'default'}"
    report = out_dir / f"{name}.json"
    log_path = out_dir / f"{name}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SCRAPY_", "LEASED_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(tests_root)])
    env["LEASED_COMPAT_REPORT"] = str(report)
    plugins = ["-p", "report_plugin"]
    if leased:
        env["LEASED_COMPAT_REDIS_URL"] = redis_url
        plugins += ["-p", "leased_plugin"]
    cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
           *plugins, *MODES[mode], f"--timeout={TEST_TIMEOUT_S}", *extra, *files]
    started = time.monotonic()
    with open(log_path, "wb") as out:
        rc = subprocess.run(cmd, cwd=tests_root, env=env, stdout=out,
                            stderr=subprocess.STDOUT).returncode
    seconds = time.monotonic() - started
    if not report.exists():
        raise SystemExit(f"pytest wrote no report ({name}, exit {rc}); see {log_path}:\n"
                         + "\n".join(log_path.read_text(errors="replace").splitlines()[-30:]))
    data = json.loads(report.read_text())
    return Run(data["outcomes"], data["details"], seconds, rc)


def read_allowlist(path: Path) -> dict[tuple[str, str], str]:
    """``mode[,mode] | test node id | reason`` per line; ``#`` starts a comment."""
    allowed: dict[tuple[str, str], str] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split("|", 2)]
        if len(parts) != 3 or not all(parts):
            raise SystemExit(f"{path}:{n}: expected 'modes | test id | reason': {line!r}")
        for mode in parts[0].split(","):
            if mode.strip() not in MODES:
                raise SystemExit(f"{path}:{n}: unknown mode {mode!r} (one of {', '.join(MODES)})")
            allowed[(mode.strip(), parts[1])] = parts[2]
    return allowed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default=",".join(MODES),
                        help="comma-separated: asyncio, none (default: both)")
    parser.add_argument("--files", nargs="*", default=FILES, help="Scrapy test files to run")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression (both runs)")
    parser.add_argument("--in-place", action="store_true",
                        help="run with this interpreter instead of a cached virtualenv")
    parser.add_argument("--leased-only", action="store_true",
                        help="skip the default runs (every test counts as passing by default)")
    parser.add_argument("--out", type=Path, help="directory for logs and reports "
                        "(default: <cache>/runs/<time>)")
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in MODES:
            parser.error(f"unknown mode {m!r}")
    scrapy_version = dist_version("scrapy")
    cache = cache_dir()
    tests_root = fetch_tests(cache, scrapy_version)
    python = prepare_python(cache, scrapy_version, args.in_place)
    out_dir = args.out or cache / "runs" / time.strftime("%Y%m%d-%H%M%S")
    out_dir.mkdir(parents=True, exist_ok=True)
    extra = ["-k", args.keyword] if args.keyword else []
    allowed = read_allowlist(HERE / "allowlist.txt")
    log(f"Scrapy {scrapy_version}: {len(args.files)} test files; logs in {out_dir}")
    unexpected_total = 0
    summary = []
    with RedisServer(appendonly=False) as redis_srv:
        for mode in modes:
            if args.leased_only:
                base = None
            else:
                base = run_pytest(python, tests_root, mode, False, args.files, extra,
                                  redis_srv.url, out_dir)
            leased = run_pytest(python, tests_root, mode, True, args.files, extra,
                                redis_srv.url, out_dir)
            passing = ({n for n, o in base.outcomes.items() if o == "passed"} if base
                       else set(leased.outcomes))
            regressions = sorted(n for n in passing if leased.outcomes.get(n) != "passed")
            unexpected = [n for n in regressions if (mode, n) not in allowed]
            fixed = sorted(n for (m, n) in allowed if m == mode and n in passing
                           and leased.outcomes.get(n) == "passed")
            unexpected_total += len(unexpected)
            base_text = (f"{len(passing)} pass by default ({base.seconds:.0f} s)" if base
                         else "default run skipped")
            log(f"\n== --reactor={mode}: {base_text}; with the add-on "
                f"{sum(o == 'passed' for o in leased.outcomes.values())} pass "
                f"({leased.seconds:.0f} s); {len(regressions)} regressions, "
                f"{len(regressions) - len(unexpected)} of them allowed")
            for n in regressions:
                tag = "allowed" if (mode, n) in allowed else "REGRESSION"
                outcome = leased.outcomes.get(n, "not run")
                log(f"  [{tag}] {n} ({outcome})")
                if (mode, n) in allowed:
                    log(f"      reason: {allowed[(mode, n)]}")
                elif leased.details.get(n):
                    log(f"      {leased.details[n]}")
            for n in fixed:
                log(f"  [passes now] {n}: on the allow-list, can be removed")
            summary.append((mode, len(passing), len(regressions), len(unexpected)))
    log("\nSummary:")
    for mode, n_pass, n_reg, n_unexp in summary:
        log(f"  --reactor={mode}: {n_pass} pass by default, {n_reg} regressions with the "
            f"add-on ({n_unexp} not on the allow-list)")
    return 1 if unexpected_total else 0


if __name__ == "__main__":
    sys.exit(main())
