"""Whole epochs against two independent S3 implementations, over HTTP and HTTPS, on both
transports: moto (Python) and s3rver (Node.js, from npm; skipped where it cannot run).

Every test runs for each ``backend`` x ``scheme`` (``http``; ``https``: the server's own
TLS listener, or a TLS FaultProxy in front of its plain port) x ``transport`` (``auto``:
the store's direct client; ``aiohttp``: botocore's). The shards are foreign ones
(``tarfile`` and ``webdataset``), read in 16 KiB chunks, so an epoch is many requests.

Where the servers differ from S3: s3rver 3.7.1 ignores ``If-Match`` on GET (S3 and moto
answer 412), so a replaced object is caught there by the ETag check alone; moto (as run
here, without ``require_auth``) accepts any signature, so wrong credentials are tested on
s3rver, which checks them.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from _procs import alive
from _servers import (
    FAST_RETRY,
    SHORT,
    Backend,
    Dataset,
    assert_exact_epoch,
    open_stream,
    start_s3rver_or_skip,
    upload_foreign,
)

from asyncstream import (
    AccessDeniedError,
    NotFoundError,
    PermanentFetchError,
    S3Credentials,
)
from asyncstream.engine._engine import Engine, EngineConfig
from asyncstream.stores._store import ChunkRequest
from asyncstream.testing import FaultPlan, FaultProxy, TestCertificates
from asyncstream.testing._s3rver import (
    VERSION,
    S3rver,
    S3rverStartError,
    S3rverUnavailable,
    install,
)

_buckets = itertools.count()


@pytest.fixture(params=["http", "https"])
def scheme(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=["auto", "aiohttp"])
def transport(request: pytest.FixtureRequest) -> str:
    """The transport of the engines of the streams the test opens (``FetchConfig``)."""
    return str(request.param)


@pytest.fixture
def dataset(backend: Backend, tmp_path: Path) -> Dataset:
    """8 foreign shards of 12 to 30 samples (70 to 110 KB) in a new bucket."""
    bucket = f"servers-{backend.name}-{next(_buckets)}"
    return upload_foreign(backend.client(), bucket, tmp_path / "shards", 8, seed=14)


@contextmanager
def proxy_for(
    backend: Backend, scheme: str, certs: TestCertificates, **kwargs: Any
) -> Iterator[FaultProxy]:
    """A FaultProxy in front of the server's plain port, listening with TLS for https."""
    tls = certs.server if scheme == "https" else None
    with FaultProxy(backend.http, tls=tls, **kwargs) as proxy:
        yield proxy


def _expected_transport(transport: str) -> str:
    return {"auto": "direct", "aiohttp": "aiohttp"}[transport]


# --------------------------------------------------------------------------- exact epochs


def test_exact_epoch_through_faults(
    backend: Backend, scheme: str, transport: str, dataset: Dataset, certs: TestCertificates
) -> None:
    plan = FaultPlan(slowdown=0.03, reset=0.03, truncate=0.03, match=".tar")
    with proxy_for(backend, scheme, certs, faults=plan, seed=9) as proxy:
        # One of each for sure, on top of the seeded rates; a stall of an hour, too.
        for shard, kind in enumerate(["slowdown", "internal_error", "reset", "truncate", "stall"]):
            proxy.inject(kind, match=dataset.name(shard), method="GET")
        with open_stream(
            dataset, backend.options(proxy.endpoint_url), transport=transport
        ) as stream:
            samples = list(stream)
            fetch = stream.stats()["fetch"]
        injected = proxy.stats()
    assert_exact_epoch(samples, dataset)
    assert fetch["transport"] == _expected_transport(transport)
    for kind in ("slowdown", "internal_error", "reset", "truncate", "stall"):
        assert injected[kind] >= 1, kind
    retries = fetch["retries"]
    assert retries["slowdown"] >= 1
    assert retries["server_error"] >= 1
    assert retries.get("connection", 0) + retries.get("truncated", 0) >= 2
    # The stall is cut by the stall timeout (a retry) or by a hedge that wins first.
    assert retries.get("stall", 0) + fetch["hedge_wins"] >= 1
    assert fetch["failed_chunks"] == 0


