"""The fetch engine over HTTPS, on both transports: certificates that do not verify, TLS
against a plain port and plain HTTP against a TLS port (permanent, at once, naming the
endpoint and the cause), and kept-alive connections counted at a proxy.

The servers: moto (werkzeug, which resets a connection that speaks the wrong protocol),
FaultProxy (asyncio, which waits for more bytes of a request it cannot parse, as most
HTTP servers do) and s3rver (Node.js, answering 400), each on a plain and on a TLS port.
Exact epochs and 403/404/replaced objects over HTTPS are in ``test_s3_servers.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _servers import FAST_RETRY, SHORT, Backend, Dataset, open_stream, upload_foreign

from asyncstream import LocalS3, PermanentFetchError, S3Options, Timeouts, resolve_shards
from asyncstream.engine._engine import Engine, EngineConfig
from asyncstream.stores._store import ChunkRequest
from asyncstream.testing import FaultProxy, TestCertificates, make_test_certificates
from asyncstream.testing._local import LOCAL_CREDENTIALS
from asyncstream.testing._s3rver import S3rver

URL = "s3://tls-bucket/x.tar"


@pytest.fixture(scope="module")
def tls_object(s3_server: LocalS3) -> str:
    """One object on moto (shared by its plain and TLS servers and the proxies)."""
    client = s3_server.client()
    client.create_bucket(Bucket="tls-bucket")
    client.put_object(Bucket="tls-bucket", Key="x.tar", Body=b"0123456789" * 100)
    return URL


def engine_config(endpoint: str, transport: str, **options: Any) -> EngineConfig:
    """An engine reading through ``endpoint`` with the given S3 options."""
    s3 = S3Options(endpoint_url=endpoint, credentials=LOCAL_CREDENTIALS, **options).resolve()
    return EngineConfig(
        inflight=2,
        retry=FAST_RETRY,
        timeouts=Timeouts(connect=5, first_byte=5, stall=5, chunk=20),
        s3=s3,
        transport=transport,  # type: ignore[arg-type]
    )


def first_chunk(endpoint: str, transport: str, **options: Any) -> tuple[bytes, dict[str, Any]]:
    """The first 100 bytes of the object through an engine, and the engine's stats; what
    the engine raised propagates."""
    config = engine_config(endpoint, transport, **options)
    with Engine(config, n_slots=2, slot_bytes=4096) as engine:
        engine.submit([ChunkRequest(URL, 0, 100)])
        ready = engine.next()
        data = bytes(engine.view(ready))
        engine.release(ready.slot)
        return data, engine.stats()


def fails_at_once(endpoint: str, transport: str, **options: Any) -> str:
    """The message of the permanent error the engine raises at its first attempt: the
    engine counts no retry (a transient error would be retried, up to 12 attempts)."""
    with Engine(engine_config(endpoint, transport, **options), n_slots=2, slot_bytes=4096) as e:
        e.submit([ChunkRequest(URL, 0, 100)])
        with pytest.raises(PermanentFetchError) as info:
            e.next()
        assert e.stats()["retries_total"] == 0
    message = str(info.value)
    assert URL in message
    return message


def origin(endpoint: str) -> str:
    return endpoint.split("://", 1)[1]


# --------------------------------------------------------------------------- certificates


def test_a_verified_certificate_serves(
    s3_tls_server: LocalS3, tls_object: str, certs: TestCertificates, transport: str
) -> None:
    data, stats = first_chunk(s3_tls_server.endpoint_url, transport, ca_bundle=certs.ca)
    assert data == b"0123456789" * 10
    assert stats["retries_total"] == 0
    if transport == "auto":
        assert stats["tls"] is True


@pytest.mark.parametrize("server", ["moto", "proxy"])
def test_a_certificate_that_does_not_verify_is_permanent_at_once(
    s3_server: LocalS3,
    tls_object: str,
    certs: TestCertificates,
    untrusted_certs: TestCertificates,
    transport: str,
    server: str,
) -> None:
    """A server certificate from a CA the client was not given; verify=False reads."""
    untrusted: Any
    if server == "moto":  # a process of its own: closing a thread-mode one resets them all
        untrusted = LocalS3(
            mode="process", tls=untrusted_certs.server, ca_bundle=untrusted_certs.ca
        )
    else:
        untrusted = FaultProxy(s3_server.endpoint_url, tls=untrusted_certs.server)
    with untrusted:
        if server == "moto":
            client = untrusted.client()
            client.create_bucket(Bucket="tls-bucket")
            client.put_object(Bucket="tls-bucket", Key="x.tar", Body=b"0123456789" * 100)
        endpoint = untrusted.endpoint_url
        message = fails_at_once(endpoint, transport, ca_bundle=certs.ca)
        assert origin(endpoint) in message
        assert "certificate does not verify" in message
        assert "ca_bundle" in message  # what to do about it
        data, _ = first_chunk(endpoint, transport, verify=False)
    assert data == b"0123456789" * 10


def test_a_certificate_for_another_host_is_permanent_at_once(
    s3_server: LocalS3,
    tls_object: str,
    transport: str,
    tmp_path: Path,
) -> None:
    elsewhere = make_test_certificates(tmp_path, hosts=("s3.example.com",))
    with FaultProxy(s3_server.endpoint_url, tls=elsewhere.server) as proxy:
        endpoint = proxy.endpoint_url
        message = fails_at_once(endpoint, transport, ca_bundle=elsewhere.ca)
    assert origin(endpoint) in message
    assert "certificate does not verify" in message


# --------------------------------------------------------------------------- TLS vs plain


@pytest.fixture(params=["moto", "proxy", "s3rver"])
def ports(
    request: pytest.FixtureRequest, s3_server: LocalS3, tls_object: str, certs: TestCertificates
) -> Iterator[tuple[str, str]]:
    """``(plain, tls)``: a server's plain-HTTP and TLS ports, as ``host:port``."""
    if request.param == "moto":
        tls_server: LocalS3 = request.getfixturevalue("s3_tls_server")
        yield origin(s3_server.endpoint_url), origin(tls_server.endpoint_url)
    elif request.param == "proxy":
        with (
            FaultProxy(s3_server.endpoint_url) as plain,
            FaultProxy(s3_server.endpoint_url, tls=certs.server) as tls,
        ):
            yield origin(plain.endpoint_url), origin(tls.endpoint_url)
    else:
        node: S3rver = request.getfixturevalue("s3rver")
        node_tls: S3rver = request.getfixturevalue("s3rver_tls")
        yield origin(node.endpoint_url), origin(node_tls.endpoint_url)


