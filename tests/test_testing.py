"""FaultProxy against the real moto server: forwarding, every fault as clients see it, shaping.

Clients are made with botocore's retries off (one attempt), so each fault is observed raw.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import http.client
import io
import os
import pathlib
import socket
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import FrozenInstanceError
from typing import Any

import aiohttp
import botocore.exceptions
import pytest
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session

from asyncstream.stores._s3 import S3Options, sync_client
from asyncstream.testing import Fault, FaultPlan, FaultProxy, LocalS3, NetworkProfile

MiB = 1024 * 1024


def make_client(endpoint: str, *, read_timeout: float = 10.0) -> Any:
    """A botocore client with a single attempt, so faults are not retried away."""
    options = S3Options(endpoint_url=endpoint, metadata_attempts=1, read_timeout=read_timeout)
    return sync_client(options.resolve())


@pytest.fixture
def client(proxy: FaultProxy) -> Any:
    return make_client(proxy.endpoint_url)


@pytest.fixture
def blob(s3_client: Any, bucket: str) -> bytes:
    """A 1 MiB object ``blob`` in the test's bucket, put directly (not via the proxy)."""
    data = os.urandom(MiB)
    s3_client.put_object(Bucket=bucket, Key="blob", Body=data)
    return data


def presigned_path(client: Any, bucket: str, key: str, method: str = "get_object") -> str:
    """Path and query of a presigned URL: moto accepts it from an unsigning raw client."""
    url = client.generate_presigned_url(method, Params={"Bucket": bucket, "Key": key})
    split = urllib.parse.urlsplit(url)
    return f"{split.path}?{split.query}"


def raw_get(endpoint: str, path: str) -> tuple[bytes, dict[str, str], bytes, OSError | None]:
    """GET over a bare socket: (status line, headers, body bytes received, error if any)."""
    split = urllib.parse.urlsplit(endpoint)
    assert split.hostname is not None
    assert split.port is not None
    buf = bytearray()
    error: OSError | None = None
    with socket.create_connection((split.hostname, split.port), timeout=10) as sock:
        request = f"GET {path} HTTP/1.1\r\nHost: {split.netloc}\r\nConnection: close\r\n\r\n"
        sock.sendall(request.encode())
        try:
            while chunk := sock.recv(MiB):
                buf += chunk
        except OSError as exc:
            error = exc
    head, _, body = bytes(buf).partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, body, error


def error_code(exc: botocore.exceptions.ClientError) -> tuple[str, int]:
    return exc.response["Error"]["Code"], exc.response["ResponseMetadata"]["HTTPStatusCode"]


def join_new_threads(before: set[threading.Thread], timeout: float = 5.0) -> None:
    """Wait (bounded) for threads started since ``before`` (e.g. moto's per-connection ones)."""
    deadline = time.monotonic() + timeout
    for thread in set(threading.enumerate()) - before:
        thread.join(max(0.0, deadline - time.monotonic()))


# --------------------------------------------------------------------------- forwarding


def test_put_and_get_through_the_proxy(
    proxy: FaultProxy, client: Any, s3_client: Any, bucket: str
) -> None:
    data = os.urandom(300_000)
    client.put_object(Bucket=bucket, Key="a/b c.bin", Body=data)
    # A file-like body makes botocore send "Expect: 100-continue".
    client.put_object(Bucket=bucket, Key="expect", Body=io.BytesIO(data))
    assert client.get_object(Bucket=bucket, Key="a/b c.bin")["Body"].read() == data
    assert s3_client.get_object(Bucket=bucket, Key="expect")["Body"].read() == data
    head = client.head_object(Bucket=bucket, Key="expect")
    assert head["ContentLength"] == len(data)
    stats = proxy.stats()
    assert stats["requests"] == stats["forwarded"] == 4
    assert stats["bytes_forwarded"] == len(data)
    assert all(stats[kind.value] == 0 for kind in Fault)


def test_ranged_get_returns_the_right_bytes(client: Any, bucket: str, blob: bytes) -> None:
    for spec, expected in [
        ("bytes=0-0", blob[:1]),
        ("bytes=1000-1999", blob[1000:2000]),
        ("bytes=-10", blob[-10:]),
        (f"bytes={MiB - 5}-", blob[-5:]),
    ]:
        response = client.get_object(Bucket=bucket, Key="blob", Range=spec)
        assert response["ResponseMetadata"]["HTTPStatusCode"] == 206
        assert response["Body"].read() == expected, spec


