"""The embedded Redis server's life: who uses it, and its watchdog.

Standard library only: the watchdog runs as ``python -m scrapy_leased._redis.watchdog
DATA_DIR LOCK_FD``, a small detached process (its own session, cwd ``/``), and imports
nothing else.

* Every process that uses the embedded server (a worker, a ``scrapy leased`` command)
  holds a shared ``flock`` (LOCK_SH) on ``<data_dir>/users`` for as long as it runs
  (:func:`hold`): the kernel drops it when the process exits, ``kill -9`` included. It is
  taken while holding the exclusive directory lock ``<data_dir>/lock`` (:class:`DirLock`),
  right after the server was found or started.
* The watchdog, started together with the server, loops every :data:`POLL_SECONDS`: it
  takes the directory lock without waiting, then tries LOCK_EX|LOCK_NB on ``users``.
  Once that succeeded (no user) for :data:`GRACE_SECONDS`, it stops the server (SIGTERM:
  Redis fsyncs its AOF and exits), removes the address file and exits, all before it
  releases the directory lock, so a process starting meanwhile waits for the lock and
  then starts a new server. It exits as well when the server is gone (stopped by
  ``scrapy leased embedded stop``, or dead).
* Nobody ever blocks on ``users`` (always LOCK_NB), so no deadlock with the directory lock.
* One watchdog at a time: it holds an exclusive ``flock`` on ``<data_dir>/watchdog.lock``
  for its life, taken by the process that starts it and inherited (``LOCK_FD``), so
  there is no moment when a second one could be started. A server found without a live
  watchdog (one killed, or a server started by an older version) gets one.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ADDRESS_FILE = "address"
LOCK_FILE = "lock"
USERS_FILE = "users"
WATCHDOG_LOCK = "watchdog.lock"
WATCHDOG_LOG = "watchdog.log"
PID_FILE = "redis.pid"
_POLL = 0.05
#: The watchdog looks for users this often.
POLL_SECONDS = 0.5
#: The server stops once it had no user for this long.
GRACE_SECONDS = 2.0
#: How long the watchdog waits for the server to exit after SIGTERM.
STOP_TIMEOUT = 20.0


class EmbeddedRedisError(RuntimeError):
    """The embedded Redis server could not be found, started or reached."""


def wait(seconds: float) -> None:
    """Block for ``seconds`` (every caller runs off the event loop: a thread, a command,
    the watchdog)."""
    threading.Event().wait(seconds)


class DirLock:
    """Exclusive ``flock`` on ``<data_dir>/lock``, polled up to a deadline."""

    def __init__(self, data_dir: Path, timeout: float) -> None:
        self._path = data_dir / LOCK_FILE
        self._timeout = timeout
        self._fd = -1

    def __enter__(self) -> DirLock:
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
                wait(_POLL)
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self._fd)  # closing releases the flock


def read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def pid_running(pid: int) -> bool:
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


def server_pid(data_dir: Path) -> int | None:
    """PID from the pidfile if that process still runs (in ``data_dir``)."""
    text = read(data_dir / PID_FILE)
    if not text.isdigit() or not pid_running(int(text)):
        return None
    pid = int(text)
    try:  # Linux: a recycled pid has another working directory
        if os.path.realpath(f"/proc/{pid}/cwd") != str(data_dir):
            return None
    except OSError:
        pass
    return pid


# -- users -----------------------------------------------------------------------------

_held: dict[Path, int] = {}  # data dir -> fd holding LOCK_SH on its users file
_held_lock = threading.Lock()
_children: list[subprocess.Popen[bytes]] = []  # watchdogs started here (no GC warning)


def hold(data_dir: Path) -> None:
    """Make this process a user of the server of ``data_dir`` until it exits (or
    :func:`release`). Call with the directory lock held: the watchdog then holds no
    lock on ``users``, so LOCK_SH is granted at once."""
    with _held_lock:
        if data_dir in _held:
            return
        fd = os.open(data_dir / USERS_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            raise EmbeddedRedisError(
                f"Could not register as a user of the embedded Redis in {data_dir} "
                f"(flock on {data_dir / USERS_FILE}): {exc}") from exc
        _held[data_dir] = fd


def release(data_dir: Path) -> None:
    """This process no longer uses the server of ``data_dir``."""
    with _held_lock:
        fd = _held.pop(data_dir, None)
    if fd is not None:
        os.close(fd)


def holding(data_dir: Path) -> bool:
    with _held_lock:
        return data_dir in _held


def users(data_dir: Path) -> list[int] | None:
    """PIDs of the processes using the server of ``data_dir`` (from /proc/locks, Linux),
    or None where that cannot be read."""
    try:
        st = os.stat(data_dir / USERS_FILE)
    except FileNotFoundError:
        return []
    except OSError:
        return None
    ident = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return None
    pids = set()
    for line in lines:
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[3] == "READ" \
                and fields[5] == ident and fields[4].isdigit():
            pids.add(int(fields[4]))
    return sorted(pids)


def has_users(data_dir: Path) -> bool:
    """True when some process holds the users lock (call with the directory lock held)."""
    fd = os.open(data_dir / USERS_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases it, if taken
    return False


# -- the watchdog ----------------------------------------------------------------------


def ensure_watchdog(data_dir: Path) -> bool:
    """Start the watchdog of ``data_dir`` unless one runs; True if started. Call with the
    directory lock held, once the server answers."""
    fd = os.open(data_dir / WATCHDOG_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # one runs
        with open(data_dir / WATCHDOG_LOG, "ab") as log:
            # The child inherits the locked file description: the lock stays held
            # from now until the watchdog exits.
            _children.append(subprocess.Popen(
                [sys.executable, "-m", __name__, str(data_dir), str(fd)],
                pass_fds=(fd,), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True, cwd="/", close_fds=True))
        for child in list(_children):  # reap the watchdogs that exited
            if child.poll() is not None:
                _children.remove(child)
        return True
    finally:
        os.close(fd)


def _stop(data_dir: Path, pid: int) -> None:
    """SIGTERM the server (it fsyncs its AOF), wait for it to exit, drop its address."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + STOP_TIMEOUT
    while pid_running(pid):
        if time.monotonic() >= deadline:
            raise EmbeddedRedisError(f"embedded Redis (pid {pid}) did not exit on SIGTERM")
        wait(_POLL)
    (data_dir / ADDRESS_FILE).unlink(missing_ok=True)


