"""Retry policy: classification, backoff with full jitter, attempts and deadline."""

from __future__ import annotations

import asyncio
import logging
import os
import random
from typing import Any

import aiohttp
import botocore.exceptions
import pytest

from asyncstream import (
    AccessDeniedError,
    LocalS3,
    NotFoundError,
    PermanentFetchError,
    S3Options,
    TransientFetchError,
    resolve_shards,
)
from asyncstream.engine._engine import Engine, EngineConfig
from asyncstream.stores._retry import ChunkFailure, RetryPolicy, Timeouts, classify, retrying
from asyncstream.stores._store import ChunkRequest
from asyncstream.testing import FaultProxy

URL = "s3://bucket/shard-0001.tar"


def client_error(code: str, status: int) -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError(
        {
            "Error": {"Code": code, "Message": f"{code} message"},
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        "GetObject",
    )


@pytest.mark.parametrize(
    ("exc", "cause"),
    [
        (client_error("SlowDown", 503), "slowdown"),
        (client_error("InternalError", 500), "server_error"),
        (client_error("BadGateway", 502), "server_error"),
        (client_error("GatewayTimeout", 504), "server_error"),
        (client_error("RequestTimeout", 400), "request_timeout"),
        (aiohttp.ClientPayloadError("Response payload is not completed"), "truncated"),
        (aiohttp.ServerDisconnectedError(), "connection"),
        (ConnectionResetError(104, "reset"), "connection"),
        (OSError(5, "Input/output error"), "connection"),  # EIO: a disk or NFS that may heal
        (ChunkFailure("stall", "no byte"), "stall"),
        (TimeoutError(), "stall"),
    ],
)
def test_retryable(exc: BaseException, cause: str) -> None:
    assert classify(exc, URL) == (cause, None)


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (client_error("NoSuchKey", 404), NotFoundError),
        (client_error("NoSuchBucket", 404), NotFoundError),
        (client_error("AccessDenied", 403), AccessDeniedError),
        (client_error("InvalidAccessKeyId", 403), AccessDeniedError),
        (client_error("InvalidArgument", 400), PermanentFetchError),
        (client_error("PreconditionFailed", 412), PermanentFetchError),
        (botocore.exceptions.NoCredentialsError(), AccessDeniedError),
        (ValueError("a bug, not I/O"), PermanentFetchError),
        (FileNotFoundError(2, "No such file or directory"), NotFoundError),
        (NotADirectoryError(20, "Not a directory"), NotFoundError),
        (PermissionError(13, "Permission denied"), AccessDeniedError),
    ],
)
def test_permanent(exc: BaseException, kind: type[Exception]) -> None:
    _, error = classify(exc, URL)
    assert isinstance(error, kind)
    assert URL in str(error)


