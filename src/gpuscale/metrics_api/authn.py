"""Who is asking: the aggregation layer's front proxy, or a client certificate.

The trust material is what the cluster publishes in the ConfigMap
``kube-system/extension-apiserver-authentication`` (``trust_from_configmap``):

- ``requestheader-client-ca-file``: the CA of the kube-apiserver's front-proxy client
  certificate. A connection whose certificate was issued by it, with a common name in
  ``requestheader-allowed-names`` (empty: any), is the aggregator speaking for a user named
  in the first non-empty ``requestheader-username-headers`` header, with the groups of
  every ``requestheader-group-headers`` header and the extras of the headers starting
  with a ``requestheader-extra-headers-prefix``. Without a user header it is not
  authenticated by these rules (as in k8s.io/apiserver, the next rule is tried).
- ``client-ca-file``: the cluster's client CA. A certificate it issued is the user of its
  common name, in the groups of its organizations; the request headers are ignored.

Anything else is anonymous, and anonymous requests are refused (401). The TLS handshake
verifies the chain against both CAs; which one issued the certificate is decided here,
from the signature, so a client certificate of the cluster CA can never carry
``X-Remote-User``.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import NameOID

from gpuscale.common.errors import ConfigError

AUTHENTICATED = "system:authenticated"
MAX_HEADER_VALUES = 64  # groups or extras a request may carry
MAX_HEADER_LENGTH = 1024


@dataclass(frozen=True, slots=True)
class Trust:
    client_cas: tuple[x509.Certificate, ...]
    proxy_cas: tuple[x509.Certificate, ...]
    allowed_names: frozenset[str]
    username_headers: tuple[str, ...]
    group_headers: tuple[str, ...]
    extra_prefixes: tuple[str, ...]

    def pem(self) -> bytes:
        """Both CA bundles, for the TLS handshake's verification."""
        from cryptography.hazmat.primitives.serialization import Encoding

        return b"".join(c.public_bytes(Encoding.PEM)
                        for c in (*self.client_cas, *self.proxy_cas))


@dataclass(frozen=True, slots=True)
class User:
    name: str
    groups: tuple[str, ...]
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    via: str = "client certificate"  # or "front proxy"


def _cas(pem: str, key: str) -> tuple[x509.Certificate, ...]:
    if not pem.strip():
        return ()
    try:
        certs = x509.load_pem_x509_certificates(pem.encode())
    except ValueError as exc:
        raise ConfigError(f"{key}: not PEM certificates ({exc})") from None
    return tuple(certs)


def _names(data: Mapping[str, str], key: str) -> tuple[str, ...]:
    raw = data.get(key, "")
    if not raw.strip():
        return ()
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        value = None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{key}: expected a JSON list of strings, got {raw[:80]!r}")
    return tuple(value)


def trust_from_configmap(data: Mapping[str, str]) -> Trust:
    """The trust rules of ``extension-apiserver-authentication``'s ``data``. ConfigError
    for a value that cannot be read, or when neither CA is present."""
    trust = Trust(
        _cas(data.get("client-ca-file", ""), "client-ca-file"),
        _cas(data.get("requestheader-client-ca-file", ""), "requestheader-client-ca-file"),
        frozenset(_names(data, "requestheader-allowed-names")),
        tuple(h.lower() for h in _names(data, "requestheader-username-headers")),
        tuple(h.lower() for h in _names(data, "requestheader-group-headers")),
        tuple(h.lower() for h in _names(data, "requestheader-extra-headers-prefix")),
    )
    if not trust.client_cas and not trust.proxy_cas:
        raise ConfigError("extension-apiserver-authentication has neither client-ca-file "
                          "nor requestheader-client-ca-file: nobody could be authenticated")
    return trust


def issued_by(cert: x509.Certificate, cas: Iterable[x509.Certificate],
              now: datetime.datetime | None = None) -> bool:
    """``cert`` is signed by one of ``cas`` (directly) and both are within their validity."""
    now = now or datetime.datetime.now(datetime.UTC)
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        return False
    for ca in cas:
        if ca.subject != cert.issuer or not ca.not_valid_before_utc <= now <= \
                ca.not_valid_after_utc:
            continue
        try:
            cert.verify_directly_issued_by(ca)
        except (InvalidSignature, ValueError, TypeError):
            continue
        return True
    return False


def _attr(name: x509.Name, oid: x509.ObjectIdentifier) -> list[str]:
    return [str(a.value) for a in name.get_attributes_for_oid(oid)]


def _bounded(values: list[str], what: str) -> tuple[str, ...]:
    if len(values) > MAX_HEADER_VALUES or any(len(v) > MAX_HEADER_LENGTH for v in values):
        raise ConfigError(f"{what}: more than {MAX_HEADER_VALUES} values or a value longer "
                          f"than {MAX_HEADER_LENGTH} characters")
    return tuple(values)


