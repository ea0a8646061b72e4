"""Real Redis Sentinel groups and Redis Clusters for tests, on free 127.0.0.1 ports.

    group = SentinelGroup(replicas=2, sentinels=3).start()
    group.url                # redis+sentinel://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3/mymaster/0
    group.master()           # the RedisServer Sentinel names as master now
    old = group.kill_master()            # kill -9
    new = group.wait_failover(old)       # every sentinel names a promoted replica
    group.close()

    cluster = RedisCluster(masters=3, replicas=1).start()   # redis-cli --cluster create
    cluster.url              # redis+cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3
    cluster.owner(slot)      # the RedisServer serving a slot
    cluster.migrate_slot(slot, dest)     # what redis-cli --cluster reshard does, one slot
    cluster.kill(node); cluster.wait_failover(node)
    cluster.close()

Every process is a ``RedisServer`` (tests/support/redis_server.py): killed at exit, on
its own port and temp dir. Sentinels run as ``redis-server <conf> --sentinel``. The
cluster is created with ``redis-cli --cluster create`` (``redis-cli`` or
``valkey-cli``: beside the server binary, else on PATH; ``LEASED_TEST_REDIS_CLI``
names another). ``repl-diskless-sync-delay 0`` everywhere, so a replica syncs at once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from typing_extensions import Self

from .redis_server import RedisServer, _PortInUse, find_redis_server, free_port

SENTINEL_MASTER = "mymaster"
FAST_REPL = {"repl-diskless-sync-delay": "0", "repl-diskless-load": "disabled"}


def wait_until(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while True:
        try:
            value = pred()
            if value:
                return value
        except (redis.RedisError, OSError) as exc:  # a node restarting, a link not up yet
            last_exc = exc
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout}s"
                               + (f" (last error: {last_exc!r})" if last_exc else ""))
        time.sleep(interval)


def find_redis_cli(server: str | None = None) -> str:
    env = os.environ.get("LEASED_TEST_REDIS_CLI")
    if env:
        return shutil.which(env) or env
    server = server or find_redis_server()
    name = Path(server).name
    for cli in (name.replace("-server", "-cli"), "redis-cli", "valkey-cli"):
        beside = Path(server).with_name(cli)
        if beside.is_file() and os.access(beside, os.X_OK):
            return str(beside)
    for cli in ("redis-cli", "valkey-cli"):
        found = shutil.which(cli)
        if found:
            return found
    raise RuntimeError("no redis-cli found: put redis-cli (Debian: redis-tools) on PATH or set "
                       "LEASED_TEST_REDIS_CLI")


# --------------------------------------------------------------------------- Sentinel


@dataclass(frozen=True)
class Watch:
    """The master a sentinel watches, and how."""

    master_port: int
    quorum: int
    down_after_ms: int
    failover_timeout_ms: int
    master_name: str = SENTINEL_MASTER
    auth_pass: str | None = None


class SentinelServer(RedisServer):
    """``redis-server sentinel.conf --sentinel`` watching one master."""

    def __init__(self, master_port: int, *, password: str | None = None,
                 **watch: Any) -> None:
        super().__init__(password=password)
        #: what it watches and how: ``Watch``'s fields
        self.watch = Watch(master_port, **watch)
        self.master_name = self.watch.master_name

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def _write_config(self) -> Path:
        name, w = self.master_name, self.watch
        lines = self._base_config() + [
            f"sentinel monitor {name} 127.0.0.1 {w.master_port} {w.quorum}",
            f"sentinel down-after-milliseconds {name} {w.down_after_ms}",
            f"sentinel failover-timeout {name} {w.failover_timeout_ms}",
            f"sentinel parallel-syncs {name} 1",
        ]
        if w.auth_pass:
            lines.append(f"sentinel auth-pass {name} {w.auth_pass}")
        if self.password:  # clients and the other sentinels authenticate with it
            lines += [f"requirepass {self.password}", f"sentinel sentinel-pass {self.password}"]
        conf = self.dir / "sentinel.conf"
        conf.write_text("\n".join(lines) + "\n")
        return conf

    def _command(self, conf: Path) -> list[str]:
        return [self.executable, str(conf), "--sentinel"]

    def master_address(self) -> tuple[str, int] | None:
        c = self.client()
        try:
            addr = c.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master_name)
        finally:
            c.close()
        return (addr[0].decode(), int(addr[1])) if addr else None

    def master_state(self) -> dict[str, Any]:
        c = self.client(decode_responses=True)
        try:
            return c.sentinel_master(self.master_name)
        finally:
            c.close()


class SentinelGroup:
    """A master, ``replicas`` replicas and ``sentinels`` sentinels (quorum: a majority)."""

    def __init__(self, replicas: int = 2, sentinels: int = 3, *, password: str | None = None,
                 sentinel_password: str | None = None, appendonly: bool = False,
                 **watch: Any) -> None:
        self.n_replicas, self.n_sentinels = replicas, sentinels
        self.password, self.sentinel_password = password, sentinel_password
        self.appendonly = appendonly
        #: how the sentinels watch the master (``Watch``'s fields but its port and quorum)
        self.watch: dict[str, Any] = {"down_after_ms": 1000, "failover_timeout_ms": 10_000,
                                      "master_name": SENTINEL_MASTER, **watch}
        self.master_name: str = self.watch["master_name"]
        self.servers: list[RedisServer] = []  # data nodes: the first master, then replicas
        self.sentinels: list[SentinelServer] = []

    def start(self, timeout: float = 30) -> Self:
        try:
            master = RedisServer(appendonly=self.appendonly, password=self.password,
                                 extra_config=dict(FAST_REPL)).start()
            self.servers.append(master)
            for _ in range(self.n_replicas):
                self.servers.append(RedisServer(
                    appendonly=self.appendonly, password=self.password,
                    extra_config={**FAST_REPL, "replicaof": f"127.0.0.1 {master.port}"}).start())
            wait_until(lambda: self.connected_replicas(master) == self.n_replicas, timeout,
                       f"{self.n_replicas} replicas in sync")
            quorum = self.n_sentinels // 2 + 1
            for _ in range(self.n_sentinels):
                self.sentinels.append(SentinelServer(
                    master.port, quorum=quorum, auth_pass=self.password,
                    password=self.sentinel_password, **self.watch).start())
            wait_until(self._sentinels_know_everything, timeout,
                       "sentinels that know every replica and each other")
        except BaseException:
            self.close()
            raise
        return self

    def _sentinels_know_everything(self) -> bool:
        for s in self.sentinels:
            state = s.master_state()
            if int(state["num-slaves"]) != self.n_replicas or \
                    int(state["num-other-sentinels"]) != self.n_sentinels - 1:
                return False
        return True

    @staticmethod
    def connected_replicas(server: RedisServer) -> int:
        """Replicas connected to ``server`` and online (INFO replication)."""
        c = server.client(decode_responses=True, socket_timeout=2)
        try:
            info = c.info("replication")
        finally:
            c.close()
        return sum(1 for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)
                   and v.get("state") == "online")

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        query = f"?sentinel_password={self.sentinel_password}" if self.sentinel_password else ""
        return f"redis+sentinel://{auth}{hosts}/{self.master_name}/0{query}"

    def server_on(self, port: int) -> RedisServer:
        for srv in self.servers:
            if srv.port == port:
                return srv
        raise KeyError(port)

    def master(self) -> RedisServer:
        addr = self.sentinels[0].master_address()
        assert addr is not None
        return self.server_on(addr[1])

    def client(self, **kwargs: Any) -> redis.Redis:
        """A sync client of the current master (as named by the first sentinel)."""
        return self.master().client(**kwargs)

    def kill_master(self) -> RedisServer:
        """kill -9 the current master; returns it (its dir is kept)."""
        old = self.master()
        old.kill()
        return old

    def wait_failover(self, old: RedisServer, timeout: float = 60) -> RedisServer:
        """Wait until every sentinel names another master and that server is a master
        with the other live replicas attached; returns it. Then the sentinels wait 10 min
        before they take a master for down (``down-after-milliseconds``), so that a test
        sees exactly the one failover it caused: with 1 s, a promoted master kept busy
        by a loaded machine was failed over again, to a replica behind it, and the
        writes the workers made after the first failover were rolled back."""
        def promoted() -> RedisServer | None:
            ports = {s.master_address()[1] for s in self.sentinels if s.running}  # type: ignore[index]
            if len(ports) != 1 or old.port in ports:
                return None
            new = self.server_on(ports.pop())
            c = new.client(decode_responses=True, socket_timeout=2)
            try:
                if c.info("replication").get("role") != "master":
                    return None
            finally:
                c.close()
            live = sum(1 for srv in self.servers if srv.running) - 1
            return new if self.connected_replicas(new) == live else None

        new = wait_until(promoted, timeout, "a completed Sentinel failover")
        for sentinel in self.sentinels:
            if sentinel.running:
                c = sentinel.client()
                try:
                    c.execute_command("SENTINEL", "SET", sentinel.master_name,
                                      "down-after-milliseconds", "600000")
                finally:
                    c.close()
        return new

    def close(self) -> None:
        for srv in self.sentinels + self.servers:
            srv.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- Cluster


class ClusterNodeServer(RedisServer):
    """A ``cluster-enabled yes`` node; its cluster bus on its own free port."""

    def __init__(self, node_timeout_ms: int, password: str | None = None) -> None:
        super().__init__(password=password, extra_config={
            **FAST_REPL, "cluster-enabled": "yes", "cluster-config-file": "nodes.conf",
            "cluster-node-timeout": str(node_timeout_ms),
            # a replica of a dead master takes over however stale (tests kill masters)
            "cluster-replica-validity-factor": "0"})
        self.bus_port: int | None = None

    def _write_config(self) -> Path:
        if self.bus_port is None:
            self.bus_port = free_port()
        self.extra_config["cluster-port"] = str(self.bus_port)
        return super()._write_config()

    def _spawn_and_wait(self, timeout: float) -> None:
        try:
            super()._spawn_and_wait(timeout)
        except _PortInUse:
            self.bus_port = None
            raise

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def node_id(self) -> str:
        c = self.client(decode_responses=True)
        try:
            return c.execute_command("CLUSTER", "MYID")
        finally:
            c.close()


class RedisCluster:
    """``masters`` masters with ``replicas`` replicas each, made by
    ``redis-cli --cluster create``."""

    def __init__(self, masters: int = 3, replicas: int = 1, *, node_timeout_ms: int = 1000,
                 password: str | None = None) -> None:
        self.n_masters = masters
        self.n_replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.password = password
        self.nodes: list[ClusterNodeServer] = []
        self.cli = find_redis_cli()

    def new_node(self) -> ClusterNodeServer:
        """A node of this cluster, not started."""
        return ClusterNodeServer(self.node_timeout_ms, self.password)

    def start(self, timeout: float = 60) -> Self:
        try:
            for _ in range(self.n_masters * (1 + self.n_replicas)):
                self.nodes.append(self.new_node().start())
            cmd = [self.cli, "--cluster", "create", *(n.address for n in self.nodes),
                   "--cluster-replicas", str(self.n_replicas), "--cluster-yes"]
            env = dict(os.environ)
            if self.password:
                env["REDISCLI_AUTH"] = self.password
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
            if out.returncode != 0 or "[OK] All 16384 slots covered" not in out.stdout:
                raise RuntimeError(f"redis-cli --cluster create failed ({out.returncode}):\n"
                                   f"{out.stdout}\n{out.stderr}")
            self.wait_ok(timeout)
        except BaseException:
            self.close()
            raise
        return self

    # -- topology ----------------------------------------------------------
    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return "redis+cluster://" + auth + ",".join(n.address for n in self.nodes[:3])

    def live(self) -> list[ClusterNodeServer]:
        return [n for n in self.nodes if n.running]

    def node_on(self, port: int) -> ClusterNodeServer:
        for n in self.nodes:
            if n.port == port:
                return n
        raise KeyError(port)

    def _slots(self, node: ClusterNodeServer) -> list[tuple[int, int, int, list[int]]]:
        """CLUSTER SLOTS as node sees it: (start, end, master port, replica ports)."""
        c = node.client()
        try:
            raw = c.execute_command("CLUSTER SLOTS")
        finally:
            c.close()
        if isinstance(raw, dict):  # redis-py parses it into {(start, end): {...}}
            return sorted((s, e, int(v["primary"][1]), [int(r[1]) for r in v["replicas"]])
                          for (s, e), v in raw.items())
        return sorted((int(r[0]), int(r[1]), int(r[2][1]), [int(x[1]) for x in r[3:]])
                      for r in raw)

    def wait_ok(self, timeout: float = 60) -> None:
        """Every live node says cluster_state:ok, they agree on who serves every slot, each
        master has its replicas online."""
        def ok() -> bool:
            views = []
            for n in self.live():
                c = n.client(decode_responses=True, socket_timeout=2)
                try:
                    info = c.execute_command("CLUSTER INFO")
                    state = info.get("cluster_state") if isinstance(info, dict) else str(info)
                    if state != "ok" and "cluster_state:ok" not in str(state):
                        return False
                finally:
                    c.close()
                views.append(self._slots(n))
            if any(v != views[0] for v in views):
                return False
            masters = {m for _, _, m, _ in views[0]}
            return all(SentinelGroup.connected_replicas(self.node_on(m)) ==
                       sum(1 for r in self.replicas_of(m) if r.running) for m in masters)
        wait_until(ok, timeout, "a cluster in state ok, agreed by every node")

    def replicas_of(self, master_port: int) -> list[ClusterNodeServer]:
        c = self.live()[0].client(decode_responses=True)
        try:
            nodes = c.execute_command("CLUSTER NODES")
        finally:
            c.close()
        text = nodes if isinstance(nodes, str) else "\n".join(
            f"{v['node_id']} {k} {v['flags']} {v['master_id']}" for k, v in nodes.items())
        by_id = {}
        rows = []
        for line in text.splitlines():
            parts = line.split()
            port = int(parts[1].split("@")[0].rsplit(":", 1)[1])
            by_id[parts[0]] = port
            rows.append((port, parts[2], parts[3]))
        master_id = next(i for i, p in by_id.items() if p == master_port)
        return [self.node_on(port) for port, flags, mid in rows
                if mid == master_id and "fail" not in flags]

    def masters(self) -> list[ClusterNodeServer]:
        return [self.node_on(p) for p in sorted({m for _, _, m, _ in self._slots(self.live()[0])})]

    def owner(self, slot: int) -> ClusterNodeServer:
        for start, end, master, _ in self._slots(self.live()[0]):
            if start <= slot <= end:
                return self.node_on(master)
        raise KeyError(slot)

    @staticmethod
    def keyslot(key: str) -> int:
        from redis.crc import key_slot

        return key_slot(key.encode())

    def client(self, **kwargs: Any) -> redis.cluster.RedisCluster:
        """A sync redis-py cluster client (for the test side)."""
        from redis.cluster import ClusterNode
        from redis.cluster import RedisCluster as SyncCluster

        kwargs.setdefault("password", self.password)
        return SyncCluster(startup_nodes=[ClusterNode("127.0.0.1", n.port) for n in self.live()],
                           **kwargs)

    # -- faults ------------------------------------------------------------
    def migrate_slot(self, slot: int, dest: ClusterNodeServer, batch: int = 10,
                     pause: float = 0.0, on_batch: Callable[[int], None] | None = None) -> int:
        """Move one slot to ``dest`` the way ``redis-cli --cluster reshard`` does:
        IMPORTING on the target, MIGRATING on the source, MIGRATE its keys ``batch`` at a
        time (``pause`` seconds apart, so clients meet ASK and TRYAGAIN), then SETSLOT
        NODE on the target, the source and the other masters. Returns the keys moved."""
        src = self.owner(slot)
        if src is dest:
            raise ValueError(f"slot {slot} is already on {dest.address}")
        src_id, dest_id = src.node_id(), dest.node_id()
        s, d = src.client(), dest.client()
        moved = 0
        try:
            d.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
            s.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dest_id)
            while True:
                keys = s.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch)
                if not keys:
                    break
                args: list[Any] = ["MIGRATE", "127.0.0.1", dest.port, "", 0, 10_000]
                if self.password:
                    args += ["AUTH", self.password]
                s.execute_command(*args, "KEYS", *keys)
                moved += len(keys)
                if on_batch is not None:
                    on_batch(moved)
                if pause:
                    time.sleep(pause)
            for node in [dest, src] + [m for m in self.masters() if m not in (src, dest)]:
                c = node.client()
                try:
                    c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dest_id)
                finally:
                    c.close()
        finally:
            s.close()
            d.close()
        wait_until(lambda: all(self._owner_seen_by(n, slot) == dest.port for n in self.live()),
                   30, f"every node seeing slot {slot} on {dest.address}")
        return moved

    def _owner_seen_by(self, node: ClusterNodeServer, slot: int) -> int | None:
        for start, end, master, _ in self._slots(node):
            if start <= slot <= end:
                return master
        return None

    def kill(self, node: ClusterNodeServer) -> None:
        node.kill()

    def wait_failover(self, dead: ClusterNodeServer, timeout: float = 60) -> None:
        """Wait until the slots of ``dead`` are served by a promoted replica and the
        cluster is ok again."""
        def promoted() -> bool:
            view = self._slots(self.live()[0])
            return all(m != dead.port for _, _, m, _ in view)
        wait_until(promoted, timeout, f"a replica of {dead.address} promoted")
        self.wait_ok(timeout)
        # Exactly the one failover the test caused: with a 1 s node timeout, a node kept
        # busy by a loaded machine can be failed over again, rolling back later writes.
        for n in self.live():
            c = n.client()
            try:
                c.config_set("cluster-node-timeout", "600000")
            finally:
                c.close()

    def close(self) -> None:
        for n in self.nodes:
            n.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class SlotMove:
    """One hash slot moved by hand from the master ``source`` to the master ``dest``, as
    ``redis-cli --cluster reshard`` moves it: ``begin`` marks it IMPORTING / MIGRATING
    and moves the keys named (the others stay behind: ASK for the moved ones, TRYAGAIN
    for a command spanning both), ``finish`` moves the rest and gives the slot to
    ``dest`` on the masters named."""

    def __init__(self, slot: int, source: ClusterNodeServer, dest: ClusterNodeServer) -> None:
        self.slot, self.source, self.dest = slot, source, dest
        self.src, self.dst = source.client(), dest.client()

    def begin(self, *keys: str) -> None:
        self.dst.execute_command("CLUSTER", "SETSLOT", self.slot, "IMPORTING",
                                 self.source.node_id())
        self.src.execute_command("CLUSTER", "SETSLOT", self.slot, "MIGRATING",
                                 self.dest.node_id())
        self._migrate(list(keys))
        assert self.dst.execute_command("CLUSTER", "COUNTKEYSINSLOT", self.slot) == len(keys)

    def _migrate(self, keys: list[Any]) -> None:
        self.src.execute_command("MIGRATE", "127.0.0.1", self.dest.port, "", 0, 5000,
                                 "KEYS", *keys)

    def finish(self, masters: list[ClusterNodeServer]) -> None:
        while keys := self.src.execute_command("CLUSTER", "GETKEYSINSLOT", self.slot, 100):
            self._migrate(keys)
        for node in masters:
            c = node.client()
            try:
                c.execute_command("CLUSTER", "SETSLOT", self.slot, "NODE", self.dest.node_id())
            finally:
                c.close()
