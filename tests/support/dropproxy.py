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

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from .proxy import LossyProxy, ProxyProcess


class CommandDropProxy(LossyProxy):
    def __init__(self, target: tuple[str, int], drops: int, every: int,
                 commands: set[bytes], status_path: Path | None) -> None:
        super().__init__(target, drops, every, None, status_path)
        self.commands = commands

    def _drop(self, words: list[bytes], reply: bytes) -> bool:
        if not words or words[0].upper() not in self.commands or reply[:1] in (b"-", b"!"):
            return False
        self.matched += 1
        if self.drops_left <= 0 or self.matched % self.every:
            return False
        self.drops_left -= 1
        self.dropped += 1
        name = words[0].upper().decode()
        self.dropped_by_sha[name] = self.dropped_by_sha.get(name, 0) + 1
        self.write_status()
        return True


async def serve(args: argparse.Namespace) -> None:
    proxy = CommandDropProxy(("127.0.0.1", args.target_port), args.drops, args.every,
                             {c.upper().encode() for c in args.command},
                             Path(args.status) if args.status else None)
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
    proxy.write_status()
    print(json.dumps({"port": server.sockets[0].getsockname()[1], "pid": os.getpid()}),
          flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()
    proxy.write_status()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.support.dropproxy")
    ap.add_argument("--target-port", type=int, required=True)
    ap.add_argument("--drops", type=int, default=1)
    ap.add_argument("--every", type=int, default=1)
    ap.add_argument("--command", action="append", default=[])
    ap.add_argument("--status")
    asyncio.run(serve(ap.parse_args(argv)))
    return 0


class DropProxyProcess(ProxyProcess):
    """``CommandDropProxy`` in a subprocess."""

    def __init__(self, target_port: int, commands: list[str], drops: int = 1,
                 every: int = 1, status_path: Path | None = None) -> None:
        super().__init__(target_port, drops, every, None, status_path)
        self.commands = commands

    def start(self, timeout: float = 10.0) -> DropProxyProcess:
        from .redis_server import _pdeathsig_preexec

        if self.status_path is None:
            import tempfile

            self.status_path = Path(tempfile.mkdtemp(prefix="leased-proxy-")) / "status.json"
        cmd = [sys.executable, "-m", "tests.support.dropproxy", "--target-port",
               str(self.target_port), "--drops", str(self.drops), "--every", str(self.every),
               "--status", str(self.status_path)]
        for c in self.commands:
            cmd += ["--command", c]
        root = Path(__file__).resolve().parents[2]
        self.proc = subprocess.Popen(cmd, cwd=str(root), stdout=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, preexec_fn=_pdeathsig_preexec())
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        line = self.proc.stdout.readline()
        if not line or time.monotonic() > deadline:
            self.stop()
            raise RuntimeError("the proxy did not start")
        self.port = int(json.loads(line)["port"])
        return self


if __name__ == "__main__":
    sys.exit(main())