@dataclass(frozen=True, slots=True)
class _Peer:
    """What a certificate is under one Trust: the front proxy, a client, or nobody."""

    role: str  # "proxy", "client" or ""
    cn: str
    orgs: tuple[str, ...]
    until: datetime.datetime  # the certificate's expiry: re-check after it


def _classify(trust: Trust, peer_der: bytes) -> _Peer:
    never = datetime.datetime.max.replace(tzinfo=datetime.UTC)
    try:
        cert = x509.load_der_x509_certificate(peer_der)
    except ValueError:
        return _Peer("", "", (), never)
    cns = _attr(cert.subject, NameOID.COMMON_NAME)
    cn = cns[0] if cns else ""
    orgs = tuple(_attr(cert.subject, NameOID.ORGANIZATION_NAME))
    until = cert.not_valid_after_utc
    if trust.proxy_cas and issued_by(cert, trust.proxy_cas) and \
            (not trust.allowed_names or cn in trust.allowed_names):
        return _Peer("proxy", cn, orgs, min(until, _ca_until(cert, trust.proxy_cas)))
    if trust.client_cas and issued_by(cert, trust.client_cas) and cn:
        return _Peer("client", cn, orgs, min(until, _ca_until(cert, trust.client_cas)))
    return _Peer("", cn, orgs, until)


def _ca_until(cert: x509.Certificate, cas: Iterable[x509.Certificate]) -> datetime.datetime:
    """When the CA that issued ``cert`` expires: a remembered check ends then too."""
    return min((ca.not_valid_after_utc for ca in cas if ca.subject == cert.issuer),
               default=cert.not_valid_after_utc)


def authenticate(trust: Trust, peer_der: bytes | None,
                 headers: Iterable[tuple[str, str]]) -> User | None:
    """The user of a request: its TLS peer certificate (DER, None when it sent none) and
    its headers (name, value pairs; a name may repeat). None: anonymous. ConfigError for
    headers beyond the bounds."""
    if not peer_der:
        return None
    return _user(trust, _classify(trust, peer_der), headers)


def _user(trust: Trust, peer: _Peer, headers: Iterable[tuple[str, str]]) -> User | None:
    if peer.role == "proxy":
        user = _from_headers(trust, list(headers))
        if user is not None:
            return user
        # a front-proxy certificate without a user header: as in k8s.io/apiserver, the
        # next rule; a certificate of both CAs would be the client
        return None
    if peer.role == "client":
        return User(peer.cn, _authenticated(peer.orgs))
    return None


def _authenticated(groups: tuple[str, ...]) -> tuple[str, ...]:
    """Every authenticated user is in system:authenticated (k8s.io/apiserver's
    AuthenticatedGroupAdder): RBAC bound to it applies here too."""
    return groups if AUTHENTICATED in groups else (*groups, AUTHENTICATED)


class Authenticator:
    """``authenticate`` with the certificate checks remembered per certificate (a
    connection sends the same one on every request; checking its signature costs about a
    quarter of a millisecond): bounded, until the certificate expires, for one Trust."""

    def __init__(self, trust: Trust, max_cached: int = 4096) -> None:
        self.trust = trust
        self._max = max_cached
        self._peers: dict[bytes, _Peer] = {}

    def __call__(self, peer_der: bytes | None,
                 headers: Iterable[tuple[str, str]]) -> User | None:
        if not peer_der:
            return None
        peer = self._peers.get(peer_der)
        if peer is None or peer.until < datetime.datetime.now(datetime.UTC):
            peer = _classify(self.trust, peer_der)
            if len(self._peers) >= self._max:
                self._peers.clear()
            self._peers[peer_der] = peer
        return _user(self.trust, peer, headers)


def _from_headers(trust: Trust, headers: list[tuple[str, str]]) -> User | None:
    lowered = [(k.lower(), v) for k, v in headers]
    name = next((v.strip() for h in trust.username_headers for k, v in lowered
                 if k == h and v.strip()), "")
    if not name:
        return None
    groups = [v.strip() for k, v in lowered if k in trust.group_headers and v.strip()]
    extra: dict[str, list[str]] = {}
    for k, v in lowered:
        for prefix in trust.extra_prefixes:
            if k.startswith(prefix) and len(k) > len(prefix):
                extra.setdefault(_unescape(k[len(prefix):]), []).append(v)
    _bounded(groups, "group headers")
    _bounded(list(extra), "extra headers")
    return User(_bounded([name], "user header")[0], _authenticated(tuple(groups)),
                {k: _bounded(v, f"extra {k}") for k, v in extra.items()}, "front proxy")


def _unescape(key: str) -> str:
    """Extra keys are percent-encoded in header names (k8s.io/apiserver unescapes them)."""
    from urllib.parse import unquote

    return unquote(key)
