"""``scrapy leased --help`` reads as a help page at any terminal width, its usage lines
name each subcommand's options, and a worker at DEBUG logs no redis-py maintenance
line (#25 item 8).

Scrapy's help formatter takes every help line that ends with ``:`` for a section heading
(it title-cases it and underlines it), so a help text wrapped after a colon printed a row
of ``=====`` in the middle of an option. The help tests need no Redis: the help is
printed before the command connects to anything."""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PROJECT = REPO / "example_project"
HEADINGS = {"Usage", "Options", "Global Options", "Scrapy Leased"}


def help_text(columns: int) -> str:
    env = {**os.environ, "COLUMNS": str(columns)}
    result = subprocess.run([sys.executable, "-m", "scrapy", "leased", "--help"], cwd=PROJECT,
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def headings(lines: list[str]) -> list[str]:
    return [lines[i - 1].strip() for i, line in enumerate(lines)
            if i and re.fullmatch(r"[=-]{3,}", line.strip())]


@pytest.mark.integration
@pytest.mark.parametrize("columns", [64, 80, 100, 132, 200])
def test_help_has_only_its_own_headings(columns: int) -> None:
    assert set(headings(help_text(columns).splitlines())) == HEADINGS


@pytest.mark.integration
@pytest.mark.parametrize("columns", [40, 50])
def test_the_add_ons_options_stay_readable_on_a_narrow_terminal(columns: int) -> None:
    """Below 64 columns Scrapy's own ``--loglevel`` help wraps after ``(default:`` and is
    taken for a heading (Scrapy's formatter); the add-on's own options never are."""
    lines = help_text(columns).splitlines()
    ours = lines[lines.index("Scrapy Leased"):]
    assert headings(ours) == ["Scrapy Leased"], headings(ours)


@functools.cache
def command_parser() -> argparse.ArgumentParser:
    """The parser of ``scrapy leased``, made as Scrapy's cmdline makes it."""
    from scrapy.cmdline import ScrapyArgumentParser
    from scrapy.commands import ScrapyHelpFormatter
    from scrapy.settings import Settings

    from scrapy_leased.commands.leased import Command

    parser = ScrapyArgumentParser(formatter_class=ScrapyHelpFormatter, usage="scrapy leased",
                                  conflict_handler="resolve")
    command = Command()
    command.settings = Settings()
    command.add_options(parser)
    return parser


def subparsers() -> dict[str, argparse.ArgumentParser]:
    """Each subcommand's own parser, by name."""
    (action,) = [a for a in command_parser()._actions
                 if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def leased_options() -> dict[str, list[str]]:
    """The add-on's options as the subcommands' parsers define them, each by its option
    strings, e.g. ``{"--file": ["-f", "--file"], ...}``: not ``-h`` nor Scrapy's own
    global options (every subparser takes those too)."""
    scrapy_own = {s for a in command_parser()._actions for s in a.option_strings}
    return {a.option_strings[-1]: list(a.option_strings)
            for sub in subparsers().values() for a in sub._actions
            if a.option_strings and not scrapy_own & set(a.option_strings)}


#: The positional arguments a subcommand needs, to be parsed at all
NEEDS = {"embedded": ["status"], "from-scrapy-redis": ["SPIDER"]}


def accepted(sub: str, option: str) -> bool:
    """Whether the command's parser takes ``scrapy leased SUB OPTION [VALUE]``: an
    option of another subcommand is left over (``unrecognized arguments``), a value out
    of range is an error."""
    action = next(a for p in subparsers().values() for a in p._actions
                  if option in a.option_strings)  # (the same shape wherever it is)
    value = [] if action.nargs == 0 else ["1"]  # a number or a URL-less list: any will do
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            _, extras = command_parser().parse_known_args([sub, *NEEDS.get(sub, []), option,
                                                           *value])
        except SystemExit:
            return False
    return not extras


def usage_lines(text: str, prefix: str = "") -> dict[str, list[str]]:
    """Subcommand -> the usage lines naming it (``  dead [CRAWL] ...``, ``scrapy leased
    pause | resume | stop [CRAWL]``): lines that start with ``prefix``, then subcommands
    separated by `` | ``, then their arguments (not the overview ``status|dead|...``)."""
    from scrapy_leased.commands.leased import SUBCOMMANDS

    names = "|".join(SUBCOMMANDS)
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        m = re.match(rf"^\s*{re.escape(prefix)}((?:{names})(?:\s+\|\s+(?:{names}))*)(?:\s|$)",
                     line)
        if m:
            for sub in re.split(r"\s+\|\s+", m.group(1)):
                out.setdefault(sub, []).append(line)
    return out


def named(line: str, strings: list[str]) -> bool:
    return any(re.search(rf"(?<![\w-]){re.escape(s)}(?![\w-])", line) for s in strings)


#: Options every subcommand takes (or that are not about one subcommand): not in the
#: usage lines
ALL = {"--redis-url"}


def test_the_parsers_tell_every_option_apart() -> None:
    """Each option of a subcommand is refused with another (an option with a default
    value was accepted anywhere once: ``dead --interval 3``): each subcommand has its
    own parser, in the order of SUBCOMMANDS."""
    from scrapy_leased.commands.leased import SUBCOMMANDS

    assert tuple(subparsers()) == SUBCOMMANDS
    for option in set(leased_options()) - ALL:
        takers = [sub for sub in SUBCOMMANDS if accepted(sub, option)]
        assert 0 < len(takers) < len(SUBCOMMANDS), (option, takers)
    assert accepted("status", "--sample") and accepted("dead", "--limit")


def test_scrapys_options_before_and_after_the_subcommand_add_up() -> None:
    """Scrapy's options are taken after SUBCOMMAND too, and ``-s`` given on both sides
    sets both settings (argparse alone keeps what the subparser parsed)."""
    from scrapy.settings import Settings

    from scrapy_leased.commands.leased import Command

    parser = argparse.ArgumentParser(conflict_handler="resolve")
    command = Command()
    command.settings = Settings()
    command.add_options(parser)
    opts, args = parser.parse_known_args(["-s", "A=1", "-L", "DEBUG", "status", "c",
                                          "-s", "B=2", "--nolog"])
    command.process_options(args, opts)
    assert (args, opts.crawl, opts.set, opts.loglevel, opts.nolog) == (
        [], "c", ["A=1", "B=2"], "DEBUG", True)
    assert [command.settings[k] for k in ("A", "B", "LOG_ENABLED")] == ["1", "2", False]


@pytest.mark.integration
def test_a_subcommand_has_its_own_help() -> None:
    """``scrapy leased SUB -h`` prints that subcommand's usage line and options only."""
    result = subprocess.run([sys.executable, "-m", "scrapy", "leased", "dead", "-h"],
                            cwd=PROJECT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "scrapy leased dead [CRAWL] [--limit N]" in out, out
    assert "--requeue" in out and "--redis-url" in out and "--set" in out, out
    assert "--yes" not in out and "--watch" not in out, out


@pytest.mark.integration
@pytest.mark.parametrize("where", ["--help", "docs/commands.md", "module docstring"])
def test_usage_lines_name_every_option_of_a_subcommand(where: str) -> None:
    """Each subcommand's own usage line names exactly the options it takes (before: an
    option counted when it was anywhere in the usage block, so `dead`'s line lacked
    `--json`). What a subcommand takes is what the command's parser accepts."""
    from scrapy_leased.commands import leased
    from scrapy_leased.commands.leased import SUBCOMMANDS

    if where == "--help":
        text, prefix = help_text(200), ""
        text = text[:text.index("Watch and run")]
    elif where == "docs/commands.md":
        text, prefix = (REPO / "docs" / "commands.md").read_text(), "scrapy leased "
    else:
        text, prefix = leased.__doc__ or "", "scrapy leased "
    lines = usage_lines(text, prefix)
    assert set(lines) == set(SUBCOMMANDS), (set(SUBCOMMANDS) - set(lines), text)
    wrong = []
    for option, strings in leased_options().items():
        if option in ALL:
            continue
        for sub in SUBCOMMANDS:
            takes = accepted(sub, option)
            wrong += [f"{sub}: {option} {'missing' if takes else 'extra'} in {line.strip()!r}"
                      for line in lines[sub] if takes != named(line, strings)]
    assert not wrong, "\n".join(wrong)


MAINTENANCE = "Failed to enable maintenance notifications"


def test_redis_py_logs_the_maintenance_line_against_this_redis(redis_server) -> None:
    """The control of the next test: without scrapy_leased, redis-py at DEBUG logs the
    line on each new connection to this Redis (7: no CLIENT MAINT_NOTIFICATIONS)."""
    code = (
        "import asyncio, logging, sys\n"
        "import redis.asyncio as redis\n"
        "logging.basicConfig(level=logging.DEBUG, stream=sys.stdout)\n"
        "async def main():\n"
        f"    c = redis.from_url({redis_server.url!r}, protocol=3)\n"
        "    await c.ping()\n"
        "    await c.aclose()\n"
        "asyncio.run(main())\n"
        "print('imported scrapy_leased:', 'scrapy_leased' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert MAINTENANCE in out and "imported scrapy_leased: False" in out, out


def test_no_maintenance_notification_flood_in_a_worker_at_debug(
        redis_server, make_site, start_worker, crawl_id) -> None:
    """#25 item 8: a real ``scrapy crawl`` worker at LOG_LEVEL=DEBUG against Redis 7
    logged redis-py's maintenance line on each new connection (10 in this crawl without
    the filter of connection.py). It logs none, while redis-py's other DEBUG lines are
    still there: the pub/sub connection of the worker's penalty watch is killed mid-crawl
    (CLIENT KILL TYPE pubsub), and redis-py's DEBUG line about that ConnectionError is in
    the log, as is the reconnection's (its handshake tries maintenance notifications
    again: filtered too)."""
    from scrapy_leased.frontier.keys import CrawlKeys
    from tests.support.workers import wait_for

    keys = CrawlKeys(crawl_id)
    r = redis_server.client(decode_responses=True)
    assert r.info("server")["redis_version"].startswith("7."), "this check needs Redis 7"
    site = make_site(pages=60, delay=0.05)
    w = start_worker(redis_server.url, crawl_id, site.url + "/p/0",
                     settings={"LOG_LEVEL": "DEBUG", "CONCURRENT_REQUESTS": 2})
    wait_for(lambda: int(r.hget(keys.stats, "done") or 0) >= 10
             and r.pubsub_numsub(keys.penalties)[0][1] > 0, 60,
             "10 pages done, the penalty watch subscribed", [w])
    assert r.execute_command("CLIENT", "KILL", "TYPE", "pubsub") == 1
    wait_for(lambda: "[redis.asyncio.client] DEBUG: ConnectionError" in w.log_text(), 60,
             "redis-py's DEBUG line about the killed connection", [w])
    wait_for(lambda: r.pubsub_numsub(keys.penalties)[0][1] > 0, 60,
             "the penalty watch subscribed again", [w])
    assert w.wait(90) == 0, w.log_tail()
    assert w.close_reason() == "finished"
    log = w.log_text()
    assert "DEBUG: Crawled (200)" in log  # DEBUG it is
    assert MAINTENANCE not in log, [ln for ln in log.splitlines() if MAINTENANCE in ln][:3]


def test_the_filter_drops_only_the_maintenance_line() -> None:
    """connection.py's filter on redis-py's two connection loggers drops that one
    message and passes any other record of theirs, whatever its level."""
    import logging

    import scrapy_leased._redis.connection  # noqa: F401 (installs the filter)

    for name in ("redis.connection", "redis.asyncio.connection"):
        logger = logging.getLogger(name)
        assert logger.filters, name

        def passes(msg: str, level: int = logging.DEBUG) -> bool:
            return bool(logger.filter(logger.makeRecord(name, level, __file__, 1, msg, (),
                                                        None)))

        assert not passes(f"{MAINTENANCE}: unknown subcommand 'MAINT_NOTIFICATIONS'.")
        assert passes("ConnectionError while reading response, with connection: ...")
        assert passes("Discarding 1 push notification(s) buffered on a connection")
        assert passes(f"not the message: {MAINTENANCE}")
        assert passes("Connection refused", logging.WARNING)
