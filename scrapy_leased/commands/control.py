"""``scrapy leased pause``, ``resume``, ``stop`` and ``reset``."""


from __future__ import annotations

import argparse
import os
import socket

from scrapy.settings import Settings

from ..fleet import FleetAdmin
from ..fleet.report import age_text, n_of
from ..frontier import PAUSED, RUNNING, STOPPING
from ..settings import LeasedConfig
from .common import AddParser, CommandError, add_crawl, connected, open_crawl

#: The fleet control subcommands and the control state each sets (keys.py: control)
CONTROL = {"pause": PAUSED, "resume": RUNNING, "stop": STOPPING}


def add_parsers(add: AddParser) -> None:
    reset = add("reset", "[CRAWL] --yes [--records]", "delete the keys of one crawl")
    add_crawl(reset)
    reset.add_argument("--yes", action="store_true",
                       help="really delete the keys of the crawl")
    reset.add_argument("--records", action="store_true",
                       help="delete UpsertPipeline's records of the crawl too (kept "
                            "without it)")
    reset.set_defaults(run=run_reset)
    for sub, what in (("pause", "pause the whole fleet"),
                      ("resume", "let the fleet claim again"),
                      ("stop", "stop the whole fleet gracefully")):
        control = add(sub, "[CRAWL]", what)
        add_crawl(control)
        control.set_defaults(run=run_control)


async def run_reset(opts: argparse.Namespace, settings: Settings,
                    config: LeasedConfig) -> int:
    async with connected(opts, config) as (client, where):
        admin = await open_crawl(opts.crawl, settings, config, client, where)
        return await _reset(admin, opts, where, config.upsert.prefix)


async def run_control(opts: argparse.Namespace, settings: Settings,
                      config: LeasedConfig) -> int:
    async with connected(opts, config) as (client, where):
        admin = await open_crawl(opts.crawl, settings, config, client, where)
        return await _control(admin, opts.subcommand, config)


async def _control(admin: FleetAdmin, sub: str, config: LeasedConfig) -> int:
    from ..worker.control import STOP_REASON  # (imports the worker's side: only here)

    crawl = admin.keys.crawl_id
    state = CONTROL[sub]
    by = f"scrapy leased {sub} ({socket.gethostname()}:{os.getpid()})"
    prev, since, now = await admin.set_control(state, by)
    snap = await admin.snapshot(memory=False)
    alive = sum(1 for w in snap.workers if w.alive)
    was = f"was {prev}" + (f" for {age_text(max(0, now - since) / 1000)}" if since else "")
    print(f"crawl {crawl!r}: {state} ({was}); {n_of(alive, 'worker')} alive")
    heard = (f"each worker sees it at its next claim or heartbeat (within "
             f"{config.renew_interval:g} s, LEASED_RENEW_INTERVAL), and so does a worker "
             f"started later")
    if state == PAUSED:
        print(f"  {heard}: it claims and starts nothing new, finishes what it started and "
              f"keeps its leases; `scrapy leased resume` continues")
    elif state == STOPPING:
        print(f"  {heard}: it finishes and acks what it started, gives back the rest and "
              f"exits with close reason {STOP_REASON!r}; workers started before `scrapy "
              f"leased resume` close at once with it")
    else:
        print("  workers claim again at their next claim or heartbeat; a stopped fleet "
              "continues where it stopped when workers are started again")
    return 0


async def _reset(admin: FleetAdmin, opts: argparse.Namespace, where: str,
                 records_prefix: str) -> int:
    crawl = admin.keys.crawl_id
    keys = await admin.crawl_keys()
    records = [] if opts.records else [k for k in keys
                                       if admin.keys.is_records(k, records_prefix)]
    if not opts.yes:
        keeping = (f", keeping {n_of(len(records), 'records hash')} of UpsertPipeline "
                   f"(--records deletes them too)" if records else "")
        raise CommandError(f"reset deletes {n_of(len(keys) - len(records), 'key')} of crawl "
                           f"{crawl!r} ({admin.keys.prefix}*) in {where}{keeping}: add --yes")
    snap = await admin.snapshot(memory=False)
    alive = [w for w in snap.workers if w.alive and not w.process_gone()]
    if alive:
        youngest = min(w.heartbeat_age_s for w in alive)
        raise CommandError(
            f"{n_of(len(alive), 'worker')} of crawl {crawl!r} alive (last heartbeat "
            f"{age_text(youngest)} ago): stop them first (a worker killed on another machine "
            f"counts as alive until its heartbeat is older than LEASED_WORKER_TTL)")
    deleted, kept = await admin.reset(records=opts.records, records_prefix=records_prefix)
    print(f"deleted {n_of(deleted, 'key')} of crawl {crawl!r} ({admin.keys.prefix}*)"
          + (f"; kept {n_of(kept, 'records hash')} of UpsertPipeline "
             f"({admin.keys.prefix}{records_prefix}:*; --records deletes them too)"
             if kept else ""))
    return 0
