"""The embedded S3 server starts, serves, and stops without leaving anything behind."""

from __future__ import annotations

import socket
import threading

import pytest

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
