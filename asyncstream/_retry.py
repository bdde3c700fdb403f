"""Retry policy and timeouts of chunk downloads.

Which errors are retried is decided once, at the edge, by the one table of
:mod:`asyncstream._errors`: every failure of a chunk download becomes a *cause* (a short
name that also keys the retry statistics) and a verdict, retry or not (the list is in
that module's docstring).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from ._errors import ChunkFailure, verdict
from ._exceptions import FetchError, TransientFetchError

__all__ = ["ChunkFailure", "RetryPolicy", "Timeouts", "classify", "retrying"]

T = TypeVar("T")


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
    """Decide what a failed attempt was (the table is :mod:`asyncstream._errors`).

    Args:
        exc: what the attempt raised.
        url: the shard, for the error message.

    Returns:
        ``(cause, None)`` when the failure is retryable, or ``(cause, error)`` with the
        error to raise at once.
    """
    judged = verdict(exc, url)
    return judged.cause, None if judged.retry else judged.error


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
