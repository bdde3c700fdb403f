"""Throwaway TLS certificates for test servers, made at run time (never committed).

:func:`make_test_certificates` writes a test certificate authority and a server
certificate it signed, for ``127.0.0.1`` and ``localhost`` (subject alternative names, IP
and DNS), so that a test server (:class:`~asyncstream.testing.FaultProxy`,
:class:`~asyncstream.LocalS3` or any other) can listen with TLS and a client can verify it
with ``S3Options(ca_bundle=certs.ca)``. Re-exported by :mod:`asyncstream.testing`.

It needs ``cryptography`` (a dependency of moto, so of the test extras); it is imported
when the function runs, never when asyncstream is.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

__all__ = ["TestCertificates", "make_test_certificates"]

_VALID_FOR = datetime.timedelta(days=2)


@dataclass(frozen=True)
class TestCertificates:
    """PEM files made by :func:`make_test_certificates`; unpacks as ``ca, cert, key``.

    Attributes:
        ca: the test CA's certificate: what a client trusts (``ca_bundle``).
        cert: the server's certificate, signed by that CA.
        key: the server's private key (unencrypted; readable by its owner only).
    """

    __test__: ClassVar[bool] = False  # a helper, not a test class for pytest to collect

    ca: str
    cert: str
    key: str

    @property
    def server(self) -> tuple[str, str]:
        """``(cert, key)``: what a TLS listener needs (``FaultProxy(..., tls=...)``)."""
        return self.cert, self.key

    def __iter__(self) -> Iterator[str]:
        return iter((self.ca, self.cert, self.key))


def make_test_certificates(
    folder: str | os.PathLike[str],
    *,
    hosts: Sequence[str] = ("127.0.0.1", "localhost"),
    name: str = "asyncstream test",
) -> TestCertificates:
    """Write a fresh test CA and a server certificate for ``hosts`` into ``folder``.

    Each call makes new keys, so two calls give two CAs that do not trust each other's
    certificates (a server certificate from one and the CA of the other make a
    certificate that does not verify). The certificates are valid from an hour ago for
    two days; the keys are EC P-256 (quick to make).

    Example::

        certs = make_test_certificates(tmp_path)
        with FaultProxy(s3.endpoint_url, tls=certs.server) as proxy:
            options = S3Options(endpoint_url=proxy.endpoint_url, ca_bundle=certs.ca)

    Args:
        folder: where to write ``ca.pem``, ``server.pem`` and ``server-key.pem``
            (created if need be; files of those names are replaced).
        hosts: the server's names: IP addresses become IP subject alternative names,
            anything else DNS ones. The first is also the common name.
        name: the CA's common name (the server's is the first host).

    Returns:
        The three files' paths.

    Raises:
        ValueError: no hosts.
        ModuleNotFoundError: ``cryptography`` is not installed.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if not hosts:
        raise ValueError("hosts must name at least one IP address or DNS name")
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(hours=1), now + _VALID_FOR

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )

    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )

    pem = serialization.Encoding.PEM
    paths = TestCertificates(
        str(out / "ca.pem"), str(out / "server.pem"), str(out / "server-key.pem")
    )
    Path(paths.ca).write_bytes(ca.public_bytes(pem))
    Path(paths.cert).write_bytes(cert.public_bytes(pem))
    key_bytes = key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(paths.key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key_bytes)
    return paths
