"""The Lua scripts, read once and registered per client (EVALSHA, reloaded on NOSCRIPT
by redis-py). Each package keeps the scripts it runs in a ``lua/`` folder of its own
(``Scripts``): the frontier's here, beside the shared helpers (lua/lib_*.lua) every
package's scripts may have prepended.

A script file may start with a Redis 7 shebang (``#!lua`` or ``#!lua flags=...``); it is
kept as the first line, before the shared helpers. Every script that writes has one:
with a shebang and without ``allow-oom``, Redis refuses the whole script up front when it
is out of memory, instead of failing at its first write (or, after a first write, going
on), so a script either runs completely or changes nothing. Renewals, releases and
purges, which only extend or remove what exists, run under OOM (``allow-oom``).

On a client made with ``wait_replicas`` N in its URL (_redis/url.py), the scripts whose
replies a worker acts on (``Scripts.waited``) are followed by ``WAIT N`` on the same connection, in
the same round trip: their writes are on N replicas before the reply is used."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping, Sequence
from importlib.resources import files
from typing import Any

from redis.exceptions import NoScriptError, ResponseError

#: The frontier's scripts (lua/ here), each with the shared helpers (lib_*.lua) it gets
#: prepended, in this order. The other packages' scripts sit in their own lua/ (Scripts).
LIBS: dict[str, tuple[str, ...]] = {
    "claim": ("lib_time", "lib_envelope", "lib_settle", "lib_rate", "lib_guard", "lib_batch",
              "lib_keys"),
    "commit": ("lib_time", "lib_envelope", "lib_settle", "lib_guard", "lib_enqueue",
               "lib_batch", "lib_stats"),
    "feed_take": ("lib_time", "lib_keys"),  # the feed (feed/drain.py): a batch taken off it
    "layout": (),  # the seen-set layout, recorded once (Frontier.check_layout)
    "feed_commit": ("lib_time", "lib_envelope", "lib_settle", "lib_guard", "lib_enqueue",
                    "lib_keys"),
    "expired": ("lib_time", "lib_batch"),
    "recover": ("lib_time", "lib_envelope", "lib_settle", "lib_guard"),
    "revisit": ("lib_time", "lib_envelope", "lib_settle", "lib_guard"),
    "renew": ("lib_guard", "lib_batch", "lib_keys"),
    "release": ("lib_envelope", "lib_settle"),
    "acquire": ("lib_time", "lib_rate"),
    "penalize": ("lib_time", "lib_rate"),
    "run_join": ("lib_time",),  # run.py: which worker seeds the run
    "run_seeded": (),
    "run_refresh": (),
    "run_leave": ("lib_time",),
    "run_flush": ("lib_time", "lib_keys"),  # run.py: LEASED_FLUSH_ON_START
    "worker_enter": ("lib_time",),  # workerid.py: a starting worker's id, unless in use
    "key_aside": (),  # a feed or control key of the wrong type moved aside
    "read": (),  # several reads with the server time, atomically (read_atomic below)
    "hot_keys": (),  # the busiest keys kept hashtables and skiplists (the sweep)
}

#: The frontier's shared helpers, which every package's scripts may have prepended
_HELPERS = files("scrapy_leased.frontier").joinpath("lua")

#: A fixed key in a script's header: ``-- KEYS[3] inflight ...`` (a CrawlKeys attribute)
HEADER_KEY = re.compile(r"KEYS\[(\d+)\]\s+([a-z_]+)\b")


class Scripts:
    """One package's Lua scripts, in the ``lua/`` folder beside its modules: ``libs``
    names each of them and the frontier's helpers (lib_*.lua) it gets prepended, in
    order; ``waited``: those followed by WAIT on a client with ``wait_replicas``."""

    def __init__(self, package: str, libs: Mapping[str, tuple[str, ...]],
                 waited: frozenset[str] = frozenset()) -> None:
        self.package = package
        self.libs = dict(libs)
        self.waited = waited
        self._sources: dict[str, str] = {}
        self._keys: dict[str, tuple[str, ...]] = {}

    def text(self, name: str) -> str:
        """Script ``name``'s file as written (KeyError: not one of this package's)."""
        if name not in self.libs:
            raise KeyError(f"{name}.lua is not among the scripts of {self.package}")
        return files(self.package).joinpath("lua").joinpath(f"{name}.lua").read_text(
            encoding="utf-8")

    def source(self, name: str) -> str:
        """Script ``name`` as Redis runs it: its shebang, its helpers, its body."""
        if name not in self._sources:
            body = self.text(name)
            shebang = ""
            if body.startswith("#!"):
                shebang, _, body = body.partition("\n")
                shebang += "\n"
            parts = [_HELPERS.joinpath(f"{lib}.lua").read_text(encoding="utf-8")
                     for lib in self.libs[name]]
            parts.append(body)
            self._sources[name] = shebang + "\n".join(parts)
        return self._sources[name]

    def header_keys(self, name: str) -> tuple[str, ...]:
        """The names (CrawlKeys attributes) of script ``name``'s fixed KEYS, in order, as
        its header lists them (``keys_in_header``)."""
        try:  # every claim and commit asks: one lookup once known
            return self._keys[name]
        except KeyError:
            found = self._keys[name] = keys_in_header(self.text(name), f"lua/{name}.lua")
            return found

    def register(self, client: Any, *names: str) -> dict[str, Any]:
        """Scripts ``names`` registered on ``client`` (EVALSHA), by name."""
        replicas = getattr(client, "leased_wait_replicas", 0)
        out = {}
        for name in names:
            script = client.register_script(self.source(name))
            if replicas and name in self.waited:
                script = _WaitedScript(client, script, replicas)
            out[name] = _TypeChecked(script) if "lib_keys" in self.libs[name] else script
        return out


def keys_in_header(text: str, where: str) -> tuple[str, ...]:
    """The fixed KEYS a script's header names: the comment lines that open it
    (``-- KEYS[1] lanes  KEYS[2] todo``); the KEYS after them (``KEYS[14..]``,
    ``KEYS[11 + 4i]``) are the caller's to add. Raises ValueError when the header does
    not name KEYS[1..n] once each."""
    found: dict[int, str] = {}
    for line in text.splitlines():
        if line.startswith("#!"):
            continue
        if not line.startswith("--"):
            break
        for index, key in HEADER_KEY.findall(line):
            if found.setdefault(int(index), key) != key:
                raise ValueError(f"{where} names KEYS[{index}] twice")
    if sorted(found) != list(range(1, len(found) + 1)):
        raise ValueError(f"{where}'s header does not name KEYS[1..n]: {found}")
    return tuple(found[i] for i in range(1, len(found) + 1))


#: The frontier's scripts whose reply makes a worker act outside Redis: claim (the worker
#: holds the tokens), commit (its seen cache, the acks it forgets); upsert/ waits for its
#: upsert (the item is stored)
WAITED = frozenset({"claim", "commit"})
#: The frontier's own scripts (lua/ here)
FRONTIER = Scripts("scrapy_leased.frontier", LIBS, WAITED)
script_source = FRONTIER.source
header_keys = FRONTIER.header_keys
register = FRONTIER.register

WAIT_TIMEOUT_MS = 1000  # WAIT gives up after this long and the reply is used anyway
#: After a WAIT that timed out (replicas missing), writes go on without WAIT this long
#: before trying again: a lost replica costs one stall per period, not one per write.
WAIT_PAUSE_SECONDS = 10.0

logger = logging.getLogger(__name__)


#: The error a script returns, before any write, when a key it was given holds another
#: type than it needs (lua/lib_keys.lua): a producer wrote the feed key with XADD or SET.
WRONG_TYPE_PREFIX = "KEYTYPE "


class WrongKeyType(ResponseError):
    """A script refused to run, changing nothing: one of its keys holds the wrong type
    (lua/lib_keys.lua). The message names the key, its type and the one expected. A
    ResponseError (a RedisError): a worker's loops retry it with their back-off, so the
    crawl goes on by itself once the key is fixed. The feed key itself (a producer's
    XADD or SET) and the control state (a SET by hand) are moved aside by the worker
    that meets them (feed/drain.py, scheduler.py)."""

    def __init__(self, message: str) -> None:
        detail = message[len(WRONG_TYPE_PREFIX):]
        #: the key refused (key names hold no spaces: crawl ids have none)
        self.key = detail.split(" ", 1)[0]
        super().__init__(
            f"Redis key {detail}: nothing was changed; delete or "
            "fix the key (the workers try again until then)")


class _TypeChecked:
    """A script that checks its keys' types (lua/lib_keys.lua): its refusal raised as
    WrongKeyType."""

    def __init__(self, script: Any) -> None:
        self._inner = script

    def __getattr__(self, name: str) -> Any:  # sha, script, ... of the script
        return getattr(self._inner, name)

    async def __call__(self, keys: Sequence[Any] = (), args: Sequence[Any] = ()) -> Any:
        try:
            return await self._inner(keys=keys, args=args)
        except ResponseError as exc:
            text = str(exc)
            if text.startswith(WRONG_TYPE_PREFIX):
                raise WrongKeyType(text) from None
            raise


class _WaitedScript:
    """EVALSHA then ``WAIT replicas WAIT_TIMEOUT_MS`` in one pipeline (one connection,
    one round trip); the script is loaded before its first use (a WAIT after a refused
    EVALSHA would wait for nothing) and again after NOSCRIPT (a failover target)."""

    def __init__(self, client: Any, script: Any, replicas: int) -> None:
        self.client = client
        self.script = script
        self.replicas = replicas
        self._loaded = False

    async def __call__(self, keys: Sequence[Any] = (), args: Sequence[Any] = ()) -> Any:
        client = self.client
        if time.monotonic() < getattr(client, "_leased_wait_paused_until", 0.0):
            return await self.script(keys=keys, args=args)
        if not self._loaded:
            self.script.sha = await client.script_load(self.script.script)
            self._loaded = True
        for attempt in (1, 2):
            async with client.pipeline(transaction=False) as p:
                p.evalsha(self.script.sha, len(keys), *keys, *args)
                p.execute_command("WAIT", self.replicas, WAIT_TIMEOUT_MS)
                reply, acked = await p.execute(raise_on_error=False)
            if isinstance(reply, NoScriptError) and attempt == 1:
                self.script.sha = await client.script_load(self.script.script)
                continue
            if isinstance(reply, Exception):
                raise reply
            if isinstance(acked, int) and acked < self.replicas:
                client._leased_wait_paused_until = time.monotonic() + WAIT_PAUSE_SECONDS
                logger.warning(
                    "Only %(n)d of %(want)d replicas (wait_replicas) acknowledged a write "
                    "within %(ms)d ms: writing without WAIT for %(pause).0f s, then trying "
                    "again", {"n": acked, "want": self.replicas, "ms": WAIT_TIMEOUT_MS,
                              "pause": WAIT_PAUSE_SECONDS})
            return reply
        raise AssertionError("unreachable")


def as_str(value: Any) -> str:
    """A Redis reply (bytes, or str with decode_responses) as str."""
    return value.decode() if isinstance(value, bytes) else str(value)


def safe_text(text: str) -> str:
    """``text`` with each lone surrogate written as its escape (``\\ud83d``): what a
    message, a reason or a log line may carry into Redis (redis-py encodes text as
    strict UTF-8)."""
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def pairs(flat: Sequence[Any]) -> list[tuple[Any, Any]]:
    """[a, b, c, d] -> [(a, b), (c, d)]: an HGETALL or WITHSCORES reply of a script."""
    return list(zip(flat[::2], flat[1::2]))


async def read_atomic(script: Any, *commands: tuple[Any, ...]) -> tuple[int, list[Any]]:
    """(Redis time in ms, the replies of ``commands``), each ``(name, key, *args)`` of a
    read-only command, all read in one run of lua/read.lua: a consistent view like
    MULTI/EXEC, which also works on Redis Cluster."""
    keys: list[str] = []
    index: dict[str, int] = {}
    args: list[Any] = [len(commands)]
    for name, key, *rest in commands:
        if key not in index:
            keys.append(key)
            index[key] = len(keys)
        args += [name, index[key], len(rest), *rest]
    out = await script(keys=keys, args=args)
    return int(out[0]) * 1000 + int(out[1]) // 1000, list(out[2:])
