"""A TCP proxy between Redis clients and a Redis server that loses replies.

It forwards everything, parses both directions (RESP2, RESP3), and when the reply to a script
call (``EVALSHA``, optionally only for some SHA1s) arrives and a drop is due, it closes
the client's connection instead of forwarding that reply: Redis ran the script, the
client never learns its result (what a network cut right after the write does). Every
``every``-th matching reply is dropped, ``drops`` times in all.

Run it in a subprocess (``ProxyProcess``), so its event loop is not the test's::

    proxy = ProxyProcess(redis_port, drops=200, every=3, shas=[...]).start()
    proxy.url            # redis://127.0.0.1:<proxy port>/0, for the workers
    proxy.status()       # {"dropped": n, "matched": m, "dropped_by_sha": {...}, ...}
    proxy.stop()

or ``python -m tests.support.proxy --target-port P --drops N --every K --status FILE``: it
prints ``{"port": <port>}`` once listening, and rewrites the status file (JSON) as it goes.
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
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from typing_extensions import Self

CRLF = b"\r\n"


def _line_end(buf: bytes | bytearray, pos: int) -> int | None:
    end = buf.find(CRLF, pos)
    return None if end < 0 else end


_SIMPLE = frozenset(b"+-:_#,(")  # one line
_BLOB = frozenset(b"$!=")  # a length, then that many bytes
_AGGREGATE = {ord("*"): 1, ord("~"): 1, ord(">"): 1, ord("%"): 2}  # n (pairs for maps)


def parse_reply(buf: bytes | bytearray, pos: int = 0) -> int | None:
    """The end offset of the RESP2 or RESP3 value starting at ``pos`` (redis-py speaks
    RESP3 when it can), or None if it is incomplete."""
    if pos >= len(buf):
        return None
    kind = buf[pos]
    end = _line_end(buf, pos)
    if end is None:
        return None
    if kind in _SIMPLE:
        return end + 2
    n = int(buf[pos + 1:end])
    if kind in _BLOB:
        if n < 0:
            return end + 2
        stop = end + 2 + n + 2
        return stop if stop <= len(buf) else None
    if kind == ord("|"):  # attributes, then the value they are about
        p = _elements(buf, end + 2, 2 * n)
        return None if p is None else parse_reply(buf, p)
    if kind in _AGGREGATE:
        return _elements(buf, end + 2, max(n, 0) * _AGGREGATE[kind])
    raise ValueError(f"unexpected RESP type {chr(kind)!r} at {pos}")


def _elements(buf: bytes | bytearray, pos: int, n: int) -> int | None:
    p: int | None = pos
    for _ in range(n):
        assert p is not None
        p = parse_reply(buf, p)
        if p is None:
            return None
    return p


def parse_command(buf: bytes | bytearray, pos: int = 0) -> tuple[int, list[bytes]] | None:
    """(end offset, the first two words) of the command starting at ``pos``, or None."""
    if pos >= len(buf):
        return None
    end = _line_end(buf, pos)
    if end is None:
        return None
    if buf[pos:pos + 1] != b"*":  # an inline command
        return end + 2, bytes(buf[pos:end]).split()[:2]
    n = int(buf[pos + 1:end])
    p, words = end + 2, []
    for _ in range(n):
        e = _line_end(buf, p)
        if e is None:
            return None
        size = int(buf[p + 1:e])
        if e + 2 + size + 2 > len(buf):
            return None
        if len(words) < 2:
            words.append(bytes(buf[e + 2:e + 2 + size]))
        p = e + 2 + size + 2
    return p, words


async def pump(reader: asyncio.StreamReader, closed: asyncio.Event,
               on_data: Callable[[bytes], Awaitable[bool]]) -> None:
    """Pass what ``reader`` reads to ``on_data`` until the end of the stream, ``closed``,
    or ``on_data`` says False; then set ``closed``. A reset, or bytes ``on_data`` cannot
    parse, cut the connection the same way."""
    try:
        while not closed.is_set():
            data = await reader.read(65536)
            if not data or not await on_data(data):
                break
    except Exception:
        pass
    closed.set()


class LossyProxy:
    def __init__(self, target: tuple[str, int], drops: int, every: int,
                 shas: set[str] | None, status_path: Path | None) -> None:
        self.target = target
        self.drops_left = drops
        self.every = max(every, 1)
        self.shas = shas
        self.status_path = status_path
        self.matched = 0
        self.dropped = 0
        self.dropped_by_sha: dict[str, int] = {}
        self.connections = 0

    def write_status(self) -> None:
        if self.status_path is None:
            return
        tmp = self.status_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({
            "dropped": self.dropped, "matched": self.matched, "connections": self.connections,
            "drops_left": self.drops_left, "dropped_by_sha": self.dropped_by_sha}))
        os.replace(tmp, self.status_path)

    async def handle(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            sreader, swriter = await asyncio.open_connection(*self.target)
        except OSError:
            cwriter.close()
            return
        pending: list[list[bytes]] = []  # commands sent, in order, awaiting their reply
        closed = asyncio.Event()

        cbuf, sbuf = bytearray(), bytearray()

        async def commands(data: bytes) -> bool:
            cbuf.extend(data)
            while (parsed := parse_command(cbuf)) is not None:
                end, words = parsed
                pending.append(words)
                del cbuf[:end]
            swriter.write(data)
            await swriter.drain()
            return True

        async def replies(data: bytes) -> bool:
            sbuf.extend(data)
            out = bytearray()
            while (end := parse_reply(sbuf)) is not None:
                reply = bytes(sbuf[:end])
                del sbuf[:end]
                if self._drop(pending.pop(0) if pending else [], reply):
                    if out:
                        cwriter.write(bytes(out))
                    return False
                out += reply
            if out:
                cwriter.write(bytes(out))
                await cwriter.drain()
            return True

        upstream, downstream = pump(creader, closed, commands), pump(sreader, closed, replies)
        tasks = [asyncio.ensure_future(upstream), asyncio.ensure_future(downstream)]
        await closed.wait()
        for t in tasks:
            t.cancel()
        for w in (cwriter, swriter):
            try:
                w.close()
            except Exception:
                pass

    def _which(self, words: list[bytes], reply: bytes) -> str | None:
        """The name a reply to this command is counted under if it may be dropped, else
        None: here an EVALSHA's script SHA (of ``shas``, when given)."""
        if not words or words[0].upper() != b"EVALSHA" or reply[:1] in (b"-", b"!") \
                or reply.startswith(b"+QUEUED"):
            return None
        sha = words[1].decode() if len(words) > 1 else ""
        return None if self.shas is not None and sha not in self.shas else sha

    def _drop(self, words: list[bytes], reply: bytes) -> bool:
        name = self._which(words, reply)
        if name is None:
            return False
        self.matched += 1
        if self.drops_left <= 0 or self.matched % self.every:
            return False
        self.drops_left -= 1
        self.dropped += 1
        self.dropped_by_sha[name] = self.dropped_by_sha.get(name, 0) + 1
        self.write_status()
        return True


