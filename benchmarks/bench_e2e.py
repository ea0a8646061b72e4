"""End-to-end crawl of the local test site: pages/s, duplicates, misses, Redis round trips.

    python benchmarks/bench_e2e.py --mode plain|scrapy_redis|leased [--workers 2]
                                   [--pages 5000] [--scripts]

One run: a fresh test site (``scrapy_leased/testing/site.py`` as a subprocess, with
TCP_NODELAY: see its ``--nodelay``; every request logged), an emptied private redis-server with
its statistics reset (``FLUSHALL``, ``CONFIG RESETSTAT``), then ``--workers``
``scrapy crawl site`` processes of ``benchmarks/project`` started at once, each left to
end by itself. ``benchmarks/run_all.py`` calls :func:`run` and repeats it.

From the site's log: pages served, distinct pages, duplicates (served more than once),
misses (never served), and the crawl's span (first to last request served).
pages/s = distinct pages / span: start-up of the Python processes and scrapy-redis's
idle timeout at the end are outside it (the wall time, launch to last exit, is kept too).

Round trips: ``INFO commandstats`` after the run (statistics reset before it) counts
every command Redis executed, including the ones a Lua script runs with
``redis.call``, each under its own name. The commands the clients SENT are EVALSHA,
EVAL and SCRIPT plus every other command *no script of scrapy_leased calls* (the names
are read from ``scrapy_leased/**/lua/*.lua``); commands whose name a script calls are
counted as run inside scripts. With no EVAL/EVALSHA at all (scrapy-redis) every command
was sent by a client. The harness's CONFIG RESETSTAT and INFO cpu are left out (its
final INFO is not in its own output). A MULTI/EXEC
transaction is several commands but one round trip: ``round trips`` counts
MULTI ... EXEC as one (EXEC alone), commands queued in it excluded. Cross-check: each
worker also counts the requests its redis-py connections wrote to the socket
(``benchproject/extensions.py``), which is the round-trip count seen from the client.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

from scrapy_leased.testing.process import SiteProcess  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402

PROJECT = REPO_ROOT / "benchmarks" / "project"
PACKAGE_DIR = REPO_ROOT / "scrapy_leased"  # each part's scripts in its lua/
SCRIPT_CALLERS = {"evalsha", "eval", "evalsha_ro", "eval_ro", "script", "fcall", "fcall_ro"}
_CALL_RE = re.compile(r"(?:redis\.p?call\(|batch_call\(|pcall\(redis\.call,)\s*'([A-Za-z]+)'")


def script_command_names() -> set[str]:
    """Every command name a scrapy_leased Lua script calls."""
    names: set[str] = set()
    for path in PACKAGE_DIR.rglob("*.lua"):
        names.update(m.lower() for m in _CALL_RE.findall(path.read_text(encoding="utf-8")))
    return names


def commandstats(client) -> dict[str, int]:
    info = client.info("commandstats")
    out = {}
    for key, value in info.items():
        name = key[len("cmdstat_"):] if key.startswith("cmdstat_") else key
        out[name.replace("|", " ")] = int(value["calls"])
    return out


def split_commands(calls: dict[str, int], in_scripts: set[str]) -> dict[str, Any]:
    """Commands sent by clients vs run inside scripts; round trips (MULTI..EXEC = 1)."""
    calls = dict(calls)
    calls.pop("config resetstat", None)  # the harness's, before the run
    calls["info"] = calls.get("info", 0) - 1  # the harness's INFO cpu, after the reset
    scripts_used = sum(v for k, v in calls.items() if k in SCRIPT_CALLERS)
    sent: dict[str, int] = {}
    inside: dict[str, int] = {}
    for name, n in calls.items():
        if n <= 0:
            continue
        base = name.split(" ")[0]
        if scripts_used and base not in SCRIPT_CALLERS and base in in_scripts:
            inside[name] = n
        else:
            sent[name] = n
    total_sent = sum(sent.values())
    multi = sent.get("multi", 0)
    # commands queued between MULTI and EXEC are sent in the same write as EXEC;
    # only transactions of known shape are seen here (scrapy-redis's pop:
    # MULTI ZRANGE ZREMRANGEBYRANK EXEC; scrapy_leased's counts(): MULTI + 6 + EXEC)
    queued = 0
    if multi:
        queued = sum(n for k, n in sent.items() if k in ("zrange", "zremrangebyrank")) \
            if not scripts_used else 0
    round_trips = total_sent - multi - queued
    return {"sent": total_sent, "inside_scripts": sum(inside.values()),
            "round_trips": round_trips, "sent_by_command": sent, "inside_by_command": inside}


def redis_cpu(client) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of a running process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def system_busy() -> float:
    """CPU seconds every process of the machine has used so far (/proc/stat)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def site_summary(entries: list[dict], pages: int) -> dict[str, Any]:
    paths = [e["path"].split("?", 1)[0] for e in entries if e["path"].startswith("/p/")]
    counts = Counter(paths)
    valid = {f"/p/{i}" for i in range(pages)}
    distinct = len(set(counts) & valid)
    ts = [e["t"] for e in entries if e["path"].startswith("/p/")]
    span = (max(ts) - min(ts)) if ts else 0.0
    # time-averaged requests being answered (sites that log when a request arrived, t0)
    busy = sum(e["t"] - e["t0"] for e in entries if e["path"].startswith("/p/") and e.get("t0"))
    # TCP connections the crawl opened to the site: one client port each (a closed
    # connection's port stays in TIME_WAIT on the client far longer than a run)
    ports = {e["client_port"] for e in entries if "client_port" in e}
    return {"served": len(paths), "distinct": distinct, "connections": len(ports),
            "inflight": busy / span if span and busy else None,
            "duplicates": sum(n - 1 for n in counts.values() if n > 1),
            "misses": pages - distinct, "span": span, "first": min(ts) if ts else None,
            "last": max(ts) if ts else None,
            "errors": sum(1 for e in entries if e["status"] != 200)}


