"""nginx as a store (asyncstream/testing/_nginx.py), real nginx: exact epochs through
ShardStream for the web store and the S3 store over HTTP and HTTPS, the S3 profile's
bucket requests (listing pages, common prefixes, S3's 404s), the link's first-byte delay
and rate, the pinning, and a clean stop. Skipped, with the reason, where nginx with its
Lua module can be neither found nor unpacked from Debian's packages."""

from __future__ import annotations

import http.client
import os
import shutil
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import botocore.exceptions
import pytest
from _servers_web import WebData

from asyncstream import configure_store
from asyncstream.stores._s3 import sync_client
from asyncstream.testing import (
    NetworkProfile,
    Nginx,
    NginxStartError,
    NginxUnavailable,
    TestCertificates,
    _nginxinstall,
)
from tests.test_webstore import assert_exact, read_all

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux only")


def start_or_skip(server: Nginx) -> Nginx:
    """Started, or the test skipped where nginx cannot be had; one that is there but does
    not start raises NginxStartError, which fails the test."""
    try:
        return server.start()
    except NginxUnavailable as exc:
        pytest.skip(f"nginx with its Lua module cannot be installed here: {exc}")


BUCKET = "shards"


@pytest.fixture(scope="module")
def nginx(
    web_data: WebData, certs: TestCertificates, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Nginx]:
    """nginx over a copy of the web tests' shards (in ``shards/``, a bucket), HTTP and
    HTTPS, unshaped."""
    root = tmp_path_factory.mktemp("nginx")
    shutil.copytree(web_data.root / "ds", root / BUCKET)
    server = start_or_skip(Nginx(root, tls=certs.server, ca_bundle=certs.ca))
    try:
        yield server
    finally:
        server.close()


def local_samples(data: WebData) -> dict[str, dict[str, bytes]]:
    """The samples of the same shards read from the local folder by ShardStream."""
    samples = read_all(str(data.root / "ds"), data)
    return {
        s["__key__"]: {k: bytes(v) for k, v in s.items() if not k.startswith("__")} for s in samples
    }


def by_key(samples: list[dict[str, Any]]) -> dict[str, dict[str, bytes]]:
    return {
        s["__key__"]: {k: bytes(v) for k, v in s.items() if not k.startswith("__")} for s in samples
    }


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_web_store_reads_exact_epochs(
    nginx: Nginx, web_data: WebData, certs: TestCertificates, scheme: str
) -> None:
    """Two epochs of the web store's URLs: every sample once each, the local folder's bytes."""
    base = nginx.https_url if scheme == "https" else nginx.url
    configure_store("https", ca_bundle=certs.ca)
    try:
        first = read_all(web_data.pattern(base, BUCKET), web_data)
        second = read_all(web_data.pattern(base, BUCKET), web_data, seed=9)
    finally:
        configure_store("https")
    assert_exact(first, web_data)
    assert_exact(second, web_data)
    assert by_key(first) == local_samples(web_data)
    gets = [r for r in nginx.requests() if r.method == "GET" and r.path.startswith(f"/{BUCKET}/")]
    assert gets
    assert all(r.status in (200, 206) for r in gets)


@pytest.mark.parametrize("https", [False, True], ids=["http", "https"])
@pytest.mark.parametrize("listed", [True, False], ids=["prefix", "named"])
def test_s3_store_reads_exact_epochs(
    nginx: Nginx, web_data: WebData, https: bool, listed: bool
) -> None:
    """The S3 store, path-style, on the same folder: a prefix (ListObjectsV2 in Lua) or the
    shards named by a brace pattern (HEADs): every sample once, the local folder's bytes."""
    url = f"s3://{BUCKET}/" if listed else web_data.pattern("s3:/", BUCKET)
    samples = read_all(url, web_data, s3=nginx.options(https=https))
    assert_exact(samples, web_data)
    assert by_key(samples) == local_samples(web_data)


def test_the_s3_profile_answers_bucket_requests_as_s3(nginx: Nginx, web_data: WebData) -> None:
    """Listing pages, common prefixes, HEAD of a bucket, and S3's 404s, through botocore."""
    client = sync_client(nginx.options())
    names = sorted(p.name for p in (nginx.root / BUCKET).iterdir() if p.is_file())
    paginator = client.get_paginator("list_objects_v2")
    pages = paginator.paginate(Bucket=BUCKET, PaginationConfig={"PageSize": 3})
    listed = [o for page in pages for o in page.get("Contents", [])]
    assert [o["Key"] for o in listed] == names
    for obj in listed:
        head = client.head_object(Bucket=BUCKET, Key=obj["Key"])
        assert (head["ETag"], head["ContentLength"]) == (obj["ETag"], obj["Size"])
        assert head["LastModified"] == obj["LastModified"]
    tops = client.list_objects_v2(Bucket=BUCKET, Prefix="part-0000", Delimiter="0")
    assert [p["Prefix"] for p in tops["CommonPrefixes"]] == ["part-00000"]
    assert [o["Key"] for o in tops["Contents"]] == names[1:]
    body = client.get_object(Bucket=BUCKET, Key=names[0], Range="bytes=10-19")["Body"].read()
    assert body == (nginx.root / BUCKET / names[0]).read_bytes()[10:20]
    client.head_bucket(Bucket=BUCKET)
    with pytest.raises(botocore.exceptions.ClientError, match="NoSuchKey"):
        client.get_object(Bucket=BUCKET, Key="nothing.tar")
    with pytest.raises(botocore.exceptions.ClientError, match="NoSuchBucket"):
        client.get_object(Bucket="no-bucket", Key="nothing.tar")
    with pytest.raises(botocore.exceptions.ClientError, match="404"):
        client.head_bucket(Bucket="no-bucket")


