"""A/B of the frontier's scripts: another commit's claim.lua/commit.lua against this tree's,
on ONE redis-server, their calls interleaved, each call's time inside Redis from SLOWLOG.

    python benchmarks/bench_script_ab.py --base REF [--cases claim1/1,claim16/32,ack16,...]
        [--calls 2000] [--seeds 60000] [--json FILE]

`bench_frontier.script_costs` measures one version at a time by the Redis process's CPU
(INFO cpu); on a machine other work shares, that figure moves by 2x between runs of the
same code. Here both versions run side by side against the same server: each has its own
crawl (seeded alike: `--seeds` requests over 32 lanes, as script_costs), each call of one
is followed by the same call of the other (the order alternating), and SLOWLOG
(`slowlog-log-slower-than 0`) records how long each EVALSHA ran inside Redis (its
commands and its Lua; not the network I/O, which is the same for both). The medians are
compared. Run it twice with `--base-first` and without: the crawl seeded second runs a
few % slower (measured A/A: 0-4 %), so take the mean of the two orders.

Cases: ``claimN/L`` (claims of N requests from L candidate lanes, each lane with
thousands queued), ``ackN`` (commits acking N claims, nothing else), ``commitN`` (N pages
as script_costs: 10 links each, 7 of them duplicates, and N acks).
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import random
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

import bench_frontier as bf  # noqa: E402

HOSTS = 32
LUA = "scrapy_leased/frontier/lua"
DEFAULT_CASES = "claim1/1,claim1/32,claim2/8,claim4/32,claim16/1,claim16/32,ack1,ack4,ack16," \
                "commit1,commit16"


def sources_at(ref: str | None) -> dict[str, str]:
    """name -> script source (helpers prepended, as scripts.script_source) at git ``ref``
    (None: this tree)."""
    def read(path: str) -> str:
        if ref is None:
            return (REPO_ROOT / path).read_text(encoding="utf-8")
        return subprocess.run(["git", "-C", str(REPO_ROOT), "show", f"{ref}:{path}"],
                              check=True, capture_output=True, text=True).stdout

    tree = ast.parse(read("scrapy_leased/frontier/scripts.py"))
    libs: dict[str, tuple[str, ...]] = {}
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "LIBS":
            libs = ast.literal_eval(node.value)  # type: ignore[arg-type]
    out = {}
    for name in ("claim", "commit"):
        body = read(f"{LUA}/{name}.lua")
        shebang = ""
        if body.startswith("#!"):
            shebang, _, body = body.partition("\n")
            shebang += "\n"
        parts = [read(f"{LUA}/{lib}.lua") for lib in libs.get(name, ())] + [body]
        out[name] = shebang + "\n".join(parts)
    return out


async def run(url: str, r: Any, sides: list[tuple[str, dict[str, str]]], cases: list[str],
              calls: int, seeds: int) -> list[dict[str, Any]]:
    from scrapy_leased._redis.connection import make_client
    from scrapy_leased.frontier import NO_BUDGET, Frontier
    from scrapy_leased.frontier.keys import CrawlKeys

    names = [n for n, _ in sides]
    fs, held, rng, counter, shas = {}, {}, {}, {}, set()
    for name, src in sides:
        f = Frontier(make_client(url), CrawlKeys(name), lease_ms=bf.LEASE_MS, max_attempts=4,
                     caller=name)
        for s, text in src.items():
            f._s[s] = f.client.register_script(text)
            shas.add(f._s[s].sha)
        fs[name] = f
        reqs = bf.seed_requests(seeds, HOSTS)
        for i in range(0, len(reqs), 500):
            await f.enqueue(reqs[i:i + 500])
        held[name], rng[name], counter[name] = [], random.Random(7), 0
    pool = bf.seed_requests(seeds, HOSTS)
    lanes_all = [bf.host(i) for i in range(HOSTS)]
    durs: dict[str, list[int]] = {}
    rows: list[dict[str, Any]] = []

    def links(side: str, env: Any) -> list[Any]:
        out = []
        for k in range(bf.LINKS_NEW):
            counter[side] += 1
            lane = env.lane if k < 2 else bf.host(rng[side].randrange(HOSTS))
            out.append(bf.new_request(f"https://{lane}/p/c{counter[side]}", "https://x/", lane))
        return out + [pool[rng[side].randrange(len(pool))] for _ in range(bf.LINKS_DUP)]

    def collect() -> None:
        for e in r.slowlog_get(10_000_000):
            c = e["command"]
            parts = c.split(b" ", 4)[:4] if isinstance(c, bytes) else c.split(" ", 4)[:4]
            parts = [x.decode(errors="replace") if isinstance(x, bytes) else x for x in parts]
            if len(parts) > 3 and parts[0].lower() == "evalsha" and parts[1] in shas:
                for n in names:
                    if "{" + n + "}" in parts[3]:
                        durs.setdefault(n, []).append(int(e["duration"]))
        r.slowlog_reset()

    async def case(label: str, n: int, call: Any) -> None:
        r.slowlog_reset()
        order = list(names)
        for i in range(n):
            for side in order:
                await call(side)
            order = order[1:] + order[:1]
            if i % 200 == 199:
                collect()
        collect()
        row: dict[str, Any] = {"case": label, "calls": n}
        for side in names:
            d = durs.pop(side, [])
            row[side] = {"n": len(d), "median_us": statistics.median(d) if d else None,
                         "mean_us": statistics.fmean(d) if d else None}
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)

    turn = {n: 0 for n in names}
    for c in cases:
        if c.startswith("claim"):
            want, nl = (int(x) for x in c[5:].split("/"))

            async def claim(side: str, want: int = want, nl: int = nl) -> None:
                turn[side] += 1
                cands = [(lanes_all[(turn[side] + j) % HOSTS], NO_BUDGET) for j in range(nl)]
                res = await fs[side].claim(want, side, cands)
                assert len(res.claims) == want, len(res.claims)
                held[side].extend(res.claims)
            await case(c, calls // 4 if want == 1 else calls // 16, claim)
            continue
        with_links = c.startswith("commit")
        pages = int(c[6:] if with_links else c[3:])
        n = calls // 4 if pages == 1 else calls // 16
        while min(len(h) for h in held.values()) < pages * n:
            for side in names:
                held[side] += (await fs[side].claim(
                    500, side, [(lane, NO_BUDGET) for lane in lanes_all])).claims

        async def commit(side: str, pages: int = pages, with_links: bool = with_links) -> None:
            done = [held[side].pop() for _ in range(pages)]
            new = [x for _, env in done for x in links(side, env)] if with_links else []
            out = await fs[side].commit(new, [(t, env.rid) for t, env in done])
            assert all(a == 3 for a in out.acks)
        await case(c, n, commit)
    for f in fs.values():
        await f.client.aclose()
    return rows


def main() -> int:
    from tests.support.redis_server import RedisServer

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="git ref of the scripts to compare with")
    ap.add_argument("--base-first", action="store_true", help="seed and call the base first")
    ap.add_argument("--cases", default=DEFAULT_CASES)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--seeds", type=int, default=60_000)
    ap.add_argument("--json", default=None)
    ns = ap.parse_args()
    sides = [("tree", sources_at(None)), ("base", sources_at(ns.base))]
    if ns.base_first:
        sides.reverse()
    srv = RedisServer(appendonly=False, extra_config={
        "slowlog-log-slower-than": "0", "slowlog-max-len": "100000"}).start()
    try:
        r = srv.client()
        rows = asyncio.run(run(srv.url, r, sides, ns.cases.split(","), ns.calls, ns.seeds))
    finally:
        srv.close()
    print(f"| case | base ({ns.base}) µs, median | this tree µs, median | change |")
    print("| --- | ---: | ---: | ---: |")
    for row in rows:
        b, t = row["base"]["median_us"], row["tree"]["median_us"]
        print(f"| {row['case']} | {b:.0f} | {t:.0f} | {100 * (t - b) / b:+.0f} % |")
    if ns.json:
        Path(ns.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