def test_backoff_is_full_jitter_and_capped() -> None:
    policy = RetryPolicy(base_delay=0.1, max_delay=1.0)
    rng = random.Random(0)
    for retry in range(10):
        cap = min(1.0, 0.1 * 2**retry)
        delays = [policy.backoff(retry, rng) for _ in range(200)]
        assert all(0 <= d <= cap for d in delays)
        assert max(delays) > 0.8 * cap  # spread over the whole range, not a fixed delay
        assert min(delays) < 0.2 * cap


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def time(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_succeeds_after_transient_failures() -> None:
    clock = FakeClock()
    outcomes: list[BaseException | str] = [
        client_error("SlowDown", 503),
        ChunkFailure("stall", "x"),
        "ok",
    ]
    causes: list[str] = []

    async def attempt() -> str:
        outcome = outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    result = run(
        retrying(
            attempt,
            url=URL,
            policy=RetryPolicy(),
            rng=random.Random(1),
            on_retry=causes.append,
            sleep=clock.sleep,
            clock=clock.time,
        )
    )
    assert result == "ok"
    assert causes == ["slowdown", "stall"]
    assert len(clock.sleeps) == 2


def test_attempts_run_out() -> None:
    clock = FakeClock()
    calls = 0

    async def attempt() -> None:
        nonlocal calls
        calls += 1
        raise client_error("InternalError", 500)

    with pytest.raises(TransientFetchError, match="4 failed attempts") as info:
        run(
            retrying(
                attempt,
                url=URL,
                policy=RetryPolicy(max_attempts=4),
                rng=random.Random(1),
                sleep=clock.sleep,
                clock=clock.time,
            )
        )
    assert calls == 4
    assert URL in str(info.value)
    assert isinstance(info.value.__cause__, botocore.exceptions.ClientError)


def test_deadline_stops_retrying() -> None:
    clock = FakeClock()

    async def attempt() -> None:
        clock.now += 4.0  # each attempt takes 4 s
        raise ChunkFailure("stall", "no byte")

    with pytest.raises(TransientFetchError, match="deadline"):
        run(
            retrying(
                attempt,
                url=URL,
                policy=RetryPolicy(max_attempts=100, base_delay=0.0, deadline=10.0),
                rng=random.Random(1),
                sleep=clock.sleep,
                clock=clock.time,
            )
        )
    assert clock.now <= 12.0


def test_permanent_is_not_retried() -> None:
    calls = 0

    async def attempt() -> None:
        nonlocal calls
        calls += 1
        raise client_error("NoSuchKey", 404)

    with pytest.raises(NotFoundError):
        run(retrying(attempt, url=URL, policy=RetryPolicy(), rng=random.Random(0)))
    assert calls == 1


def test_cancellation_is_never_swallowed() -> None:
    async def main() -> None:
        async def attempt() -> None:
            await asyncio.sleep(3600)

        task = asyncio.create_task(
            retrying(attempt, url=URL, policy=RetryPolicy(), rng=random.Random(0))
        )
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(main())


@pytest.mark.parametrize("kwargs", [{"max_attempts": 0}, {"base_delay": -1}, {"deadline": 0}])
def test_policy_validation(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="must be"):
        RetryPolicy(**kwargs)


def test_timeouts_validation() -> None:
    with pytest.raises(ValueError, match=r"Timeouts\.stall"):
        Timeouts(stall=0)
    assert "stall=10.0" in repr(Timeouts())


# -- retries logged, against a real S3 server behind the fault proxy -------------------------


def _retry_records(records: list[logging.LogRecord]) -> list[logging.LogRecord]:
    return [r for r in records if r.name == "asyncstream" and "retrying in" in r.getMessage()]


def test_the_engine_process_logs_each_retry_and_warns_once_about_the_endpoint(
    proxy: FaultProxy, s3_server: LocalS3, bucket: str, s3_client: Any, caplog: Any
) -> None:
    """A 503 twice, then a server that accepts and does not answer (longer than the first
    byte timeout) three times: five retries at INFO, each with its cause and wait, and
    past ``warn_after`` one WARNING naming the endpoint, all logged in this process from
    the engine's own."""
    s3_client.put_object(Bucket=bucket, Key="shard.tar", Body=b"x" * 3000)
    url = f"s3://{bucket}/shard.tar"
    proxy.inject("status", count=2, status=503, match="shard.tar")
    proxy.inject("latency", count=3, seconds=30, match="shard.tar")
    policy = RetryPolicy(max_attempts=10, base_delay=0.01, max_delay=0.02, warn_after=0.5)
    config = EngineConfig(
        coalesce_bytes=0,
        hedge=False,
        retry=policy,
        timeouts=Timeouts(connect=5, first_byte=0.3, stall=5, chunk=20),
        s3=S3Options(endpoint_url=proxy.endpoint_url).resolve(),
    )
    caplog.set_level(logging.INFO, logger="asyncstream")
    with Engine(config, n_slots=2, slot_bytes=4096, mode="process") as engine:
        assert engine.pid is not None
        assert engine.pid != os.getpid()
        engine.submit([ChunkRequest(url, 0, 3000)])
        ready = engine.next(timeout=60)
        assert bytes(engine.view(ready)) == b"x" * 3000
        engine.stats()  # a last exchange: every record sent before it has arrived
    retries = _retry_records(caplog.records)
    assert [r.levelno for r in retries] == [logging.INFO] * 5
    causes = [r.getMessage() for r in retries]
    assert all(url in m for m in causes)
    assert "attempt 1 failed (slowdown" in causes[0]
    assert "attempt 3 failed (first_byte: no response within 0.3 s); retrying in" in causes[2]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    text = warnings[0].getMessage()
    assert f"s3://{bucket} at {proxy.endpoint_url}" in text
    assert "still retrying" in text


def test_a_listing_at_open_logs_its_retries(
    proxy: FaultProxy, bucket: str, s3_client: Any, caplog: Any
) -> None:
    s3_client.put_object(Bucket=bucket, Key="a/shard.tar", Body=b"x" * 100)
    proxy.inject("status", count=2, status=503, method="GET", match="list-type")
    caplog.set_level(logging.INFO, logger="asyncstream")
    shards = resolve_shards(f"s3://{bucket}/a/", S3Options(endpoint_url=proxy.endpoint_url))
    assert [s.url for s in shards] == [f"s3://{bucket}/a/shard.tar"]
    retries = _retry_records(caplog.records)
    assert len(retries) == 2
    assert all(r.levelno == logging.INFO for r in retries)
    assert "slowdown" in retries[0].getMessage()
