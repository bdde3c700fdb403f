"""The embedded S3 server starts, serves, and stops without leaving anything behind."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import threading
import tracemalloc
import warnings
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from asyncstream import LocalS3
from asyncstream.testing import MotoRangesWarning, _moto_ranges
from asyncstream.testing._moto_ranges import mismatches


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
        if mode == "process":  # its own process, alive while it serves
            assert server.pid is not None
            assert server.pid != os.getpid()
            os.kill(server.pid, 0)
        else:
            assert server.pid is None
    assert not _port_open(endpoint)
    assert server.pid is None
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
    with pytest.raises(ValueError, match="port"):
        LocalS3(port=70000)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_serves_on_the_port_given(mode: str, aws_env: dict[str, str]) -> None:
    port = _free_port()
    with LocalS3(mode=mode, port=port) as server:  # type: ignore[arg-type]
        assert server.endpoint_url == f"http://127.0.0.1:{port}"
        server.client().create_bucket(Bucket="on-a-port")
    assert not _port_open(f"http://127.0.0.1:{port}")


def test_a_port_in_use_fails_at_once_naming_the_cause(aws_env: dict[str, str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match="in use"):
            LocalS3(port=port).start()
        # In a child process: its stderr's last lines come with the error.
        with pytest.raises(RuntimeError, match=r"(?s)exited with status 1.*in use"):
            LocalS3(mode="process", port=port).start()


def test_a_child_that_fails_to_start_shows_its_stderr(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.pem")
    server = LocalS3(mode="process", tls=(missing, missing))
    with pytest.raises(RuntimeError) as failed:
        server.start()
    message = str(failed.value)
    assert "the local S3 server" in message
    assert "exited with status" in message
    assert "its stderr ends with:" in message
    assert "FileNotFoundError" in message or "No such file" in message
    server.close()


def test_without_moto_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "moto.server", None)  # import moto.server fails
    for mode in ("thread", "process"):
        with pytest.raises(ImportError, match=r"pip install 'moto\[server\]>=5\.0,<6'"):
            LocalS3(mode=mode).start()  # type: ignore[arg-type]


# -- the moto patch is guarded --------------------------------------------------------


def test_the_installed_moto_is_the_one_the_patch_was_written_against() -> None:
    """In a fresh process (this one's moto may be patched already): nothing differs, the
    patch goes in, and nothing warns."""
    code = (
        "import moto\n"
        "from moto.s3.models import FakeKey\n"
        "from moto.s3.responses import S3Response\n"
        "from asyncstream.testing import _moto_ranges\n"
        "assert _moto_ranges.mismatches(moto.__version__, S3Response, FakeKey) == []\n"
        "assert _moto_ranges.install() is True\n"
        "assert S3Response.get_object.__module__ == 'asyncstream.testing._moto_ranges'\n"
    )
    proc = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def _fake_internals() -> tuple[type, type]:
    class Responses:
        def get_object(self) -> Any:
            key: Any = None
            return 200, {}, key.value

        def key_response(self) -> Any:
            status_code = 200
            if status_code == 200:
                return self._handle_range_header()  # type: ignore[attr-defined]
            return None

    class Key:
        def __init__(self) -> None:
            self._value_buffer = None
            self.lock = None

        @property
        def value(self) -> bytes:
            return b""

    return Responses, Key


def test_the_guard_names_each_difference() -> None:
    responses, key = _fake_internals()
    assert mismatches("5.2.5", responses, key) == []  # the shape the patch relies on
    assert mismatches("6.0.0", responses, key) == [
        "moto 6.0.0 is outside the versions it was written for (5.x)"
    ]
    assert "moto 4.2.14" in mismatches("4.2.14", responses, key)[0]

    def get_object(self: Any, request: Any) -> Any:
        return 200, {}, request.value

    changed = type("Responses", (responses,), {"get_object": get_object})
    assert mismatches("5.2.5", changed, key) == [
        "S3Response.get_object(self, request) is not (self)",
        "S3Response.get_object no longer answers with key.value",
    ]
    plain_value = type("Key", (key,), {"value": b"a class attribute"})
    assert mismatches("5.2.5", responses, plain_value) == ["FakeKey.value is not a property"]
    gone = type("Responses", (), {})
    assert mismatches("5.2.5", gone, object) == [
        "S3Response.get_object is missing or not a plain function",
        "S3Response.key_response no longer applies ranges to 200 answers only",
        "FakeKey.value is not a property",
        "FakeKey no longer keeps its body in _value_buffer under self.lock",
    ]


def test_a_changed_moto_is_left_alone_with_one_loud_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from moto.s3.models import FakeKey
    from moto.s3.responses import S3Response

    def get_object(self: Any, part: int = 0) -> Any:  # a moto whose signature moved on
        raise AssertionError("never called here")

    value_before = FakeKey.__dict__["value"]
    monkeypatch.setattr(S3Response, "get_object", get_object)
    monkeypatch.setattr(_moto_ranges, "_state", {"done": False, "patched": False})
    with pytest.warns(MotoRangesWarning, match=r"get_object\(self, part\) is not"):
        assert _moto_ranges.install() is False
    assert S3Response.get_object is get_object  # not wrapped
    assert FakeKey.__dict__["value"] is value_before
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _moto_ranges.install() is False  # once per process: no second warning


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