def test_keep_alive_serves_many_requests_on_one_connection(
    proxy: FaultProxy, client: Any, bucket: str, blob: bytes
) -> None:
    for i in range(40):
        part = client.get_object(Bucket=bucket, Key="blob", Range=f"bytes={i}-{i + 99}")
        assert part["Body"].read() == blob[i : i + 100]
    stats = proxy.stats()
    assert stats["requests"] == 40
    assert stats["connections"] == 1


def test_multi_megabyte_object_streams_intact(
    proxy: FaultProxy, client: Any, s3_client: Any, bucket: str
) -> None:
    data = os.urandom(24 * MiB)
    s3_client.put_object(Bucket=bucket, Key="big", Body=data)
    body = client.get_object(Bucket=bucket, Key="big")["Body"]
    digest = hashlib.sha256()
    for chunk in body.iter_chunks(MiB):
        digest.update(chunk)
    assert digest.digest() == hashlib.sha256(data).digest()
    assert proxy.stats()["bytes_forwarded"] == len(data)


def test_concurrent_clients_are_counted_exactly(
    proxy: FaultProxy, client: Any, bucket: str, blob: bytes
) -> None:
    def get(i: int) -> bytes:
        return bytes(
            client.get_object(Bucket=bucket, Key="blob", Range=f"bytes={i}-{i}")["Body"].read()
        )

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(get, range(64)))
    assert got == [blob[i : i + 1] for i in range(64)]
    stats = proxy.stats()
    assert stats["requests"] == stats["forwarded"] == 64
    assert stats["bytes_forwarded"] == 64
    assert 1 <= stats["connections"] <= 8


def test_chunked_request_body_is_forwarded(
    proxy: FaultProxy, client: Any, s3_client: Any, bucket: str
) -> None:
    path = presigned_path(client, bucket, "chunked", "put_object")
    split = urllib.parse.urlsplit(proxy.endpoint_url)
    conn = http.client.HTTPConnection(split.hostname or "", split.port, timeout=10)
    try:
        conn.request("PUT", path, body=iter([b"hello", b", ", b"world"]), encode_chunked=True)
        response = conn.getresponse()
        response.read()
        assert response.status == 200
        # The same connection stays usable after a chunked request.
        conn.request("GET", presigned_path(client, bucket, "chunked"))
        again = conn.getresponse()
        assert again.read() == b"hello, world"
    finally:
        conn.close()
    assert s3_client.get_object(Bucket=bucket, Key="chunked")["Body"].read() == b"hello, world"


def test_unreachable_upstream_answers_502(aws_env: dict[str, str]) -> None:
    with socket.socket() as sock:  # a port that nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with FaultProxy(f"http://127.0.0.1:{port}") as proxy:
        status, headers, _, _ = raw_get(proxy.endpoint_url, "/bucket/key")
    assert status.startswith(b"HTTP/1.1 502")
    assert headers["connection"] == "close"


# --------------------------------------------------------------------------- error faults


def test_slowdown_is_s3s_503(proxy: FaultProxy, client: Any, bucket: str, blob: bytes) -> None:
    proxy.inject(Fault.SLOWDOWN)
    with pytest.raises(botocore.exceptions.ClientError) as info:
        client.get_object(Bucket=bucket, Key="blob")
    assert error_code(info.value) == ("SlowDown", 503)
    assert info.value.response["Error"]["Message"] == "Please reduce your request rate."
    # The request never reached the server, and the connection stays usable.
    assert proxy.stats()["forwarded"] == 0
    assert client.get_object(Bucket=bucket, Key="blob")["Body"].read() == blob
    assert proxy.stats()["slowdown"] == 1


def test_slowdown_wire_format(proxy: FaultProxy, client: Any, bucket: str, blob: bytes) -> None:
    proxy.inject("slowdown")
    status, headers, body, error = raw_get(
        proxy.endpoint_url, presigned_path(client, bucket, "blob")
    )
    assert error is None
    assert status == b"HTTP/1.1 503 Slow Down"
    assert headers["content-type"] == "application/xml"
    assert int(headers["content-length"]) == len(body)
    assert "x-amz-request-id" in headers
    assert body.startswith(b'<?xml version="1.0" encoding="UTF-8"?>')
    assert (
        b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message>" in body
    )


