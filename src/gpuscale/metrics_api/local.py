"""The metrics API on one machine, with no Kubernetes API server: the plain-HPA path tried
locally (``gpuscale demo --hpa``).

In a cluster the metrics API authenticates the aggregation layer by its client
certificate and asks the API server whether each user may read (SubjectAccessReview). On
a laptop neither exists, so local mode stands in for both, and only where nothing else
can reach it:

- it binds a loopback address only (``check_loopback``: any other is a ConfigError);
- it makes its own CA and a serving certificate for 127.0.0.1, ::1 and localhost, in a
  directory it owns (mode 0700), and a random bearer token (256 bits);
- a request with that token is the local user, who may read every metric; any other
  request is 401, as in a cluster without credentials;
- it writes a kubeconfig (the CA, the server, the token) so that ``kubectl get --raw
  /apis/custom.metrics.k8s.io/...`` reads it as the HPA controller would.
"""

from __future__ import annotations

import datetime
import hmac
import ipaddress
import os
import secrets
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpuscale.common.errors import ConfigError
from gpuscale.metrics_api.authn import User
from gpuscale.metrics_api.authz import Attributes, Decision

LOCAL_USER = User("gpuscale-local", ("system:authenticated",), via="local token")
VALID_DAYS = 7  # a local run's certificate; a new run makes a new one


def check_loopback(host: str) -> None:
    """ConfigError unless ``host`` is a loopback address (local mode serves this machine
    only: its token is printed on a terminal)."""
    try:
        loopback = ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        raise ConfigError(f"the local metrics API binds loopback only (127.0.0.1 or ::1), "
                          f"not {host!r}: it has no cluster to authenticate callers")


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


@dataclass(frozen=True, slots=True)
class LocalAccess:
    """One local run's credentials: ``dir`` holds ``ca.crt``, ``serving.crt``,
    ``serving.key`` (and ``kubeconfig`` once written); ``token`` is the bearer token."""

    dir: Path
    token: str

    @property
    def cert(self) -> Path:
        return self.dir / "serving.crt"

    @property
    def key(self) -> Path:
        return self.dir / "serving.key"

    @property
    def ca(self) -> Path:
        return self.dir / "ca.crt"

    @classmethod
    def create(cls, directory: Path) -> LocalAccess:
        """A new CA, serving certificate and token in ``directory`` (made 0700)."""
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        directory.chmod(0o700)
        now = datetime.datetime.now(datetime.UTC)
        until = now + datetime.timedelta(days=VALID_DAYS)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca = (x509.CertificateBuilder().subject_name(_name("gpuscale-local-ca"))
              .issuer_name(_name("gpuscale-local-ca")).public_key(ca_key.public_key())
              .serial_number(x509.random_serial_number()).not_valid_before(now)
              .not_valid_after(until)
              .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
              .add_extension(x509.KeyUsage(False, False, False, False, False, True, True,
                                           False, False), critical=True)
              .sign(ca_key, hashes.SHA256()))
        key = ec.generate_private_key(ec.SECP256R1())
        names: list[x509.GeneralName] = [
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address("::1"))]
        leaf = (x509.CertificateBuilder().subject_name(_name("gpuscale-metrics-local"))
                .issuer_name(ca.subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(now)
                .not_valid_after(until)
                .add_extension(x509.SubjectAlternativeName(names), critical=False)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                               critical=False)
                .sign(ca_key, hashes.SHA256()))
        pem = serialization.Encoding.PEM
        access = cls(directory, secrets.token_urlsafe(32))
        access.ca.write_bytes(ca.public_bytes(pem))
        access.cert.write_bytes(leaf.public_bytes(pem) + ca.public_bytes(pem))
        _write_private(access.key, key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        return access

    def context(self) -> ssl.SSLContext:
        """TLS 1.2+ with the serving certificate; no client certificate asked for."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert, self.key)
        return ctx

    def authenticate(self, peer: bytes | None,
                     headers: Iterable[tuple[str, str]]) -> User | None:
        """The local user for a request bearing the token; None (401) for any other."""
        for name, value in headers:
            if name.lower() == "authorization":
                scheme, _, given = value.partition(" ")
                given = given.strip()
                if scheme.lower() == "bearer" and given.isascii() and hmac.compare_digest(
                        given.encode(), self.token.encode()):
                    return LOCAL_USER
        return None

    async def check(self, user: User, attrs: Attributes) -> Decision:
        """The local user may read every metric (there is no cluster to ask)."""
        return Decision(user == LOCAL_USER, "local mode: the token's holder reads all")

    def write_kubeconfig(self, port: int, host: str = "127.0.0.1") -> Path:
        """A kubeconfig for kubectl against the local metrics API (0600)."""
        server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
        doc = {"apiVersion": "v1", "kind": "Config", "current-context": "gpuscale-local",
               "clusters": [{"name": "gpuscale-local", "cluster": {
                   "server": server, "certificate-authority": str(self.ca)}}],
               "users": [{"name": "gpuscale-local", "user": {"token": self.token}}],
               "contexts": [{"name": "gpuscale-local", "context": {
                   "cluster": "gpuscale-local", "user": "gpuscale-local"}}]}
        path = self.dir / "kubeconfig"
        _write_private(path, yaml.safe_dump(doc, sort_keys=False).encode())
        return path
