"""The TLS test servers: test certificates, FaultProxy and LocalS3 over HTTPS, and a proxy
that strips request headers (a server that ignores ``If-Match``)."""

from __future__ import annotations

import http.client
import os
import socket
import ssl
import stat
from pathlib import Path
from typing import Any

import botocore.exceptions
import pytest
from cryptography import x509

from asyncstream import LocalS3, S3Options
from asyncstream.stores._s3 import sync_client
from asyncstream.testing import FaultProxy, TestCertificates, make_test_certificates


def client_for(endpoint: str, ca_bundle: str | None) -> Any:
    """A botocore client with one attempt, verifying the server with ``ca_bundle``."""
    options = S3Options(endpoint_url=endpoint, ca_bundle=ca_bundle, metadata_attempts=1)
    return sync_client(options.resolve())


def https_status(host: str, port: int, ca_bundle: str) -> int:
    """The status of ``GET /`` over HTTPS to ``host``, verifying it with ``ca_bundle``."""
    context = ssl.create_default_context(cafile=ca_bundle)
    connection = http.client.HTTPSConnection(host, port, context=context, timeout=10)
    try:
        connection.request("GET", "/")
        return connection.getresponse().status
    finally:
        connection.close()


def test_certificates_name_loopback_and_only_their_ca_trusts_them(tmp_path: Path) -> None:
    certs = make_test_certificates(tmp_path / "a")
    ca, cert, key = certs  # unpacks as a tuple
    assert (ca, cert, key) == (certs.ca, certs.cert, certs.key)
    assert certs.server == (cert, key)
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    parsed = x509.load_pem_x509_certificate(Path(cert).read_bytes())
    names = parsed.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    other = make_test_certificates(tmp_path / "b")
    assert Path(other.ca).read_bytes() != Path(ca).read_bytes()  # fresh keys every call
    with pytest.raises(ValueError, match="hosts"):
        make_test_certificates(tmp_path / "c", hosts=())


def test_tls_proxy_serves_https_to_its_plain_upstream(
    s3_server: LocalS3, bucket: str, certs: TestCertificates, untrusted_certs: TestCertificates
) -> None:
    with FaultProxy(s3_server.endpoint_url, tls=certs.server) as proxy:
        assert proxy.endpoint_url.startswith("https://127.0.0.1:")
        port = int(proxy.endpoint_url.rsplit(":", 1)[1])
        for host in ("127.0.0.1", "localhost"):  # both names verify
            assert https_status(host, port, certs.ca) == 200
        with pytest.raises(ssl.SSLCertVerificationError):
            https_status("127.0.0.1", port, untrusted_certs.ca)
        client = client_for(proxy.endpoint_url, certs.ca)
        data = os.urandom(300_000)
        client.put_object(Bucket=bucket, Key="k", Body=data)
        assert (
            client.get_object(Bucket=bucket, Key="k", Range="bytes=10-19")["Body"].read()
            == (data[10:20])
        )
        proxy.inject("truncate", match="/k")  # faults work behind TLS too
        with pytest.raises(botocore.exceptions.ResponseStreamingError):
            client.get_object(Bucket=bucket, Key="k")["Body"].read()
        assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == data
        stats = proxy.stats()
    assert stats["truncate"] == 1
    assert stats["bytes_forwarded"] >= 10 + len(data)
    # Two plain-socket clients, the handshake the untrusting one broke off is not counted,
    # and botocore's client connection, opened again after the truncation.
    assert stats["connections"] == 4


def test_a_proxy_can_strip_if_match(s3_server: LocalS3, s3_client: Any, bucket: str) -> None:
    s3_client.put_object(Bucket=bucket, Key="k", Body=b"data")
    wrong = '"00000000000000000000000000000000"'
    with pytest.raises(botocore.exceptions.ClientError) as refused:
        s3_client.get_object(Bucket=bucket, Key="k", IfMatch=wrong)
    assert refused.value.response["Error"]["Code"] == "PreconditionFailed"  # moto honours it
    with FaultProxy(s3_server.endpoint_url, strip_request_headers=("If-Match",)) as proxy:
        client = client_for(proxy.endpoint_url, None)
        assert client.get_object(Bucket=bucket, Key="k", IfMatch=wrong)["Body"].read() == b"data"
    with pytest.raises(TypeError, match="header names"):
        FaultProxy(s3_server.endpoint_url, strip_request_headers="if-match")


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_local_s3_over_tls(mode: str, certs: TestCertificates, aws_env: dict[str, str]) -> None:
    with LocalS3(mode=mode, tls=certs.server, ca_bundle=certs.ca) as server:  # type: ignore[arg-type]
        endpoint = server.endpoint_url
        assert endpoint.startswith("https://127.0.0.1:")
        assert server.options().ca_bundle == certs.ca
        client = server.client()
        client.create_bucket(Bucket="tls-roundtrip")
        client.put_object(Bucket="tls-roundtrip", Key="k", Body=b"hello")
        body = client.get_object(Bucket="tls-roundtrip", Key="k", Range="bytes=1-3")["Body"]
        assert body.read() == b"ell"
        server.reset()
        assert client.list_buckets()["Buckets"] == []
    host, port = endpoint.removeprefix("https://").split(":")
    with socket.socket() as sock:
        sock.settimeout(2)
        assert sock.connect_ex((host, int(port))) != 0  # stopped
