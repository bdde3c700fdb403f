"""Retry policy: classification, backoff with full jitter, attempts and deadline."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import aiohttp
import botocore.exceptions
import pytest

from asyncstream import AccessDeniedError, NotFoundError, PermanentFetchError, TransientFetchError
from asyncstream.stores._retry import ChunkFailure, RetryPolicy, Timeouts, classify, retrying

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