PROFILE_FUNCTIONS = [
    ("LeasedScheduler.enqueue_request", "enqueue_request (fingerprint, encode, lane)"),
    ("LeasedDupeFilter.seen_key", "  of which the fingerprint (seen_key)"),
    ("encode_request", "  of which encode_request (JSON)"),
    ("CommitWriter._run", "CommitWriter (commit.lua calls)"),
    ("ClaimLoop.run", "claim loop (claim.lua calls)"),
    ("decode_request", "  of which decode_request"),
    ("LeasedRateMiddleware.process_request", "rate middleware (acquire.lua per request)"),
    ("LeaseKeeper.renew_loop", "renew loop"),
    ("LeaseKeeper.sweep_loop", "sweep loop"),
]
_FRAME_RE = re.compile(r"^(.*) \((.*?):\d+\)$")


def summarize_profile(path: str) -> dict[str, Any]:
    """Shares of a py-spy collapsed-stack profile (samples of a running thread):
    inclusive % per package and for scrapy_leased's hot functions."""
    total = 0
    pkg: Counter = Counter()
    func: Counter = Counter()
    for line in Path(path).read_text().splitlines():
        stack, _, n_s = line.rpartition(" ")
        if not stack:
            continue
        n = int(n_s)
        total += n
        files, names = set(), set()
        for frame in stack.split(";"):
            m = _FRAME_RE.match(frame)
            if not m:
                continue
            name, file = m.group(1), m.group(2)
            if file.startswith("scrapy_leased/"):
                if name == "<module>":
                    continue  # importing the package (also the `scrapy leased` command)
                names.add(name)
            files.add(file.split("/")[0])
        for f in files:
            pkg[f] += n
        for name in names:
            func[name] += n
    share = {k: 100.0 * v / total for k, v in pkg.items()} if total else {}
    return {"samples": total,
            "packages": {k: share.get(k, 0.0) for k in ("scrapy_leased", "redis", "scrapy",
                                                          "twisted", "parsel", "w3lib")},
            "functions": {label: 100.0 * func.get(name, 0) / total if total else 0.0
                          for name, label in PROFILE_FUNCTIONS}}


MODES = ("plain", "scrapy_redis", "leased", "leased_defaults")


def py_spy() -> str:
    """py-spy on PATH, else the one installed beside this Python (a venv not activated)."""
    return shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")


def is_leased(mode: str) -> bool:
    return mode.startswith("leased")


def parse_settings(pairs: Iterable[str]) -> dict[str, str]:
    """``NAME=VALUE`` strings as the settings dict run() passes to its workers with -s."""
    return dict(pair.split("=", 1) for pair in pairs)