def test_exact_epoch_from_the_server_itself(
    backend: Backend, scheme: str, transport: str, dataset: Dataset
) -> None:
    """No proxy: the server's own HTTP or TLS listener (werkzeug's, Node's)."""
    options = backend.options(backend.endpoint(scheme))
    with open_stream(dataset, options, transport=transport) as stream:
        samples = list(stream)
        fetch = stream.stats()["fetch"]
    assert_exact_epoch(samples, dataset)
    assert fetch["transport"] == _expected_transport(transport)
    assert fetch["retries_total"] == 0
    if transport == "auto":
        assert fetch["tls"] == (scheme == "https")


# --------------------------------------------------------------------------- permanent errors


def test_403_and_404_are_permanent_at_once(
    backend: Backend, scheme: str, transport: str, dataset: Dataset, certs: TestCertificates
) -> None:
    """One injected 403 (then 404) fails the epoch: a retry would have succeeded."""
    for status, error in ((403, AccessDeniedError), (404, NotFoundError)):
        # A proxy for each: requests the first stream sent before it stopped may reach a
        # shared proxy after the second fault is injected, and take it.
        with proxy_for(backend, scheme, certs) as proxy:
            options = backend.options(proxy.endpoint_url)
            proxy.inject("status", status=status, match=dataset.name(2), method="GET")
            with (
                open_stream(
                    dataset, options, transport=transport, shuffle=False, hedge=False
                ) as stream,
                pytest.raises(error) as info,
            ):
                list(stream)
            assert dataset.url(2) in str(info.value)
            assert "attempts" not in str(info.value)  # not "giving up after N attempts"
            assert proxy.pending() == 0
            # The fault was injected once: asking for its range again would have read it.
            gets = [r for r in proxy.ranged_requests() if r[0] == "GET"]
            (failed,) = [rng for _, path, rng, code in gets if code == status]
            assert [rng for _, path, rng, _ in gets if path.endswith(dataset.name(2))].count(
                failed
            ) == 1


def test_an_object_deleted_after_listing_is_not_found_at_once(
    backend: Backend, scheme: str, transport: str, dataset: Dataset
) -> None:
    """The server's own 404 (moto's and s3rver's NoSuchKey documents), no proxy."""
    options = backend.options(backend.endpoint(scheme))
    with open_stream(dataset, options, transport=transport, shuffle=False) as stream:
        backend.client().delete_object(Bucket=dataset.bucket, Key=dataset.name(1))
        with pytest.raises(NotFoundError, match="not found") as info:
            list(stream)
    assert dataset.url(1) in str(info.value)
    assert "attempts" not in str(info.value)


@pytest.mark.parametrize("via", ["server", "proxy stripping If-Match"])
def test_a_replaced_object_is_permanent_at_once(
    backend: Backend,
    scheme: str,
    transport: str,
    dataset: Dataset,
    certs: TestCertificates,
    via: str,
) -> None:
    strip = ("if-match",) if via != "server" else ()
    with proxy_for(backend, scheme, certs, strip_request_headers=strip) as proxy:
        endpoint = backend.endpoint(scheme) if via == "server" else proxy.endpoint_url
        with open_stream(
            dataset, backend.options(endpoint), transport=transport, shuffle=False
        ) as stream:
            old = dataset.blobs[dataset.url(3)]
            new = bytes(b ^ 0xFF for b in old)  # same length, another ETag
            backend.client().put_object(Bucket=dataset.bucket, Key=dataset.name(3), Body=new)
            with pytest.raises(PermanentFetchError, match="changed since it was listed") as info:
                list(stream)
    message = str(info.value)
    assert dataset.url(3) in message
    assert "attempts" not in message  # permanent at its first answer, not retried
    if via == "server" and backend.honours_if_match:
        assert "its ETag no longer matches" in message  # the server's 412
    else:
        assert "its ETag is" in message  # served anyway: our ETag check caught it