def test_internal_error_is_a_500(proxy: FaultProxy, client: Any, bucket: str, blob: bytes) -> None:
    proxy.inject("internal_error")
    with pytest.raises(botocore.exceptions.ClientError) as info:
        client.get_object(Bucket=bucket, Key="blob")
    assert error_code(info.value) == ("InternalError", 500)


def test_status_fault_with_s3_codes(
    proxy: FaultProxy, client: Any, bucket: str, blob: bytes
) -> None:
    proxy.inject("status", status=403)
    proxy.inject("status", status=400, code="ExpiredToken", message="The token has expired.")
    with pytest.raises(botocore.exceptions.ClientError) as info:
        client.get_object(Bucket=bucket, Key="blob")
    assert error_code(info.value) == ("AccessDenied", 403)
    with pytest.raises(botocore.exceptions.ClientError) as info:
        client.get_object(Bucket=bucket, Key="blob")
    assert error_code(info.value) == ("ExpiredToken", 400)
    assert info.value.response["Error"]["Message"] == "The token has expired."
    assert proxy.stats()["status"] == 2


def test_error_fault_on_head_has_no_body(
    proxy: FaultProxy, client: Any, bucket: str, blob: bytes
) -> None:
    proxy.inject("slowdown", method="HEAD")
    with pytest.raises(botocore.exceptions.ClientError) as info:
        client.head_object(Bucket=bucket, Key="blob")
    # A HEAD error has no body, so botocore names the error by its status, as with S3.
    assert error_code(info.value) == ("503", 503)


def test_error_fault_on_put_with_expect_continue(
    proxy: FaultProxy, client: Any, s3_client: Any, bucket: str
) -> None:
    proxy.inject("slowdown", method="PUT")
    with pytest.raises(botocore.exceptions.ClientError) as info:
        client.put_object(Bucket=bucket, Key="up", Body=io.BytesIO(b"x" * 200_000))
    assert error_code(info.value) == ("SlowDown", 503)
    client.put_object(Bucket=bucket, Key="up", Body=io.BytesIO(b"y" * 200_000))
    assert s3_client.get_object(Bucket=bucket, Key="up")["Body"].read() == b"y" * 200_000


# --------------------------------------------------------------------------- body faults


def test_reset_mid_body(proxy: FaultProxy, client: Any, bucket: str, blob: bytes) -> None:
    proxy.inject(Fault.RESET)
    response = client.get_object(Bucket=bucket, Key="blob")  # the head arrives intact
    assert response["ContentLength"] == len(blob)
    with pytest.raises(botocore.exceptions.ResponseStreamingError) as info:
        response["Body"].read()
    assert "ConnectionResetError" in str(info.value)
    assert proxy.stats()["reset"] == 1
    # The client's next request opens a fresh connection and succeeds.
    assert client.get_object(Bucket=bucket, Key="blob")["Body"].read() == blob


def test_reset_on_the_wire(proxy: FaultProxy, client: Any, bucket: str, blob: bytes) -> None:
    proxy.inject("reset", after_bytes=1000)
    status, headers, body, error = raw_get(
        proxy.endpoint_url, presigned_path(client, bucket, "blob")
    )
    assert status == b"HTTP/1.1 200 OK"
    assert int(headers["content-length"]) == len(blob)
    assert isinstance(error, ConnectionResetError)
    # At most the bytes before the cut: an RST drops what the peer has not yet received.
    assert len(body) <= 1000
    assert body == blob[: len(body)]


