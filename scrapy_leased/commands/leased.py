"""``scrapy leased``: watch and run a leased crawl from the command line.

    scrapy leased status [CRAWL] [--watch [--interval S]] [--json] [--sample S]
    scrapy leased dead   [CRAWL] [--limit N] [--json] [--requeue [URL ...] | --purge [URL ...]]
    scrapy leased seed   [CRAWL] [--scrapy-redis] URL ... | -f FILE | -
    scrapy leased forget [CRAWL] URL ... | -f FILE | -
    scrapy leased reset  [CRAWL] --yes [--records]
    scrapy leased pause | resume | stop [CRAWL]
    scrapy leased metrics   [CRAWL | --all-crawls] [--bind HOST] [--port N]
    scrapy leased dashboard [CRAWL] [--bind HOST] [--port N] [--allow-writes]
    scrapy leased embedded status | stop
    scrapy leased from-scrapy-redis SPIDER [--pickle] [--seen-urls FILE] [--queue-key K] [--dupefilter-key K] [--start-urls-key K]

CRAWL defaults to the project's LEASED_CRAWL_ID, else to the name of the project's
only spider. Redis: ``--redis-url``, else the project's LEASED_REDIS_URL, else the
embedded Redis of the project's ``.scrapy`` directory when one runs there (``seed``
starts it, like a worker would). Errors are one line on stderr, exit status 1.

Synchronous code, not on a reactor: each subcommand is one ``asyncio.run`` over
``FleetAdmin`` (the same code the workers use); waiting with sleep is fine here. This
module holds the command and its dispatch: each subcommand is an argparse subparser,
declared with its options and its handler (``set_defaults(run=...)``) by a module beside
it (``status``, ``dead``, ``urls``: seed and forget, ``control``: pause, resume, stop and
reset, ``serve``: metrics and dashboard, ``embedded``, ``fromsr``); ``common`` holds what
they share.
"""  # noqa: E501 (a usage line: one line each, tests/test_cli_help.py)

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING, Any, ClassVar

from redis.exceptions import RedisError
from scrapy.commands import ScrapyCommand

from ..settings import LeasedConfig, LeasedConfigError
from . import control, dead, embedded, fromsr, serve, status, urls
from .common import CommandError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from scrapy.settings import Settings


#: The subcommands, in the order of the usage lines and of their parsers
SUBCOMMANDS = ("status", "dead", "seed", "forget", "reset", "pause", "resume", "stop",
               "metrics", "dashboard", "embedded", "from-scrapy-redis")


#: The prefix of Scrapy's global options given after SUBCOMMAND (Command._scrapy_options)
AFTER = "after_subcommand_"


#: The modules that add the subcommands' parsers (``add_parsers``), in that order
MODULES = (status, dead, urls, control, serve, embedded, fromsr)


class SubcommandParser(argparse.ArgumentParser):
    """A subcommand's parser: its positionals may come on both sides of its options
    (``seed CRAWL URL -f FILE URL``), as ``parse_intermixed_args`` parses them."""

    _intermixing = False

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None
                         ) -> tuple[argparse.Namespace, list[str]]:
        if self._intermixing:  # (Python < 3.13: the intermixed parse calls this twice)
            return super().parse_known_args(args, namespace)
        self._intermixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False


