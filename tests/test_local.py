"""The embedded S3 server starts, serves, and stops without leaving anything behind."""

from __future__ import annotations

import random
import socket
import threading
import tracemalloc
from typing import Any

import pytest
from botocore.exceptions import ClientError

from asyncstream import LocalS3


def _port_open(endpoint: str) -> bool:
    host, port = endpoint.removeprefix("http://").split(":")
    with socket.socket() as sock:
        sock.settimeout(2)
        return sock.connect_ex((host, int(port))) == 0


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_serves_and_stops_cleanly(mode: str, aws_env: dict[str, str]) -> None:
    threads_before = set(threading.enumerate())
    server = LocalS3(mode=mode)  # type: ignore[arg-type]
    with server:
        endpoint = server.endpoint_url
        assert endpoint.startswith("http://127.0.0.1:")
        client = server.client()
        client.create_bucket(Bucket="roundtrip")
        client.put_object(Bucket="roundtrip", Key="k", Body=b"hello")
        body = client.get_object(Bucket="roundtrip", Key="k", Range="bytes=1-3")["Body"]
        assert body.read() == b"ell"
    assert not _port_open(endpoint)
    leftover = [t for t in threading.enumerate() if t not in threads_before and t.is_alive()]
    assert leftover == []
    with pytest.raises(RuntimeError, match="not running"):
        _ = server.endpoint_url
    with pytest.raises(RuntimeError, match="closed"):
        server.start()
    server.close()  # idempotent


def test_each_server_starts_empty(aws_env: dict[str, str]) -> None:
    with LocalS3(mode="process") as first:
        first.client().create_bucket(Bucket="left-behind")
    with LocalS3(mode="process") as second:
        assert second.client().list_buckets()["Buckets"] == []


def test_reset_empties_the_server(aws_env: dict[str, str]) -> None:
    with LocalS3(mode="process") as server:
        client = server.client()
        client.create_bucket(Bucket="to-reset")
        server.reset()
        assert client.list_buckets()["Buckets"] == []


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="mode"):
        LocalS3(mode="fork")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="process"):
        LocalS3(require_auth=True)


# -- ranged GETs read only their range ---------------------------------------------


@pytest.fixture
def big_object(s3_server: LocalS3) -> tuple[Any, bytes]:
    """A 48 MiB object of random bytes (moto spills it to a temporary file)."""
    client = s3_server.client()
    if "ranges" not in {b["Name"] for b in client.list_buckets()["Buckets"]}:
        client.create_bucket(Bucket="ranges")
    data = random.Random(5).randbytes(48 << 20)
    client.put_object(Bucket="ranges", Key="big", Body=data)
    return client, data


@pytest.mark.parametrize(
    ("spec", "begin", "end"),
    [
        ("bytes=0-0", 0, 1),
        ("bytes=1000-2000", 1000, 2001),
        ("bytes=10485760-", 10 << 20, 48 << 20),  # open-ended
        ("bytes=50331000-99999999", 50331000, 48 << 20),  # past the end: up to the end
    ],
)
def test_ranged_get_serves_exactly_its_range(
    big_object: tuple[Any, bytes], spec: str, begin: int, end: int
) -> None:
    client, data = big_object
    response = client.get_object(Bucket="ranges", Key="big", Range=spec)
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert response["ContentRange"] == f"bytes {begin}-{end - 1}/{len(data)}"
    assert response["ContentLength"] == end - begin
    assert response["Body"].read() == data[begin:end]
    assert response["ETag"] == client.head_object(Bucket="ranges", Key="big")["ETag"]


def test_requests_the_fast_path_does_not_take_keep_moto_answers(
    big_object: tuple[Any, bytes],
) -> None:
    client, data = big_object
    etag = client.head_object(Bucket="ranges", Key="big")["ETag"]
    assert client.get_object(Bucket="ranges", Key="big")["Body"].read() == data  # no range
    suffix = client.get_object(Bucket="ranges", Key="big", Range="bytes=-10")
    assert suffix["Body"].read() == data[-10:]  # suffix ranges: moto's own handling
    matched = client.get_object(Bucket="ranges", Key="big", Range="bytes=5-9", IfMatch=etag)
    assert matched["Body"].read() == data[5:10]
    with pytest.raises(ClientError) as failed:  # the object changed: 412, as S3 does
        client.get_object(Bucket="ranges", Key="big", Range="bytes=5-9", IfMatch='"0"')
    assert failed.value.response["Error"]["Code"] == "PreconditionFailed"
    with pytest.raises(ClientError) as missing:
        client.get_object(Bucket="ranges", Key="absent", Range="bytes=0-9")
    assert missing.value.response["Error"]["Code"] == "NoSuchKey"
    with pytest.raises(ClientError) as unsatisfiable:
        client.get_object(Bucket="ranges", Key="big", Range="bytes=999999999-")
    assert unsatisfiable.value.response["Error"]["Code"] == "InvalidRange"


def test_a_small_range_of_a_big_object_does_not_read_the_object(
    big_object: tuple[Any, bytes],
) -> None:
    """The session's server runs in this process: its allocations are traced here.

    moto alone reads the whole object (48 MiB, then slices it); an unrelated allocation
    of about 10 MB sometimes shows up in any request's peak, hence the loose bound.
    """
    client, data = big_object
    client.get_object(Bucket="ranges", Key="big", Range="bytes=0-99")["Body"].read()  # warm
    tracemalloc.start()
    try:
        body = client.get_object(Bucket="ranges", Key="big", Range="bytes=4096-8191")
        assert body["Body"].read() == data[4096:8192]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 24 << 20