def test_refresh_lists_files_added_after_the_start(nginx: Nginx, web_data: WebData) -> None:
    """The listing is a snapshot: a new bucket shows once refreshed; its files are served at
    once."""
    folder = nginx.root / "nginx-later"
    folder.mkdir(exist_ok=True)
    (folder / "x.bin").write_bytes(b"0123456789")
    client = sync_client(nginx.options())
    with urllib.request.urlopen(f"{nginx.url}/nginx-later/x.bin") as answer:
        assert answer.read() == b"0123456789"
    with pytest.raises(botocore.exceptions.ClientError, match="NoSuchBucket"):
        client.list_objects_v2(Bucket="nginx-later")
    assert nginx.refresh() >= len(web_data.counts) + 1
    assert [o["Key"] for o in client.list_objects_v2(Bucket="nginx-later")["Contents"]] == ["x.bin"]


def _timed_get(url: str) -> tuple[bytes, float]:
    began = time.monotonic()
    with urllib.request.urlopen(url) as answer:
        body = answer.read()
    return body, time.monotonic() - began


def test_the_first_byte_delay_and_the_rate_take_effect(tmp_path: Path) -> None:
    """A 0.3 s delay and 2 MB/s per connection: the configuration says so, no response
    comes sooner than the delay, and 2 MB take at least 0.5 s more on a fresh connection
    (TCP sends its first ten segments, at most 64 kB each on loopback, unpaced) and 0.8 s
    on the same connection kept alive (nginx's limit_rate would send a body under a
    second's worth at once). Lower bounds only: a loaded machine is slower, never faster."""
    bucket = tmp_path / "b"
    bucket.mkdir()
    body = os.urandom(2_000_000)
    (bucket / "body.bin").write_bytes(body)
    (bucket / "small.bin").write_bytes(b"x")
    link = NetworkProfile(first_byte_latency=(0.3, 0.3), bandwidth_bytes_per_s=2e6)
    with start_or_skip(Nginx(tmp_path, profile=link)) as server:
        assert "require('asyncstream_link').enter(2000000, 0.3, 0.0)" in server.configuration(1)
        got, took = _timed_get(f"{server.url}/b/small.bin")
        assert got == b"x"
        assert took >= 0.28
        connection = http.client.HTTPConnection(server.url.removeprefix("http://"))
        try:
            for least in (0.5, 0.8):  # fresh, then kept alive
                began = time.monotonic()
                connection.request("GET", "/b/body.bin")
                assert connection.getresponse().read() == body
                assert time.monotonic() - began >= 0.28 + least
        finally:
            connection.close()
        client = sync_client(server.options())
        began = time.monotonic()
        assert client.list_objects_v2(Bucket="b")["KeyCount"] == 2
        assert time.monotonic() - began >= 0.28
    with start_or_skip(Nginx(tmp_path)) as plain:
        assert "asyncstream_link" not in plain.configuration(1)


def test_pinned_to_a_cpu_and_stopped_cleanly(tmp_path: Path) -> None:
    """``cpu=`` pins the process (as the kernel reports it); close ends it and removes its
    prefix; a CPU this process may not use is refused."""
    cpu = max(os.sched_getaffinity(0))
    server = start_or_skip(Nginx(tmp_path, cpu=cpu))
    pid, prefix = server.pid, server._prefix
    assert pid is not None
    assert prefix is not None
    assert prefix.is_dir()
    try:
        assert server.cpus() == {cpu}
    finally:
        server.close()
    assert server.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not prefix.exists()
    server.close()  # again: nothing to do
    with pytest.raises(ValueError, match="cpu"):
        Nginx(tmp_path, cpu=max(os.sched_getaffinity(0)) + 4096)
    odd = tmp_path / 'a"b'
    odd.mkdir()
    with pytest.raises(ValueError, match="configuration cannot"):
        Nginx(odd).start()


def test_an_nginx_that_does_not_start_is_a_failure(tmp_path: Path) -> None:
    """An installed nginx that exits at start (a certificate that is not there) raises
    NginxStartError with its log, not a skip; nothing is left running."""
    missing = str(tmp_path / "missing.pem")
    with pytest.raises(NginxStartError, match=r"exited with code .*missing\.pem"):
        start_or_skip(Nginx(tmp_path, tls=(missing, missing)))


def test_without_nginx_or_apt_the_reason_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No nginx with the Lua module on the machine, nothing unpacked, no apt-get on PATH:
    NginxUnavailable says so (what the fixtures skip with)."""
    if _nginxinstall._system() is not None:
        pytest.skip("nginx with its Lua module is installed system-wide here")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(NginxUnavailable, match="apt-get is not on PATH"):
        _nginxinstall.install(tmp_path / "cache")