def test_https_to_a_plain_port_is_permanent_at_once(
    ports: tuple[str, str], certs: TestCertificates, transport: str
) -> None:
    plain, _ = ports
    message = fails_at_once(f"https://{plain}", transport, ca_bundle=certs.ca)
    assert f"https://{plain}" in message
    assert "plain-HTTP port" in message


def test_http_to_a_tls_port_is_permanent_at_once(
    ports: tuple[str, str], certs: TestCertificates, transport: str
) -> None:
    _, tls = ports
    message = fails_at_once(f"http://{tls}", transport)
    assert f"http://{tls}" in message
    assert "is a TLS (https://) endpoint" in message


# --------------------------------------------------------------------------- reuse


@pytest.fixture
def many_chunks(s3_server: LocalS3, tmp_path: Path, certs: TestCertificates) -> Dataset:
    """16 foreign shards, 2 to 4 MB in all: hundreds of 8 KiB chunks."""
    backend = Backend(
        "moto", s3_server.endpoint_url, "", certs.ca, LOCAL_CREDENTIALS, honours_if_match=True
    )
    return upload_foreign(backend.client(), "reuse-bucket", tmp_path / "shards", 16, seed=2)


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_an_epoch_reuses_its_connections(
    s3_server: LocalS3, many_chunks: Dataset, certs: TestCertificates, scheme: str
) -> None:
    inflight = 4
    tls = certs.server if scheme == "https" else None
    with FaultProxy(s3_server.endpoint_url, tls=tls) as proxy:
        options = S3Options(
            endpoint_url=proxy.endpoint_url, credentials=LOCAL_CREDENTIALS, ca_bundle=certs.ca
        ).resolve()
        listed = proxy.stats()["connections"]
        with open_stream(
            many_chunks, options, inflight=inflight, chunk_bytes=8 << 10, timeouts=SHORT
        ) as stream:
            listed = proxy.stats()["connections"]  # the listing's, before the epoch
            before = len(proxy.requests())
            samples = sum(1 for _ in stream)
            fetch = stream.stats()["fetch"]
        opened = proxy.stats()["connections"] - listed
        gets = [r for r in proxy.requests()[before:] if r[0] == "GET"]
    assert samples == many_chunks.shards.total
    assert fetch["transport"] == "direct"
    assert fetch["tls"] == (scheme == "https")
    chunks = fetch["chunks"]
    assert chunks > 200
    # K downloads (and a hedge or two) in flight: about 2 x inflight connections at most.
    assert 1 <= opened <= 2 * inflight
    assert fetch["connections_opened"] == opened
    assert len(gets) <= chunks  # consecutive chunks may share a GET
    assert fetch["connections_reused"] >= len(gets) - opened


