"""The lossy proxy of tests/support/proxy.py, dropping the replies of any commands named
(not only EVALSHA): when the reply to the ``every``-th matching command arrives, it
closes the client's connection instead of forwarding that reply (Redis ran the command,
the client never hears back), ``drops`` times in all.

    proxy = DropProxyProcess(redis_port, commands=["HGETALL"], drops=1).start()
    proxy.url            # redis://127.0.0.1:<proxy port>/0
    proxy.status()       # {"dropped": n, "matched": m, "dropped_by_command": {...}, ...}
    proxy.stop()
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from .proxy import LossyProxy, ProxyProcess, parser, serve


class CommandDropProxy(LossyProxy):
    def __init__(self, target: tuple[str, int], drops: int, every: int,
                 commands: set[bytes], status_path: Path | None) -> None:
        super().__init__(target, drops, every, None, status_path)
        self.commands = commands

    def _which(self, words: list[bytes], reply: bytes) -> str | None:
        if not words or words[0].upper() not in self.commands or reply[:1] in (b"-", b"!"):
            return None
        return words[0].upper().decode()


def main(argv: list[str] | None = None) -> int:
    ap = parser("python -m tests.support.dropproxy", drops=1)
    ap.add_argument("--command", action="append", default=[])
    args = ap.parse_args(argv)
    asyncio.run(serve(CommandDropProxy(("127.0.0.1", args.target_port), args.drops, args.every,
                                       {c.upper().encode() for c in args.command},
                                       Path(args.status) if args.status else None)))
    return 0


class DropProxyProcess(ProxyProcess):
    """``CommandDropProxy`` in a subprocess."""

    def __init__(self, target_port: int, commands: list[str], drops: int = 1,
                 every: int = 1, status_path: Path | None = None) -> None:
        super().__init__(target_port, drops, every, None, status_path)
        self.commands = commands

    MODULE = "tests.support.dropproxy"

    def extra_args(self) -> list[str]:
        return [a for c in self.commands for a in ("--command", c)]


if __name__ == "__main__":
    sys.exit(main())