def worker_command(mode: str, start_url: str, redis_url: str | None, crawl_id: str,
                   report: Path, settings: dict[str, Any] | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "scrapy", "crawl", "site", "-a", f"start_url={start_url}",
           "-s", f"BENCH_REPORT={report}"]
    if is_leased(mode):
        cmd += ["-s", f"LEASED_REDIS_URL={redis_url}", "-s", f"LEASED_CRAWL_ID={crawl_id}"]
    elif mode == "scrapy_redis":
        cmd += ["-s", f"REDIS_URL={redis_url}"]
    for name, value in (settings or {}).items():
        cmd += ["-s", f"{name}={value}"]
    return cmd


def run(mode: str, workers: int, pages: int, redis: RedisServer | None, workdir: Path,
        timeout: float = 900.0, profile: str | None = None,
        nodelay: bool = True, make_site: Callable[[Path], Any] | None = None,
        settings: dict[str, Any] | None = None,
        prefix: list[str] | None = None) -> dict[str, Any]:
    """One crawl; returns the site summary, worker reports and Redis commands.

    ``plain`` with several workers is a control: that many independent plain Scrapy
    crawls at once, each of its own copy of the site (nothing shared).
    ``make_site(log_path)`` returns a started site (default: the test site of
    ``pages`` pages, ``SiteProcess``); ``settings`` are passed to every worker with -s;
    ``prefix`` goes before every worker's command (``bench_worker_instructions.py``:
    valgrind)."""
    run_id = uuid.uuid4().hex[:8]
    rundir = workdir / f"{mode}-{workers}-{run_id}"
    rundir.mkdir(parents=True)
    nsites = workers if mode == "plain" else 1
    if make_site is None:
        def make_site(log_path: Path) -> Any:
            return SiteProcess(pages=pages, log_path=log_path, nodelay=nodelay).start()
    sites = []
    client = None
    try:
        for k in range(nsites):
            sites.append(make_site(rundir / f"site{k}.jsonl"))
        if redis is not None and mode != "plain":
            client = redis.client()
            client.flushall()
            client.config_resetstat()
            redis_cpu0 = redis_cpu(client)
        site_cpu0 = sum(proc_cpu(site.proc.pid) for site in sites)
        env = {k: v for k, v in os.environ.items() if not k.startswith("SCRAPY_")}
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env["BENCH_MODE"] = mode
        procs = []
        logs = []
        busy0 = system_busy()
        t0 = time.time()
        for k in range(workers):
            report = rundir / f"w{k}.json"
            cmd = worker_command(mode, sites[k % nsites].url + "/p/0",
                                 redis.url if redis else None,
                                 f"bench-{run_id}", report, settings)
            if prefix:
                cmd = list(prefix) + cmd
            if profile and k == 0:
                cmd = [py_spy(), "record", "-r", "200", "-f", "raw", "-o", profile, "--"] + cmd
            log = open(rundir / f"w{k}.log", "wb")
            logs.append(log)
            procs.append(subprocess.Popen(cmd, cwd=str(PROJECT), env=env, stdout=log,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        codes = []
        deadline = time.monotonic() + timeout
        for p in procs:
            try:
                codes.append(p.wait(max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append(p.wait())
        wall = time.time() - t0
        busy = system_busy() - busy0
        for log in logs:
            log.close()
        calls = commandstats(client) if client is not None else {}
        cpu = {"site": sum(proc_cpu(site.proc.pid) for site in sites) - site_cpu0}
        if client is not None:
            cpu["redis"] = redis_cpu(client) - redis_cpu0
    finally:
        for site in sites:
            site.stop()
        if client is not None:
            client.close()
    per_site = [site_summary(site.entries(), pages) for site in sites]
    summary = {k: sum(x[k] for x in per_site)
               for k in ("served", "distinct", "duplicates", "misses", "errors", "connections")}
    summary["span"] = max(x["span"] for x in per_site)
    summary["first"] = min((x["first"] for x in per_site if x["first"]), default=None)
    summary["last"] = max((x["last"] for x in per_site if x["last"]), default=None)
    infl = [x["inflight"] for x in per_site if x["inflight"]]
    summary["inflight"] = sum(infl) if infl else None  # all sites together
    pages_per_s = sum(x["distinct"] / x["span"] for x in per_site if x["span"])
    reports = []
    for k in range(workers):
        path = rundir / f"w{k}.json"
        reports.append(json.loads(path.read_text()) if path.exists() else None)
    result: dict[str, Any] = {
        "mode": mode, "workers": workers, "pages": pages, "exit_codes": codes, "wall": wall,
        "site": summary,
        "pages_per_s": pages_per_s,
        "reasons": [r["reason"] if r else None for r in reports],
        "redis_sends": sum(r["redis_sends"] for r in reports if r),
        "worker_reports": reports,
        "startup": [(r["opened"] - t0) if r else None for r in reports],
        "crawl_window": (max(r["closed"] for r in reports if r)
                         - min(r["opened"] for r in reports if r)) if any(reports) else 0.0,
        "cpu": {**cpu, "workers": sum(r["cpu_s"] for r in reports if r),
                "workers_crawl": sum(r["crawl_cpu_s"] for r in reports if r),
                "machine": busy},
    }
    # CPU that processes other than this run's used meanwhile (other users' load)
    result["cpu"]["others"] = max(0.0, busy - result["cpu"]["workers"] - cpu.get("redis", 0.0)
                                  - cpu["site"])
    if calls:
        result["commands"] = split_commands(calls, script_command_names())
    bad = [k for k, (c, r) in enumerate(zip(codes, result["reasons"])) if c != 0 or r != "finished"]
    if bad:
        tails = "\n".join(f"--- worker {k}: exit {codes[k]}\n"
                          + (rundir / f"w{k}.log").read_text(errors="replace")[-3000:]
                          for k in bad)
        result["error"] = f"workers {bad} did not end by themselves with 'finished'\n{tails}"
    else:
        shutil.rmtree(rundir, ignore_errors=True)
    return result


def script_times(client: Any, pages: int) -> dict[str, Any]:
    """Redis time of each script per page, from SLOWLOG (every call recorded: see
    ``--scripts``): calls per page, µs per page and median µs per call, by script name
    (the frontier's; another package's script by its SHA)."""
    import statistics

    from bench_frontier import script_shas

    names = {sha: name for name, sha in script_shas().items()}
    times: dict[str, list[int]] = {}
    for entry in client.slowlog_get(SLOWLOG_MAX):
        command = entry["command"].split()
        if command[0].lower() != b"evalsha":
            continue
        sha = command[1].decode()
        times.setdefault(names.get(sha, f"script {sha[:8]}"), []).append(entry["duration"])
    return {name: {"calls_per_page": len(us) / pages, "us_per_page": sum(us) / pages,
                   "median_us": statistics.median(us)}
            for name, us in sorted(times.items(), key=lambda kv: -sum(kv[1]))}


SLOWLOG_MAX = 1_000_000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", required=True, choices=MODES)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--pages", type=int, default=5000)
    ap.add_argument("--profile", default=None,
                    help="py-spy raw (collapsed) profile of worker 0 to this file")
    ap.add_argument("--stock-site", action="store_true",
                    help="the site without TCP_NODELAY (~44 ms per keep-alive response)")
    ap.add_argument("--scripts", action="store_true",
                    help="Redis time per script and page, from SLOWLOG recording every "
                         "call (which slows Redis a little)")
    ap.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE",
                    help="a setting for every worker (-s), e.g. LEASED_GC_FREEZE=False or "
                    "the bench project's BENCH_GC_FREEZE=1; repeatable")
    ns = ap.parse_args()
    settings = parse_settings(ns.setting)
    workdir = Path(tempfile.mkdtemp(prefix="leased-e2e-"))
    redis = RedisServer(appendonly=False).start() if ns.mode != "plain" else None
    try:
        if ns.scripts and redis is not None:
            client = redis.client()
            client.config_set("slowlog-log-slower-than", 0)
            client.config_set("slowlog-max-len", SLOWLOG_MAX)
        result = run(ns.mode, ns.workers, ns.pages, redis, workdir, profile=ns.profile,
                     nodelay=not ns.stock_site, settings=settings)
        if ns.scripts and redis is not None:
            result["scripts"] = script_times(client, result["site"]["distinct"] or 1)
    finally:
        if redis is not None:
            redis.close()
    print(json.dumps(result, indent=1))
    return 1 if "error" in result else 0


if __name__ == "__main__":
    sys.exit(main())