class Command(ScrapyCommand):
    requires_project = False  # ignored for entry-point commands anyway
    requires_crawler_process = False
    default_settings: ClassVar[dict[str, Any]] = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return (f"{'|'.join(SUBCOMMANDS)} [options]\n\n"
                "  status [CRAWL] [--json] [--sample SECONDS] [--watch [--interval SECONDS]]\n"
                "  dead   [CRAWL] [--limit N] [--json] [--requeue [URL ...] | --purge [URL ...]]\n"
                "  seed   [CRAWL] [--scrapy-redis] URL ... | -f FILE | -\n"
                "  forget [CRAWL] URL ... | -f FILE | -\n"
                "  reset  [CRAWL] --yes [--records]\n"
                "  pause | resume | stop [CRAWL]\n"
                "  metrics   [CRAWL | --all-crawls] [--bind HOST] [--port N]\n"
                "  dashboard [CRAWL] [--bind HOST] [--port N] [--allow-writes]\n"
                "  embedded status | stop\n"
                "  from-scrapy-redis SPIDER [--pickle] [--seen-urls FILE] [--queue-key K] "
                "[--dupefilter-key K] [--start-urls-key K]\n\n"
                "  scrapy leased SUBCOMMAND -h: the options of one subcommand")

    def short_desc(self) -> str:
        return ("Watch and run a leased crawl: status, dead letters, seeding, forgetting, "
                "reset, pause/resume/stop")

    def long_desc(self) -> str:
        return ("Watch and run a scrapy_leased crawl. CRAWL defaults to LEASED_CRAWL_ID, "
                "else to the project's only spider. Redis: --redis-url, else "
                "LEASED_REDIS_URL, else the project's embedded Redis.")

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        """Scrapy's options, then one subparser per subcommand, each with its own
        options: argparse tells an option of another subcommand (Scrapy parses known
        arguments only: what a subparser did not take comes to ``process_options`` as
        ``args``)."""
        super().add_options(parser)
        self._subcommands = parser.add_subparsers(
            title="scrapy leased", dest="subcommand", metavar="SUBCOMMAND", required=True,
            prog="scrapy leased", parser_class=SubcommandParser)
        scrapy_options = self._scrapy_options()
        # --redis-url before SUBCOMMAND too (the subparser's copy, given, wins)
        redis_help = ("Redis of the crawl (default LEASED_REDIS_URL, else the project's "
                      "embedded Redis)")
        parser.add_argument("--redis-url", metavar="URL", help=redis_help)
        redis = SubcommandParser(add_help=False)
        redis.add_argument("--redis-url", metavar="URL", default=argparse.SUPPRESS,
                           help=redis_help)

        def add(name: str, usage: str, help: str,
                redis_url: bool = True) -> argparse.ArgumentParser:
            return self._subcommands.add_parser(
                name, usage=f"scrapy leased {name} {usage}", help=help, description=help,
                parents=[scrapy_options, redis] if redis_url else [scrapy_options],
                formatter_class=parser.formatter_class, conflict_handler="resolve")

        for module in MODULES:
            module.add_parsers(add)

    def _scrapy_options(self) -> SubcommandParser:
        """Scrapy's global options (-s, -L, --logfile...) for the subparsers, so that they
        may follow SUBCOMMAND too: argparse sets what a subparser parses over what the
        command's parser did, so each stores under its own name (``AFTER`` + its name),
        without a default, and ``process_options`` adds it to the same option given
        before SUBCOMMAND."""
        options = SubcommandParser(add_help=False)
        super().add_options(options)
        for action in options._actions:
            action.dest, action.default = AFTER + action.dest, argparse.SUPPRESS
        return options

    def process_options(self, args: list[str], opts: argparse.Namespace) -> None:
        parser = self._subcommands.choices[opts.subcommand]
        if args:  # not taken by the subcommand's parser: its usage and exit status 2
            parser.error(f"unrecognized arguments: {' '.join(args)}")
        if opts.redis_url is not None and "--redis-url" not in parser._option_string_actions:
            parser.error("unrecognized arguments: --redis-url (it works on the project's "
                         "embedded Redis)")
        for name, value in list(vars(opts).items()):
            if name.startswith(AFTER):  # -s after SUBCOMMAND: added to -s before it
                delattr(opts, name)
                name = name.removeprefix(AFTER)
                before = getattr(opts, name)
                setattr(opts, name, before + value if isinstance(before, list) else value)
        super().process_options(args, opts)

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        assert self.settings is not None
        try:
            self.exitcode = asyncio.run(_main(opts, self.settings))
        except (CommandError, LeasedConfigError) as exc:  # a bad setting: its name, no trace
            print(f"Error: {exc}", file=sys.stderr)
            self.exitcode = 1
        except (RedisError, OSError) as exc:  # Redis went away in the middle
            print(f"Error: Redis: {type(exc).__name__}: {exc}", file=sys.stderr)
            self.exitcode = 1
        except KeyboardInterrupt:
            self.exitcode = 0


async def _main(opts: argparse.Namespace, settings: Settings) -> int:
    config = LeasedConfig.from_settings(settings)  # a bad setting: before Redis is reached
    code: int = await opts.run(opts, settings, config)
    return code