# --------------------------------------------------------------------------- at open


def opening_fails_at_once(endpoint: str, **options: Any) -> str:
    """The message of the permanent error that listing the bucket raises (on botocore's
    client, with its own retries, it took 7 to 37 s and could end transient): permanent, so
    never retried, and saying so in its message."""
    s3 = S3Options(endpoint_url=endpoint, credentials=LOCAL_CREDENTIALS, **options)
    with pytest.raises(PermanentFetchError) as info:
        resolve_shards("s3://tls-bucket/", s3)
    assert "attempts" not in str(info.value)  # not "giving up after N attempts"
    return str(info.value)


def test_opening_over_a_port_of_the_other_protocol_is_permanent_at_once(
    ports: tuple[str, str], certs: TestCertificates
) -> None:
    plain, tls = ports
    message = opening_fails_at_once(f"https://{plain}", ca_bundle=certs.ca)
    assert plain in message
    assert "plain-HTTP port" in message
    message = opening_fails_at_once(f"http://{tls}")
    assert tls in message
    assert "is a TLS (https://) endpoint" in message


@pytest.mark.filterwarnings(
    "ignore:Unverified HTTPS request:urllib3.exceptions.InsecureRequestWarning"
)
def test_opening_with_a_certificate_that_does_not_verify_is_permanent_at_once(
    s3_server: LocalS3,
    tls_object: str,
    certs: TestCertificates,
    untrusted_certs: TestCertificates,
) -> None:
    with FaultProxy(s3_server.endpoint_url, tls=untrusted_certs.server) as proxy:
        message = opening_fails_at_once(proxy.endpoint_url, ca_bundle=certs.ca)
        assert origin(proxy.endpoint_url) in message
        assert "certificate does not verify" in message
        listed = resolve_shards(
            "s3://tls-bucket/",
            S3Options(endpoint_url=proxy.endpoint_url, credentials=LOCAL_CREDENTIALS, verify=False),
        )
    assert [s.url for s in listed] == [URL]


# --------------------------------------------------------------------------- the CLI


@pytest.mark.filterwarnings("ignore:Unverified HTTPS request")  # urllib3's, as intended
def test_the_cli_trusts_a_ca_bundle_or_refuses_at_once(
    s3_tls_server: LocalS3,
    tls_object: str,
    certs: TestCertificates,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--ca-bundle`` trusts the test CA; without it the certificate does not verify (a
    permanent error naming the endpoint, exit 1); ``--no-verify-ssl`` reads anyway."""
    from asyncstream.cli._cli import main

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", LOCAL_CREDENTIALS.access_key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", LOCAL_CREDENTIALS.secret_access_key)
    monkeypatch.delenv("AWS_CA_BUNDLE", raising=False)
    endpoint = s3_tls_server.endpoint_url
    argv = ["ls", "s3://tls-bucket/", "--endpoint-url", endpoint, "--json"]
    assert main([*argv, "--ca-bundle", certs.ca]) == 0
    assert "x.tar" in capsys.readouterr().out
    assert main(argv) != 0
    err = capsys.readouterr().err
    assert origin(endpoint) in err
    assert "certificate does not verify" in err
    assert main([*argv, "--no-verify-ssl"]) == 0
    assert "x.tar" in capsys.readouterr().out
