"""``scrapy leased dead``: list, requeue or purge the dead letters."""


from __future__ import annotations

import argparse
import json

from scrapy.settings import Settings

from ..fleet import FleetAdmin
from ..fleet.report import n_of, render_dead
from ..settings import LeasedConfig
from .common import AddParser, CommandError, add_crawl, connected, number, open_crawl

DEAD_LIMIT = 20  # dead letters listed by default


def add_parsers(add: AddParser) -> None:
    p = add("dead", "[CRAWL] [--limit N] [--json] [--requeue [URL ...] | --purge [URL ...]]",
            "list, requeue or purge the dead letters")
    add_crawl(p)
    p.add_argument("--limit", type=number(int, 0), default=None, metavar="N",
                   help="list at most N dead letters, newest first (default 20; 0 = all)")
    p.add_argument("--json", action="store_true", help="machine-readable JSON")
    action = p.add_mutually_exclusive_group()
    action.add_argument("--requeue", nargs="*", metavar="URL", default=None,
                        help="requeue these dead letters (all without URL), attempts reset "
                             "to 0")
    action.add_argument("--purge", nargs="*", metavar="URL", default=None,
                        help="delete these dead letters (all without URL)")
    p.set_defaults(run=run)


async def run(opts: argparse.Namespace, settings: Settings, config: LeasedConfig) -> int:
    async with connected(opts, config) as (client, where):
        return await _dead(await open_crawl(opts.crawl, settings, config, client, where), opts)


async def _dead(admin: FleetAdmin, opts: argparse.Namespace) -> int:
    crawl = admin.keys.crawl_id
    action = "requeue" if opts.requeue is not None else "purge" if opts.purge is not None \
        else None
    if action is None:
        limit = DEAD_LIMIT if opts.limit is None else opts.limit
        total, letters = await admin.dead_letters(limit=limit or None)
        if opts.json:
            print(json.dumps({"crawl": crawl, "dead": total,
                              "letters": [d.to_dict() for d in letters]}))
        else:
            print(render_dead(crawl, total, letters))
        return 0
    urls = opts.requeue if action == "requeue" else opts.purge
    for url in urls:
        if "://" not in url:
            raise CommandError(f"not a URL: {url!r} (name the crawl before --{action})")
    if urls:
        _, letters = await admin.dead_letters(urls=urls)
        missing = sorted(set(urls) - {d.url for d in letters})
        if not letters:  # nothing to do: one error, no "purged 0" before it
            raise CommandError(f"not in the dead letters of crawl {crawl!r}: "
                               f"{' '.join(missing)}")
    else:
        _, letters = await admin.dead_letters()
        missing = []
    if action == "requeue":
        result = await admin.requeue_dead(letters)
        print(f"requeued {n_of(result.requeued, 'dead letter')} of crawl {crawl!r} "
              f"(attempts reset to 0)"
              + (f"; {result.already_done:,} were done meanwhile (dropped)"
                 if result.already_done else "")
              + (f"; {result.unreadable:,} unreadable kept (--purge them)"
                 if result.unreadable else ""))
        if result.dropped:
            raise CommandError(
                f"{n_of(result.dropped, 'dropped request')} of crawl {crawl!r} not requeued: "
                "never queued, they could not be stored (their reason names the meta or "
                "cb_kwargs key and the fix), and what was kept of them is not the request "
                "the spider made. Fix the spider, seed their URLs again (scrapy leased "
                "seed), then --purge them")
    else:
        purged = await admin.purge_dead(letters if urls else None)
        print(f"purged {n_of(purged, 'dead letter')} of crawl {crawl!r}")
    if missing:
        raise CommandError(f"not in the dead letters of crawl {crawl!r}: {' '.join(missing)}")
    return 0
