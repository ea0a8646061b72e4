"""TLS for the test Redis servers: certificates made with ``cryptography``, and a
Sentinel group and a Cluster whose clients speak TLS only.

    certs = TLSFiles.make(tmp_path)      # a CA, a server and a client certificate
    group = TLSSentinelGroup(certs).start()
    group.url            # rediss+sentinel://127.0.0.1:T1,.../mymaster/0?ssl_ca_certs=...
    cluster = TLSCluster(certs).start()
    cluster.url          # rediss+cluster://127.0.0.1:T1,...?ssl_ca_certs=...

Every server listens twice: on its plain port (``srv.port``: the test's own probes and
helpers of redis_ha.py) and on a TLS port (``srv.tls_port``), with ``tls-replication
yes`` (replicas and sentinels reach the master over TLS, and announce their TLS ports)
and ``tls-cluster yes`` (the cluster bus is TLS, and CLUSTER SLOTS names the TLS port
to a TLS client). The URLs name only TLS ports, the sentinels answer only TLS ports, and
the servers require a client certificate signed by the CA (``tls-auth-clients yes``).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from typing_extensions import Self

from .redis_ha import (
    FAST_REPL,
    ClusterNodeServer,
    RedisCluster,
    SentinelGroup,
    SentinelServer,
    wait_until,
)
from .redis_server import RedisServer, free_port


@dataclass(frozen=True)
class TLSFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    @classmethod
    def make(cls, directory: Path) -> TLSFiles:
        """A CA, and a server and a client certificate it signs (for 127.0.0.1 and
        localhost, so that hostname checks pass), in ``directory``."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        directory.mkdir(parents=True, exist_ok=True)
        now = datetime.datetime.now(datetime.timezone.utc)

        def name(cn: str) -> x509.Name:
            return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

        def write_key(key: Any, path: Path) -> None:
            path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                               serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))

        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca = (x509.CertificateBuilder().subject_name(name("leased test CA"))
              .issuer_name(name("leased test CA")).public_key(ca_key.public_key())
              .serial_number(x509.random_serial_number())
              .not_valid_before(now - datetime.timedelta(minutes=5))
              .not_valid_after(now + datetime.timedelta(days=2))
              .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
              .add_extension(x509.KeyUsage(
                  digital_signature=True, content_commitment=False, key_encipherment=False,
                  data_encipherment=False, key_agreement=False, key_cert_sign=True,
                  crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
              .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                             critical=False)
              .sign(ca_key, hashes.SHA256()))
        paths = {"ca": directory / "ca.crt"}
        paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        for who in ("server", "client"):
            key = ec.generate_private_key(ec.SECP256R1())
            cert = (x509.CertificateBuilder().subject_name(name(f"leased test {who}"))
                    .issuer_name(ca.subject).public_key(key.public_key())
                    .serial_number(x509.random_serial_number())
                    .not_valid_before(now - datetime.timedelta(minutes=5))
                    .not_valid_after(now + datetime.timedelta(days=1))
                    .add_extension(x509.SubjectAlternativeName([
                        x509.DNSName("localhost"),
                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
                    .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                        ca_key.public_key()), critical=False)
                    .sign(ca_key, hashes.SHA256()))
            paths[f"{who}_cert"] = directory / f"{who}.crt"
            paths[f"{who}_key"] = directory / f"{who}.key"
            paths[f"{who}_cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
            write_key(key, paths[f"{who}_key"])
        return cls(**paths)

    def server_config(self, tls_port: int) -> dict[str, str]:
        """redis.conf lines of a server (or sentinel) that also listens on ``tls_port``."""
        return {"tls-port": str(tls_port), "tls-cert-file": str(self.server_cert),
                "tls-key-file": str(self.server_key), "tls-ca-cert-file": str(self.ca),
                "tls-auth-clients": "yes", "tls-replication": "yes"}

    def query(self) -> str:
        """The URL options of a client: the CA and the client certificate."""
        return "&".join(f"{k}={quote(str(v))}" for k, v in (
            ("ssl_ca_certs", self.ca), ("ssl_certfile", self.client_cert),
            ("ssl_keyfile", self.client_key)))

    def client_kwargs(self) -> dict[str, Any]:
        return {"ssl": True, "ssl_ca_certs": str(self.ca), "ssl_certfile": str(self.client_cert),
                "ssl_keyfile": str(self.client_key)}


def _with_tls(srv: RedisServer, tls: TLSFiles) -> RedisServer:
    srv.tls_port = free_port()  # type: ignore[attr-defined]
    srv.extra_config.update(tls.server_config(srv.tls_port))  # type: ignore[attr-defined]
    return srv


class TLSSentinelServer(SentinelServer):
    def __init__(self, tls: TLSFiles, master_port: int, **kwargs: Any) -> None:
        super().__init__(master_port, **kwargs)
        self.tls = tls
        self.tls_port = free_port()

    def _write_config(self) -> Path:
        conf = super()._write_config()
        extra = self.tls.server_config(self.tls_port)
        with conf.open("a") as f:
            f.write("".join(f"{k} {v}\n" for k, v in extra.items()))
        return conf


class TLSSentinelGroup(SentinelGroup):
    """A master, replicas and sentinels that speak TLS to each other and to clients
    (the sentinels monitor the master's TLS port and answer TLS ports)."""

    def __init__(self, tls: TLSFiles, replicas: int = 1, sentinels: int = 3,
                 **kwargs: Any) -> None:
        super().__init__(replicas, sentinels, **kwargs)
        self.tls = tls

    def start(self, timeout: float = 30) -> Self:
        try:
            master = _with_tls(RedisServer(extra_config=dict(FAST_REPL)), self.tls).start()
            self.servers.append(master)
            for _ in range(self.n_replicas):
                self.servers.append(_with_tls(RedisServer(extra_config={
                    **FAST_REPL, "replicaof": f"127.0.0.1 {master.tls_port}"}),  # type: ignore[attr-defined]
                    self.tls).start())
            wait_until(lambda: self.connected_replicas(master) == self.n_replicas, timeout,
                       f"{self.n_replicas} replicas in sync over TLS")
            for _ in range(self.n_sentinels):
                self.sentinels.append(TLSSentinelServer(
                    self.tls, master.tls_port,  # type: ignore[attr-defined]
                    quorum=self.n_sentinels // 2 + 1, **self.watch).start())
            wait_until(self._sentinels_know_everything, timeout,
                       "sentinels that know every replica and each other over TLS")
        except BaseException:
            self.close()
            raise
        return self

    def server_on(self, port: int) -> RedisServer:
        for srv in self.servers:
            if port in (srv.port, getattr(srv, "tls_port", None)):
                return srv
        raise KeyError(port)

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.tls_port}" for s in self.sentinels)  # type: ignore[attr-defined]
        return f"rediss+sentinel://{hosts}/{self.master_name}/0?{self.tls.query()}"


class TLSCluster(RedisCluster):
    """``masters`` masters (and replicas) with a TLS cluster bus and TLS clients."""

    def __init__(self, tls: TLSFiles, masters: int = 3, replicas: int = 0,
                 **kwargs: Any) -> None:
        super().__init__(masters, replicas, **kwargs)
        self.tls = tls

    def new_node(self) -> ClusterNodeServer:
        node = ClusterNodeServer(self.node_timeout_ms)
        _with_tls(node, self.tls).extra_config["tls-cluster"] = "yes"
        return node

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{n.tls_port}" for n in self.nodes[:3])  # type: ignore[attr-defined]
        return f"rediss+cluster://{hosts}?{self.tls.query()}"
