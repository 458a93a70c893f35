"""Certificates for the tests of mutual TLS and of the metrics API's front proxy: a CA,
leaf certificates it signs, and the HPA's user name they are issued to."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

HPA_USER = "system:serviceaccount:kube-system:horizontal-pod-autoscaler"

Key = ec.EllipticCurvePrivateKey


def _name(cn: str, orgs: Sequence[str] = ()) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn),
                      *(x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs)])


def make_ca(cn: str, days: float = 1.0) -> tuple[x509.Certificate, Key]:
    """A self-signed CA (EC P-256) valid from an hour ago for ``days``."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return cert, key


def issue(ca: tuple[x509.Certificate, Key], cn: str, dns: str = "", *,
          orgs: Sequence[str] = (), client: bool = False,
          valid_days: float = 1.0) -> tuple[bytes, bytes]:
    """A leaf certificate and its key (PEM) signed by ``ca``: a server certificate for
    ``dns`` and 127.0.0.1, or (``client``) a client certificate whose subject carries
    ``orgs`` (Kubernetes reads them as groups). ``valid_days`` < 0: already expired."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    start, end = ((now - datetime.timedelta(days=2), now - datetime.timedelta(days=1))
                  if valid_days < 0 else (now - datetime.timedelta(hours=1),
                                          now + datetime.timedelta(days=valid_days)))
    builder = (x509.CertificateBuilder().subject_name(_name(cn, orgs))
               .issuer_name(ca[0].subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(start).not_valid_after(end))
    if client:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    else:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName(dns or cn), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
    cert = builder.sign(ca[1], hashes.SHA256())
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM,
                              serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


def pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)
