"""Retry policy and timeouts of chunk downloads.

Which errors are retried is decided by :func:`classify`, once, at the edge: every
failure of a chunk download becomes a *cause* (a short name that also keys the retry
statistics) and a verdict, retry or not.

Retried: ``slowdown`` (503 SlowDown and other throttling), ``server_error`` (500, 502,
504, InternalError, ServiceUnavailable), ``request_timeout`` (S3's 400 RequestTimeout),
``connection`` (refused, reset, closed mid-response), ``truncated`` (fewer bytes than the
range), ``stall`` (no byte for ``Timeouts.stall`` seconds), ``first_byte`` (no response
headers within ``Timeouts.first_byte``), ``chunk_timeout`` and ``checksum`` (a length or
ETag that does not match).

Not retried, raised at once: 400 (other codes), 403 (also bad credentials), 404
(NoSuchKey, NoSuchBucket), 412 (the object changed since it was listed), and anything
that is not an I/O failure (a bug must not be retried into a hang).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import aiohttp
import botocore.exceptions

from ._exceptions import FetchError, PermanentFetchError, TransientFetchError
from ._s3 import error_code, fetch_error_from

__all__ = ["RetryPolicy", "Timeouts", "classify", "retrying"]

T = TypeVar("T")

_THROTTLE_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded"}
_SERVER_CODES = {"InternalError", "ServiceUnavailable", "BadGateway", "GatewayTimeout"}


class ChunkFailure(Exception):
    """A failure of one attempt that the fetch code itself detected (short body, stall...).

    Attributes:
        cause: the cause name, one of the retried causes in the module docstring.
    """

    def __init__(self, cause: str, message: str) -> None:
        super().__init__(message)
        self.cause = cause


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How often and how patiently to retry a chunk download.

    Exponential backoff with full jitter: the n-th retry waits a uniform random time in
    ``[0, min(max_delay, base_delay * 2**n)]``.

    Args:
        max_attempts: attempts per chunk, the first included.
        base_delay: seconds; the backoff scale.
        max_delay: seconds; the backoff cap.
        deadline: seconds for one chunk over all its attempts; no retry starts later.
    """

    max_attempts: int = 10
    base_delay: float = 0.05
    max_delay: float = 5.0
    deadline: float = 300.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.base_delay < 0 or self.max_delay < 0:
            raise ValueError("base_delay and max_delay must be >= 0")
        if self.deadline <= 0:
            raise ValueError(f"deadline must be > 0, got {self.deadline}")

    def backoff(self, retry: int, rng: random.Random) -> float:
        """Seconds to wait before retry number ``retry`` (0 for the first retry)."""
        return rng.uniform(0.0, min(self.max_delay, self.base_delay * 2.0**retry))


@dataclass(frozen=True, kw_only=True)
class Timeouts:
    """Time limits of one chunk download attempt, in seconds.

    Args:
        connect: to open a TCP (and TLS) connection.
        first_byte: from sending the request to having the response headers.
        stall: the longest gap between two received pieces of the body.
        chunk: the whole attempt, request to last byte.
    """

    connect: float = 10.0
    first_byte: float = 20.0
    stall: float = 10.0
    chunk: float = 120.0

    def __post_init__(self) -> None:
        for name in ("connect", "first_byte", "stall", "chunk"):
            if getattr(self, name) <= 0:
                raise ValueError(f"Timeouts.{name} must be > 0, got {getattr(self, name)}")


def classify(exc: BaseException, url: str) -> tuple[str, FetchError | None]:
    """Decide what a failed attempt was.

    Args:
        exc: what the attempt raised.
        url: the shard, for the error message.

    Returns:
        ``(cause, None)`` when the failure is retryable, or ``(cause, error)`` with the
        error to raise at once.
    """
    if isinstance(exc, ChunkFailure):
        return exc.cause, None
    if isinstance(exc, botocore.exceptions.ClientError):
        code, status = error_code(exc)
        if code in _THROTTLE_CODES or status == 429 or (status == 503 and code != "NotImplemented"):
            return "slowdown", None
        if code == "RequestTimeout":
            return "request_timeout", None
        if code in _SERVER_CODES or (status is not None and status >= 500):
            return "server_error", None
        if code == "PreconditionFailed" or status == 412:
            return "changed", PermanentFetchError(
                f"{url}: the object changed since it was listed (its ETag no longer matches); "
                "a shard replaced mid-epoch cannot be read consistently",
                url=url,
            )
        error = fetch_error_from(exc, url)
        if not isinstance(error, PermanentFetchError):
            error = PermanentFetchError(str(error), url=url)
        return code or str(status), error
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "truncated", None
    if isinstance(
        exc,
        aiohttp.ClientConnectionError
        | botocore.exceptions.HTTPClientError
        | botocore.exceptions.ConnectionError
        | ConnectionError
        | asyncio.IncompleteReadError,
    ):
        return "connection", None
    if isinstance(exc, botocore.exceptions.ReadTimeoutError | TimeoutError):
        return "stall", None
    if isinstance(exc, OSError):
        return "connection", None
    return type(exc).__name__, _not_io(exc, url)


def _not_io(exc: BaseException, url: str) -> FetchError:
    error = fetch_error_from(exc, url)
    if isinstance(error, TransientFetchError):
        # Not an I/O failure we know: never retry it (it may be a bug), but keep the type.
        return PermanentFetchError(f"{url}: {type(exc).__name__}: {exc}", url=url)
    return error


async def retrying(
    attempt: Callable[[], Awaitable[T]],
    *,
    url: str,
    policy: RetryPolicy,
    rng: random.Random,
    on_retry: Callable[[str], None] | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] | None = None,
) -> T:
    """Run ``attempt`` until it succeeds, a failure is permanent, or the policy runs out.

    Args:
        attempt: one try; it must restart from scratch each time it is called.
        url: the shard, for error messages.
        policy: attempts, backoff and deadline.
        rng: the jitter's random source.
        on_retry: called with the cause before each retry (statistics).
        sleep: the backoff's sleep (injectable for tests).
        clock: monotonic seconds (injectable for tests); the event loop's clock by default.

    Raises:
        PermanentFetchError: at once, for a failure that retrying cannot fix.
        TransientFetchError: when attempts or the deadline run out; chained to the last
            failure.
        asyncio.CancelledError: never swallowed.
    """
    now = clock or asyncio.get_running_loop().time
    start = now()
    causes: list[str] = []
    for tries in range(policy.max_attempts):
        try:
            return await attempt()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            cause, permanent = classify(exc, url)
            if permanent is not None:
                raise permanent from exc
            causes.append(cause)
            last = tries + 1 >= policy.max_attempts
            wait = policy.backoff(tries, rng)
            if last or now() - start + wait > policy.deadline:
                summary = ", ".join(causes)
                why = "attempts" if last else f"{policy.deadline:g} s deadline"
                raise TransientFetchError(
                    f"{url}: giving up after {len(causes)} failed attempts "
                    f"({why} used up; causes: {summary}); last error: {type(exc).__name__}: {exc}",
                    url=url,
                ) from exc
            if on_retry is not None:
                on_retry(cause)
            await sleep(wait)
    raise AssertionError("unreachable")  # pragma: no cover
