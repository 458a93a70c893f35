"""The certificates a kube-apiserver with the aggregation layer needs: a cluster CA (serving
and client certificates, the service-account key), and a front-proxy CA whose client
certificate the API server presents to aggregated API servers (KEDA's metrics apiserver,
gpuscale's custom metrics API)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_DAY = datetime.timedelta(days=1)
FRONT_PROXY_CLIENT = "front-proxy-client"


@dataclass(frozen=True, slots=True)
class Pair:
    cert: Path
    key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    path.chmod(0o600)


def _save(directory: Path, name: str, cert: x509.Certificate,
          key: ec.EllipticCurvePrivateKey) -> Pair:
    pair = Pair(directory / f"{name}.crt", directory / f"{name}.key")
    _write(pair.cert, cert.public_bytes(serialization.Encoding.PEM))
    _write(pair.key, key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return pair


def _builder(subject: x509.Name, issuer: x509.Name,
             key: ec.EllipticCurvePrivateKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - _DAY).not_valid_after(now + 365 * _DAY))


class Authority:
    """A CA kept on disk as ``<name>.crt``/``<name>.key`` that issues leaf certificates."""

    def __init__(self, directory: Path, name: str) -> None:
        self.directory = directory
        self._key = _key()
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        cert = (_builder(self._name, self._name, self._key)
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(False, False, False, False, False, True, True,
                                             False, False), critical=True)
                .sign(self._key, hashes.SHA256()))
        self.pair = _save(directory, name, cert, self._key)

    def issue(self, name: str, common_name: str, *, groups: tuple[str, ...] = (),
              hosts: tuple[str, ...] = (), client: bool = True, server: bool = False) -> Pair:
        key = _key()
        subject = x509.Name([*(x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups),
                             x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        usages = ([ExtendedKeyUsageOID.CLIENT_AUTH] if client else []) + (
            [ExtendedKeyUsageOID.SERVER_AUTH] if server else [])
        b = (_builder(subject, self._name, key)
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
             .add_extension(x509.ExtendedKeyUsage(usages), critical=False))
        if hosts:
            b = b.add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]),
                                critical=False)
        return _save(self.directory, name, b.sign(self._key, hashes.SHA256()), key)


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _service_account_keys(directory: Path) -> Pair:
    """The key that signs service-account tokens (PEM "EC PRIVATE KEY", as the API server
    and the controller manager read it) and its public half (what checks them)."""
    key = _key()
    pair = Pair(directory / "service-account.pub", directory / "service-account.key")
    _write(pair.key, key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.TraditionalOpenSSL,
                                       serialization.NoEncryption()))
    _write(pair.cert, key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return pair


@dataclass(frozen=True, slots=True)
class ClusterPki:
    ca: Pair
    apiserver: Pair
    admin: Pair
    front_proxy_ca: Pair
    front_proxy_client: Pair
    service_account: Pair  # ``key`` signs tokens, ``cert`` (a public key) checks them
    directory: Path


def make_pki(directory: Path, apiserver_hosts: tuple[str, ...]) -> ClusterPki:
    """Every certificate the cluster needs, written under ``directory`` (made anew)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = Authority(directory, "ca")
    front = Authority(directory, "front-proxy-ca")
    hosts = ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
             "kubernetes.default.svc.cluster.local", *apiserver_hosts)
    return ClusterPki(
        ca=ca.pair,
        apiserver=ca.issue("apiserver", "kube-apiserver", hosts=hosts, client=False,
                           server=True),
        admin=ca.issue("admin", "kubernetes-admin", groups=("system:masters",)),
        front_proxy_ca=front.pair,
        front_proxy_client=front.issue("front-proxy-client", FRONT_PROXY_CLIENT),
        service_account=_service_account_keys(directory),
        directory=directory,
    )


def keda_certs(directory: Path, hosts: tuple[str, ...]) -> Path:
    """``ca.crt``, ``tls.crt`` and ``tls.key`` in ``directory``, as KEDA's operator (its
    metrics gRPC server) and metrics apiserver (its client, and its HTTPS serving) read
    them from their --cert-dir: one certificate for both ends, from a CA of its own."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = Authority(directory, "keda-ca")
    pair = ca.issue("keda", "keda", hosts=hosts, client=True, server=True)
    (directory / "ca.crt").write_bytes(ca.pair.cert.read_bytes())
    pair.cert.replace(directory / "tls.crt")
    pair.key.replace(directory / "tls.key")
    return directory