def test_truncate_closes_cleanly_before_content_length(
    proxy: FaultProxy, client: Any, bucket: str, blob: bytes
) -> None:
    proxy.inject("truncate", body_fraction=0.25)
    _, headers, body, error = raw_get(proxy.endpoint_url, presigned_path(client, bucket, "blob"))
    assert error is None  # a FIN, not a reset
    assert int(headers["content-length"]) == len(blob)
    assert body == blob[: len(blob) // 4]

    proxy.inject("truncate")
    response = client.get_object(Bucket=bucket, Key="blob")
    with pytest.raises(botocore.exceptions.ResponseStreamingError) as info:
        response["Body"].read()
    assert f"IncompleteRead({len(blob) // 2} bytes read" in str(info.value)
    assert proxy.stats()["truncate"] == 2


def test_stall_hits_the_clients_read_timeout(proxy: FaultProxy, bucket: str, blob: bytes) -> None:
    client = make_client(proxy.endpoint_url, read_timeout=0.3)
    proxy.inject("stall")
    response = client.get_object(Bucket=bucket, Key="blob")
    started = time.monotonic()
    with pytest.raises(botocore.exceptions.ReadTimeoutError):
        response["Body"].read()
    assert time.monotonic() - started >= 0.3
    # Stalled on the head instead: the call itself times out.
    proxy.inject("stall", body_fraction=0.0)
    with pytest.raises(botocore.exceptions.ReadTimeoutError):
        client.get_object(Bucket=bucket, Key="blob")["Body"].read()
    assert proxy.stats()["stall"] == 2


def test_short_stall_resumes_the_body(
    proxy: FaultProxy, client: Any, bucket: str, blob: bytes
) -> None:
    proxy.inject("stall", seconds=0.3)
    started = time.monotonic()
    assert client.get_object(Bucket=bucket, Key="blob")["Body"].read() == blob
    assert time.monotonic() - started >= 0.3


def test_latency_delays_the_response(
    proxy: FaultProxy, client: Any, bucket: str, blob: bytes
) -> None:
    proxy.inject(Fault.LATENCY, seconds=0.3)
    started = time.monotonic()
    assert client.get_object(Bucket=bucket, Key="blob")["Body"].read() == blob
    assert time.monotonic() - started >= 0.3
    assert proxy.stats()["latency"] == 1


def test_inject_count_match_and_method(
    proxy: FaultProxy, client: Any, s3_client: Any, bucket: str, blob: bytes
) -> None:
    s3_client.put_object(Bucket=bucket, Key="other", Body=b"other")
    proxy.inject("slowdown", count=2, match="blob", method="GET")
    assert proxy.pending() == 2
    assert client.get_object(Bucket=bucket, Key="other")["Body"].read() == b"other"
    assert client.head_object(Bucket=bucket, Key="blob")["ContentLength"] == len(blob)
    for _ in range(2):
        with pytest.raises(botocore.exceptions.ClientError):
            client.get_object(Bucket=bucket, Key="blob")
    assert proxy.pending() == 0
    assert client.get_object(Bucket=bucket, Key="blob")["Body"].read() == blob
    proxy.inject("slowdown", count=5)
    proxy.clear()
    assert proxy.pending() == 0
    assert client.get_object(Bucket=bucket, Key="blob")["Body"].read() == blob
    assert proxy.stats()["slowdown"] == 2


def test_request_log_names_method_object_and_status(
    proxy: FaultProxy, client: Any, bucket: str, blob: bytes
) -> None:
    client.put_object(Bucket=bucket, Key="dir/a b.tar", Body=b"x" * 100)
    proxy.inject("slowdown", match="a%20b", method="GET")
    with pytest.raises(botocore.exceptions.ClientError):
        client.get_object(Bucket=bucket, Key="dir/a b.tar")
    client.get_object(Bucket=bucket, Key="dir/a b.tar", Range="bytes=0-9")["Body"].read()
    client.head_object(Bucket=bucket, Key="blob")
    with pytest.raises(botocore.exceptions.ClientError):
        client.get_object(Bucket=bucket, Key="missing")
    assert proxy.requests() == [
        ("PUT", f"/{bucket}/dir/a b.tar", 200),
        ("GET", f"/{bucket}/dir/a b.tar", 503),
        ("GET", f"/{bucket}/dir/a b.tar", 206),
        ("HEAD", f"/{bucket}/blob", 200),
        ("GET", f"/{bucket}/missing", 404),
    ]


def test_inject_rejects_parameters_that_do_not_fit(proxy: FaultProxy) -> None:
    with pytest.raises(ValueError, match="not a valid Fault"):
        proxy.inject("meltdown")
    with pytest.raises(ValueError, match="count"):
        proxy.inject("reset", count=0)
    with pytest.raises(ValueError, match="seconds"):
        proxy.inject("slowdown", seconds=1.0)
    with pytest.raises(ValueError, match="body_fraction"):
        proxy.inject("latency", body_fraction=0.5)
    with pytest.raises(ValueError, match="status"):
        proxy.inject("status")
    with pytest.raises(ValueError, match="status"):
        proxy.inject("reset", status=500)
    with pytest.raises(ValueError, match="not both"):
        proxy.inject("truncate", body_fraction=0.1, after_bytes=10)
    assert proxy.pending() == 0


# --------------------------------------------------------------------------- seeded plans


def _fault_sequence(
    s3_server: LocalS3,
    bucket: str,
    plan: FaultPlan,
    seed: int,
    requests: int,
    between: Callable[[Any, FaultProxy, int], None] | None = None,
) -> list[str | None]:
    """The outcome (error code or None) of each of ``requests`` GETs of ``blob``."""
    outcomes: list[str | None] = []
    with FaultProxy(s3_server.endpoint_url, faults=plan, seed=seed) as proxy:
        client = make_client(proxy.endpoint_url)
        for i in range(requests):
            if between is not None:
                between(client, proxy, i)
            try:
                client.get_object(Bucket=bucket, Key="blob", Range="bytes=0-9")["Body"].read()
                outcomes.append(None)
            except botocore.exceptions.ClientError as exc:
                outcomes.append(error_code(exc)[0])
        stats = proxy.stats()
    assert stats["slowdown"] + stats["internal_error"] + stats["status"] == sum(
        o is not None for o in outcomes
    )
    return outcomes


def test_seeded_rates_are_deterministic(s3_server: LocalS3, bucket: str, blob: bytes) -> None:
    plan = FaultPlan(slowdown=0.1, internal_error=0.05, match="blob")
    first = _fault_sequence(s3_server, bucket, plan, seed=1, requests=200)
    assert 8 <= first.count("SlowDown") <= 35
    assert 2 <= first.count("InternalError") <= 20

    def interleave(client: Any, proxy: FaultProxy, i: int) -> None:
        # Requests the plan does not cover (other keys, HEAD) consume no draw, and an
        # injected fault replaces a request's outcome without shifting the sequence.
        if i % 10 == 0:
            client.head_object(Bucket=bucket, Key="blob")
            with contextlib.suppress(botocore.exceptions.ClientError):
                client.get_object(Bucket=bucket, Key="nothing-here")
        if i == 5:
            proxy.inject("status", status=403, match="blob")

    again = _fault_sequence(s3_server, bucket, plan, seed=1, requests=200, between=interleave)
    assert again[5] == "AccessDenied"
    assert again[:5] + again[6:] == first[:5] + first[6:]

    other = _fault_sequence(s3_server, bucket, plan, seed=2, requests=200)
    assert other != first


def test_plan_body_faults_and_match(
    s3_server: LocalS3, s3_client: Any, bucket: str, blob: bytes
) -> None:
    s3_client.put_object(Bucket=bucket, Key="other", Body=b"spared")
    plan = FaultPlan(truncate=1.0, body_fraction=0.1, match="blob")
    with FaultProxy(s3_server.endpoint_url, faults=plan) as proxy:
        client = make_client(proxy.endpoint_url)
        _, headers, body, error = raw_get(
            proxy.endpoint_url, presigned_path(client, bucket, "blob")
        )
        assert error is None
        assert int(headers["content-length"]) == len(blob)
        assert body == blob[: len(blob) // 10]
        assert client.get_object(Bucket=bucket, Key="other")["Body"].read() == b"spared"
        assert proxy.stats()["truncate"] == 1


def test_plan_draw_is_one_number_per_request() -> None:
    import random

    plan = FaultPlan(reset=0.5, latency=0.5)
    rng = random.Random(3)
    draws = [plan.draw(rng) for _ in range(100)]
    assert set(draws) == {Fault.RESET, Fault.LATENCY}
    reference = random.Random(3)
    assert [Fault.RESET if reference.random() < 0.5 else Fault.LATENCY for _ in range(100)] == draws


def test_fault_plan_validation_and_repr() -> None:
    assert repr(FaultPlan()) == "FaultPlan()"
    assert repr(FaultPlan(slowdown=0.1, match=".tar")) == "FaultPlan(slowdown=0.1, match='.tar')"
    with pytest.raises(ValueError, match="slowdown"):
        FaultPlan(slowdown=1.5)
    with pytest.raises(ValueError, match="add up"):
        FaultPlan(slowdown=0.6, reset=0.6)
    with pytest.raises(ValueError, match="stall_seconds"):
        FaultPlan(stall_seconds=-1)
    with pytest.raises(TypeError):
        FaultPlan(0.1)  # type: ignore[call-arg]
    plan = FaultPlan(stall=0.2)
    with pytest.raises(FrozenInstanceError):
        plan.stall = 0.3  # type: ignore[misc]
    assert FaultPlan(stall=0.2, truncate=0.3).total_rate == pytest.approx(0.5)


# --------------------------------------------------------------------------- shaping


def test_bandwidth_cap_paces_the_body(s3_server: LocalS3, s3_client: Any, bucket: str) -> None:
    size, rate = 4 * MiB, 8e6
    data = os.urandom(size)
    s3_client.put_object(Bucket=bucket, Key="paced", Body=data)
    profile = NetworkProfile(bandwidth_bytes_per_s=rate)
    with FaultProxy(s3_server.endpoint_url, profile=profile) as proxy:
        client = make_client(proxy.endpoint_url)
        started = time.monotonic()
        assert client.get_object(Bucket=bucket, Key="paced")["Body"].read() == data
        elapsed = time.monotonic() - started
    assert elapsed >= 0.8 * size / rate


def test_first_byte_latency(s3_server: LocalS3, bucket: str, blob: bytes) -> None:
    profile = NetworkProfile(first_byte_latency=(0.1, 0.15))
    with FaultProxy(s3_server.endpoint_url, profile=profile) as proxy:
        client = make_client(proxy.endpoint_url)
        for _ in range(3):
            started = time.monotonic()
            client.head_object(Bucket=bucket, Key="blob")
            assert time.monotonic() - started >= 0.1


def test_network_profiles() -> None:
    s3 = NetworkProfile.s3_like()
    assert s3.first_byte_latency == (0.020, 0.050)
    assert s3.bandwidth_bytes_per_s == 90e6
    assert s3.shaped
    assert NetworkProfile.loopback() == NetworkProfile()
    assert not NetworkProfile.loopback().shaped
    with pytest.raises(ValueError, match="first_byte_latency"):
        NetworkProfile(first_byte_latency=(0.5, 0.1))
    with pytest.raises(ValueError, match="bandwidth"):
        NetworkProfile(bandwidth_bytes_per_s=0)


def test_s3_like_profile_still_forwards_correctly(
    s3_server: LocalS3, bucket: str, blob: bytes
) -> None:
    with FaultProxy(s3_server.endpoint_url, profile=NetworkProfile.s3_like()) as proxy:
        client = make_client(proxy.endpoint_url)
        started = time.monotonic()
        assert client.get_object(Bucket=bucket, Key="blob")["Body"].read() == blob
        assert time.monotonic() - started >= 0.020 + len(blob) / 90e6 * 0.8


# --------------------------------------------------------------------------- lifecycle


def test_close_during_a_stall_is_prompt_and_leaves_nothing(
    s3_server: LocalS3, bucket: str, blob: bytes
) -> None:
    threads_before = set(threading.enumerate())
    count_before = threading.active_count()
    unraisable: list[Any] = []
    previous_hook = sys.unraisablehook
    sys.unraisablehook = unraisable.append
    try:
        proxy = FaultProxy(s3_server.endpoint_url).start()
        client = make_client(proxy.endpoint_url, read_timeout=60)
        proxy.inject("stall")  # one hour
        head_seen = threading.Event()
        outcome: list[BaseException | bytes] = []

        def read() -> None:
            response = client.get_object(Bucket=bucket, Key="blob")
            head_seen.set()
            try:
                outcome.append(response["Body"].read())
            except BaseException as exc:
                outcome.append(exc)

        reader = threading.Thread(target=read)
        reader.start()
        assert head_seen.wait(10)
        proxy.close()  # returns although a response is stalled for an hour
        assert not any(t.name.startswith("FaultProxy") for t in threading.enumerate())
        reader.join(10)
        assert not reader.is_alive()
        assert len(outcome) == 1
        assert isinstance(outcome[0], botocore.exceptions.ResponseStreamingError)
        client.close()
        join_new_threads(threads_before)
        gc.collect()
    finally:
        sys.unraisablehook = previous_hook
    # No thread was left behind (some of moto's per-connection threads may have ended).
    assert set(threading.enumerate()) <= threads_before
    assert threading.active_count() <= count_before
    assert unraisable == []


def test_closed_proxy_refuses_reuse(s3_server: LocalS3) -> None:
    proxy = FaultProxy(s3_server.endpoint_url)
    with pytest.raises(RuntimeError, match="not running"):
        _ = proxy.endpoint_url
    with proxy:
        assert proxy.endpoint_url.startswith("http://127.0.0.1:")
        assert proxy.start() is proxy
    proxy.close()  # twice is fine
    with pytest.raises(RuntimeError, match="closed"):
        proxy.start()
    with pytest.raises(RuntimeError, match="not running"):
        _ = proxy.endpoint_url
    with pytest.raises(RuntimeError, match="closed"):
        proxy.inject("reset")
    assert "closed" in repr(proxy)


def test_constructor_validation() -> None:
    with pytest.raises(ValueError, match="upstream"):
        FaultProxy("https://s3.amazonaws.com")
    with pytest.raises(ValueError, match="upstream"):
        FaultProxy("127.0.0.1:9000")
    with pytest.raises(TypeError, match="FaultPlan"):
        FaultProxy("http://127.0.0.1:9000", faults=0.1)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- aiobotocore


async def test_async_use_with_aiobotocore(s3_server: LocalS3, bucket: str, blob: bytes) -> None:
    async with FaultProxy(s3_server.endpoint_url) as proxy:
        config = AioConfig(
            read_timeout=0.5,
            retries={"mode": "standard", "total_max_attempts": 1},
            s3={"addressing_style": "path"},
        )
        async with get_session().create_client(
            "s3", endpoint_url=proxy.endpoint_url, region_name="us-east-1", config=config
        ) as client:
            response = await client.get_object(Bucket=bucket, Key="blob")
            async with response["Body"] as stream:
                assert await stream.read() == blob

            proxy.inject("slowdown")
            with pytest.raises(botocore.exceptions.ClientError) as info:
                await client.get_object(Bucket=bucket, Key="blob")
            assert error_code(info.value) == ("SlowDown", 503)

            for kind in ("reset", "truncate"):
                proxy.inject(kind)
                response = await client.get_object(Bucket=bucket, Key="blob")
                async with response["Body"] as stream:
                    with pytest.raises(aiohttp.ClientPayloadError):
                        await stream.read()

            proxy.inject("stall")
            response = await client.get_object(Bucket=bucket, Key="blob")
            async with response["Body"] as stream:
                with pytest.raises(botocore.exceptions.ReadTimeoutError):
                    await stream.read()

            response = await client.get_object(Bucket=bucket, Key="blob")
            async with response["Body"] as stream:
                assert await stream.read() == blob
        stats = proxy.stats()
    assert (stats["slowdown"], stats["reset"], stats["truncate"], stats["stall"]) == (1, 1, 1, 1)


def test_capacity_refuses_gets_beyond_it_with_slowdown(
    s3_server: LocalS3, bucket: str, blob: bytes
) -> None:
    with FaultProxy(s3_server.endpoint_url, capacity=1) as proxy:
        client = make_client(proxy.endpoint_url)
        proxy.inject("latency", seconds=1.0)  # the first GET stays in service for a second
        with ThreadPoolExecutor(1) as pool:
            slow = pool.submit(lambda: client.get_object(Bucket=bucket, Key="blob")["Body"].read())
            deadline = time.monotonic() + 5
            while proxy.stats()["requests"] < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            with pytest.raises(botocore.exceptions.ClientError) as refused:
                client.get_object(Bucket=bucket, Key="blob")
            assert slow.result(timeout=10) == blob
        assert error_code(refused.value) == ("SlowDown", 503)
        # Served one at a time, it serves them all.
        assert client.get_object(Bucket=bucket, Key="blob")["Body"].read() == blob
        stats = proxy.stats()
    assert stats["throttled"] == 1
    assert stats["slowdown"] == 1
    with pytest.raises(ValueError, match="capacity"):
        FaultProxy(s3_server.endpoint_url, capacity=0)


def test_s3rver_takes_a_folder_as_a_string(tmp_path: pathlib.Path) -> None:
    from asyncstream.testing import S3rver

    assert S3rver(str(tmp_path)).directory == tmp_path