def _try_dir_lock(data_dir: Path) -> int | None:
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def watch(data_dir: Path, lock_fd: int) -> int:
    """The watchdog's loop; returns its exit status."""
    empty_since: float | None = None
    while True:
        dir_fd = _try_dir_lock(data_dir)
        if dir_fd is None:  # someone is starting or stopping the server: look again soon
            wait(_POLL)
            continue
        try:
            pid = server_pid(data_dir)
            if pid is None:  # stopped by a command, or died: nothing to watch
                os.close(lock_fd)  # before the directory lock: a new server gets its own
                return 0
            now = time.monotonic()
            if has_users(data_dir):
                empty_since = None
            elif empty_since is None:
                empty_since = now
            elif now - empty_since >= GRACE_SECONDS:
                _log(f"no user for {now - empty_since:.1f} s: stopping the server "
                     f"(pid {pid})")
                try:
                    _stop(data_dir, pid)
                except EmbeddedRedisError as exc:
                    _log(str(exc))
                    empty_since = None
                    continue  # look again
                os.close(lock_fd)
                _log("stopped")
                return 0
        finally:
            os.close(dir_fd)
        wait(POLL_SECONDS)


def _log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} [{os.getpid()}] {message}", flush=True)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not argv[1].isdigit():
        print("usage: python -m scrapy_leased._redis.watchdog DATA_DIR LOCK_FD",
              file=sys.stderr)
        return 2
    data_dir = Path(argv[0])
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _log(f"watching the embedded Redis in {data_dir}")
    return watch(data_dir, int(argv[1]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