async def serve(proxy: LossyProxy, port: int = 0) -> None:
    """Serve ``proxy`` on 127.0.0.1 (``port``, 0: a free one), print its port as one JSON
    line, and serve until SIGTERM or SIGINT."""
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", port)
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


def parser(prog: str, drops: int) -> argparse.ArgumentParser:
    """The options every proxy takes (``drops``: the default number of replies to drop)."""
    ap = argparse.ArgumentParser(prog=prog)
    ap.add_argument("--target-port", type=int, required=True)
    ap.add_argument("--drops", type=int, default=drops)
    ap.add_argument("--every", type=int, default=1)
    ap.add_argument("--status")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser("python -m tests.support.proxy", drops=0)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--sha", action="append", default=[])
    args = ap.parse_args(argv)
    asyncio.run(serve(LossyProxy(("127.0.0.1", args.target_port), args.drops, args.every,
                                 set(args.sha) if args.sha else None,
                                 Path(args.status) if args.status else None), args.port))
    return 0


class ProxyProcess:
    """The proxy in a subprocess (see the module docstring)."""

    def __init__(self, target_port: int, drops: int, every: int = 1,
                 shas: list[str] | None = None, status_path: Path | None = None) -> None:
        self.target_port = target_port
        self.drops = drops
        self.every = every
        self.shas = shas or []
        self.status_path = Path(status_path) if status_path else None
        self.proc: subprocess.Popen[bytes] | None = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    #: the module run as the proxy subprocess (``python -m MODULE``)
    MODULE = "tests.support.proxy"

    def extra_args(self) -> list[str]:
        """The proxy's own options after the common ones."""
        return [a for sha in self.shas for a in ("--sha", sha)]

    def start(self, timeout: float = 10.0) -> Self:
        from .redis_server import _pdeathsig_preexec

        if self.status_path is None:
            import tempfile

            self.status_path = Path(tempfile.mkdtemp(prefix="leased-proxy-")) / "status.json"
        cmd = [sys.executable, "-m", self.MODULE, "--target-port",
               str(self.target_port), "--drops", str(self.drops), "--every", str(self.every),
               "--status", str(self.status_path), *self.extra_args()]
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

    def status(self) -> dict[str, Any]:
        assert self.status_path is not None
        try:
            return json.loads(self.status_path.read_text())
        except (FileNotFoundError, ValueError):
            return {}

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    def __enter__(self) -> ProxyProcess:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


if __name__ == "__main__":
    sys.exit(main())
