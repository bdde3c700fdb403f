"""Shared fixtures: real S3 servers on loopback (moto over HTTP and HTTPS; s3rver, see
``asyncstream.testing.S3rver``), test certificates, an isolated AWS environment and an
isolated local index cache (``ASYNCSTREAM_CACHE_DIR``, inherited by child processes)."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _servers import Backend, start_s3rver_or_skip
from _servers_azure import az_data, azurite, use_azure  # noqa: F401
from _servers_gcs import gcs_emulator, gcs_env  # noqa: F401 - fixtures
from _servers_web import cdn, web, web_data, web_servers, web_tls  # noqa: F401

from asyncstream.testing import FaultProxy, TestCertificates, make_test_certificates
from asyncstream.testing._local import LOCAL_CREDENTIALS, LocalS3
from asyncstream.testing._s3rver import CREDENTIALS as S3RVER_CREDENTIALS
from asyncstream.testing._s3rver import S3rver

_FAKE_ENV = {
    "AWS_ACCESS_KEY_ID": "asyncstream-test-key",
    "AWS_SECRET_ACCESS_KEY": "asyncstream-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}
_CLEARED = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_REGION",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
)


# The modules that take longest (``--durations`` in CI: the quick benchmark run alone takes
# 3 to 6 minutes), run first: with two workers and a module a worker at a time (``--dist
# loadfile --no-loadscope-reorder``, the Makefile's), one of them starting last would run
# on its own while the other worker idles. The rest follow, most tests first.
_LONG_FIRST = (
    "test_bench.py",
    "test_bench_modules.py",
    "test_multigpu.py",
    "test_readme.py",
    "test_wds_oracle.py",
    "test_frameworks.py",
    "test_two_nodes.py",
    "test_resume.py",
    "test_stream.py",
    "test_open_once.py",
    "test_chaos.py",
    "test_compressed.py",
    "test_loader.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Order the modules for the workers: :data:`_LONG_FIRST`, then by tests, most first."""
    counts: dict[str, int] = {}
    for item in items:
        counts[item.path.name] = counts.get(item.path.name, 0) + 1
    rank = {name: i for i, name in enumerate(_LONG_FIRST)}

    def key(item: pytest.Item) -> tuple[int, int, str]:
        name = item.path.name
        return (rank.get(name, len(rank)), -counts[name], str(item.path))

    items.sort(key=key)  # stable: each module's own order is kept


@pytest.fixture(scope="session", autouse=True)
def aws_env() -> Iterator[dict[str, str]]:
    """Fake credentials; the user's ~/.aws and real AWS are never read."""
    with pytest.MonkeyPatch.context() as mp:
        for name in _CLEARED:
            mp.delenv(name, raising=False)
        for name, value in _FAKE_ENV.items():
            mp.setenv(name, value)
        yield dict(_FAKE_ENV)


@pytest.fixture(scope="session", autouse=True)
def index_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The local index cache of this test session: never the user's ~/.cache."""
    folder = tmp_path_factory.mktemp("index-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ASYNCSTREAM_CACHE_DIR", str(folder))
        yield folder


@pytest.fixture(scope="session")
def s3_server(aws_env: dict[str, str]) -> Iterator[LocalS3]:
    """A real moto S3 server on a free loopback port, for the whole session."""
    with LocalS3() as server:
        yield server


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> TestCertificates:
    """A test CA and a server certificate for 127.0.0.1 and localhost, made for this run."""
    return make_test_certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="session")
def untrusted_certs(tmp_path_factory: pytest.TempPathFactory) -> TestCertificates:
    """Another CA and server certificate: neither trusts the other's (``certs``)."""
    return make_test_certificates(tmp_path_factory.mktemp("tls-untrusted"), name="untrusted")


@pytest.fixture(scope="session")
def s3_tls_server(s3_server: LocalS3, certs: TestCertificates) -> Iterator[LocalS3]:
    """moto over HTTPS (``certs``), for the whole session. In thread mode it shares the
    state of ``s3_server`` (one moto backend per process): a bucket made on one is on both."""
    with LocalS3(tls=certs.server, ca_bundle=certs.ca) as server:
        yield server


@pytest.fixture(scope="session")
def s3rver(tmp_path_factory: pytest.TempPathFactory, aws_env: dict[str, str]) -> Iterator[S3rver]:
    """s3rver (npm, installed once into a cache folder) over HTTP, for the whole session;
    skipped, with the reason, where it cannot be installed; a failure to start fails."""
    with start_s3rver_or_skip(S3rver(tmp_path_factory.mktemp("s3rver"))) as server:
        yield server


@pytest.fixture(scope="session")
def s3rver_tls(s3rver: S3rver, certs: TestCertificates) -> Iterator[S3rver]:
    """s3rver over HTTPS with ``certs``, for the whole session, serving the same folder as
    ``s3rver`` (a bucket made on one is on both; skipped as ``s3rver``)."""
    with start_s3rver_or_skip(
        S3rver(s3rver.directory, tls=certs.server, ca_bundle=certs.ca)
    ) as server:
        yield server


@pytest.fixture(params=["moto", "s3rver"])
def backend(request: pytest.FixtureRequest, certs: TestCertificates) -> Backend:
    """Each S3 implementation in turn, over HTTP and HTTPS: moto, then s3rver (skipped
    where it cannot run)."""
    if request.param == "moto":
        plain: LocalS3 = request.getfixturevalue("s3_server")
        tls: LocalS3 = request.getfixturevalue("s3_tls_server")
        return Backend(
            "moto", plain.endpoint_url, tls.endpoint_url, certs.ca, LOCAL_CREDENTIALS, True
        )
    node: S3rver = request.getfixturevalue("s3rver")
    node_tls: S3rver = request.getfixturevalue("s3rver_tls")
    return Backend(
        "s3rver", node.endpoint_url, node_tls.endpoint_url, certs.ca, S3RVER_CREDENTIALS, False
    )


_bucket_numbers = itertools.count()


@pytest.fixture
def s3_client(s3_server: LocalS3) -> Any:
    """A botocore client for the session's server."""
    return s3_server.client()


@pytest.fixture
def bucket(s3_client: Any) -> str:
    """A fresh, empty bucket for one test."""
    name = f"test-bucket-{os.getpid()}-{next(_bucket_numbers)}"
    s3_client.create_bucket(Bucket=name)
    return name


@pytest.fixture
def proxy(s3_server: LocalS3) -> Iterator[FaultProxy]:
    """A fault proxy (no faults until a test injects them) in front of ``s3_server``."""
    with FaultProxy(s3_server.endpoint_url) as p:
        yield p


@pytest.fixture(params=["auto", "aiohttp"])
def transport(request: pytest.FixtureRequest) -> str:
    """Each engine transport in turn: "auto" (the direct one, for http:// and https://
    endpoints) and "aiohttp" (botocore's)."""
    return str(request.param)