def test_a_resized_object_is_permanent_without_the_etag_check(
    backend: Backend, transport: str, dataset: Dataset, certs: TestCertificates
) -> None:
    """``check_etag=False``: no If-Match, no ETag comparison; the Content-Range total
    differing from the listed size still says the object changed."""
    with proxy_for(backend, "https", certs) as proxy:
        options = backend.options(proxy.endpoint_url)
        with open_stream(
            dataset, options, transport=transport, shuffle=False, check_etag=False
        ) as stream:
            grown = dataset.blobs[dataset.url(0)] + bytes(1024)
            backend.client().put_object(Bucket=dataset.bucket, Key=dataset.name(0), Body=grown)
            with pytest.raises(PermanentFetchError, match="its size is") as info:
                list(stream)
    assert dataset.url(0) in str(info.value)


# moto here accepts any signature (test_engine checks moto with require_auth).
@pytest.mark.parametrize("backend", ["s3rver"], indirect=True)
def test_wrong_credentials_are_refused_at_once(
    backend: Backend, scheme: str, transport: str, dataset: Dataset
) -> None:
    options = backend.options(
        backend.endpoint(scheme), credentials=S3Credentials("WRONGKEY", "wrong-secret")
    )
    config = EngineConfig(
        inflight=2,
        retry=FAST_RETRY,
        timeouts=SHORT,
        s3=options,
        transport=transport,  # type: ignore[arg-type]
    )
    with Engine(config, n_slots=2, slot_bytes=4096) as engine:
        engine.submit([ChunkRequest(dataset.url(0), 0, 100)])
        with pytest.raises(AccessDeniedError) as info:
            engine.next()
        assert engine.stats()["retries_total"] == 0
    assert dataset.url(0) in str(info.value)
    assert "wrong-secret" not in str(info.value)


# --------------------------------------------------------------------------- the s3rver fixture


def _fake_tool(folder: Path, name: str, script: str) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)


def test_s3rver_cannot_run_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the fixtures skip with: no Node.js, or an install that fails (offline)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    with pytest.raises(S3rverUnavailable, match="node is not on PATH"):
        install(tmp_path / "cache")
    _fake_tool(bin_dir, "node", "exit 0")
    _fake_tool(bin_dir, "npm", "echo 'npm error code ENOTFOUND registry.npmjs.org' >&2; exit 1")
    with pytest.raises(
        S3rverUnavailable, match=f"s3rver@{VERSION} failed .exit 1.: npm error code"
    ):
        install(tmp_path / "cache")


def test_an_installed_s3rver_that_does_not_start_fails_instead_of_skipping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Installed (the cache holds s3rver's package), but ``node`` dies at start: the error
    is :class:`S3rverStartError`, which the fixtures let through (a failure), not
    :class:`S3rverUnavailable` (a skip), and it says how it ended, with its log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    package = tmp_path / "cache" / "asyncstream-tests" / f"s3rver-{VERSION}" / "node_modules"
    (package / "s3rver" / "bin").mkdir(parents=True)
    (package / "s3rver" / "package.json").write_text(json.dumps({"version": VERSION}))
    (package / "s3rver" / "bin" / "s3rver.js").write_text("")
    _fake_tool(bin_dir, "npm", "exit 0")
    _fake_tool(bin_dir, "node", "echo 'Error: Cannot find module' >&2; exit 3")
    with pytest.raises(S3rverStartError, match="installed but exited with code 3") as info:
        start_s3rver_or_skip(S3rver(tmp_path / "server"))
    assert "Cannot find module" in str(info.value)
    assert not isinstance(info.value, S3rverUnavailable)


_PARENT = """
import sys, time
from pathlib import Path
from asyncstream.testing._s3rver import S3rver
server = S3rver(Path(sys.argv[1])).start()
print(server._proc.pid, flush=True)
time.sleep(600)
"""


def test_s3rver_stops_with_close_and_with_a_killed_test_process(
    s3rver: S3rver, tmp_path: Path
) -> None:
    with S3rver(tmp_path / "a") as server:
        assert server._proc is not None
        pid = server._proc.pid
        assert server.client().list_buckets()["Buckets"] == []  # its own folder
    assert not alive(pid)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, str(tmp_path / "b")],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert parent.stdout is not None
        node = int(parent.stdout.readline())
        assert alive(node)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while alive(node) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(node)  # its stdin closed: it exited
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        assert parent.stdout is not None
        parent.stdout.close()
