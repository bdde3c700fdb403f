"""Retry policy and timeouts of chunk downloads.

Which errors are retried is decided once, at the edge, by the one table of
:mod:`asyncstream.stores._errors`: every failure of a chunk download becomes a *cause* (a short
name that also keys the retry statistics) and a verdict, retry or not (the list is in
that module's docstring).

Each retry is logged (logger ``asyncstream``) at INFO with its cause and the wait before
the next attempt; once the retries of one call have lasted ``RetryPolicy.warn_after``
seconds (30 by default), a WARNING names the endpoint, once for that endpoint until a call
to it succeeds again. In the engine's process these records are sent to the consumer's
``asyncstream`` logger (:mod:`asyncstream.engine._server`).
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from .._exceptions import FetchError, TransientFetchError
from ._errors import ChunkFailure, verdict

__all__ = [
    "ChunkFailure",
    "RetryPolicy",
    "Timeouts",
    "classify",
    "endpoint_name",
    "retrying",
    "retrying_sync",
]

T = TypeVar("T")

_log = logging.getLogger("asyncstream")
_warned: set[str] = set()  # endpoints warned about, until a call to one succeeds again
_warned_lock = threading.Lock()


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How often and how patiently to retry a chunk download.

    Exponential backoff with full jitter: the n-th retry waits a uniform random time in
    ``[0, min(max_delay, base_delay * 2**n)]``; a server's ``Retry-After`` (a web server's
    429 or 503) lengthens it to the time asked, at most ``max_delay``.

    Args:
        max_attempts: attempts per chunk, the first included.
        base_delay: seconds; the backoff scale.
        max_delay: seconds; the backoff cap.
        deadline: seconds for one chunk over all its attempts; no retry starts later.
        warn_after: seconds of retries of one call after which a WARNING names the
            endpoint (once per endpoint until it answers again); each retry is logged at
            INFO.
    """

    max_attempts: int = 10
    base_delay: float = 0.05
    max_delay: float = 5.0
    deadline: float = 300.0
    warn_after: float = 30.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.base_delay < 0 or self.max_delay < 0:
            raise ValueError("base_delay and max_delay must be >= 0")
        if self.deadline <= 0:
            raise ValueError(f"deadline must be > 0, got {self.deadline}")
        if self.warn_after < 0:
            raise ValueError(f"warn_after must be >= 0, got {self.warn_after}")

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
    """Decide what a failed attempt was (the table is :mod:`asyncstream.stores._errors`).

    Args:
        exc: what the attempt raised.
        url: the shard, for the error message.

    Returns:
        ``(cause, None)`` when the failure is retryable, or ``(cause, error)`` with the
        error to raise at once.
    """
    judged = verdict(exc, url)
    return judged.cause, None if judged.retry else judged.error


class _Attempts:
    """The bookkeeping of one retried call, shared by :func:`retrying` and
    :func:`retrying_sync`: causes so far, the deadline, the next backoff."""

    def __init__(
        self,
        url: str,
        policy: RetryPolicy,
        rng: random.Random,
        now: Callable[[], float],
        endpoint: str | None = None,
    ) -> None:
        self.url, self.policy, self.rng, self.now = url, policy, rng, now
        self.endpoint = endpoint_name(url, endpoint)
        self.start = now()
        self.causes: list[str] = []

    def succeeded(self) -> None:
        """The call succeeded: after retries, its endpoint may be warned about again."""
        if self.causes and self.endpoint in _warned:
            with _warned_lock:
                _warned.discard(self.endpoint)

    def _log(self, exc: Exception, cause: str, wait: float) -> None:
        tries = len(self.causes)
        _log.info(
            "%s: attempt %d failed (%s: %s); retrying in %.2f s",
            self.url,
            tries,
            cause,
            str(exc)[:200] or type(exc).__name__,
            wait,
        )
        lasted = self.now() - self.start
        if lasted < self.policy.warn_after or self.endpoint in _warned:
            return
        with _warned_lock:
            if self.endpoint in _warned:
                return
            _warned.add(self.endpoint)
        _log.warning(
            "%s has failed for %.1f s (%d attempts on %s, causes: %s); still retrying, "
            "giving up %g s after the first attempt: check that the endpoint is up and "
            "reachable",
            self.endpoint,
            lasted,
            tries,
            self.url,
            ", ".join(sorted(set(self.causes))),
            self.policy.deadline,
        )

    def failed(self, exc: Exception) -> tuple[str, float]:
        """The cause of a failed attempt and the wait before the next one.

        Raises:
            PermanentFetchError: the failure cannot heal.
            TransientFetchError: attempts or the deadline are used up.
        """
        cause, permanent = classify(exc, self.url)
        if permanent is not None:
            raise permanent from exc
        self.causes.append(cause)
        tries = len(self.causes)
        last = tries >= self.policy.max_attempts
        wait = self.policy.backoff(tries - 1, self.rng)
        asked = getattr(exc, "retry_after", None)  # a server's Retry-After (HTTPErrorResponse)
        if isinstance(asked, int | float) and asked > 0:
            wait = max(wait, min(float(asked), self.policy.max_delay))
        if last or self.now() - self.start + wait > self.policy.deadline:
            why = "attempts" if last else f"{self.policy.deadline:g} s deadline"
            raise TransientFetchError(
                f"{self.url}: giving up after {tries} failed attempts ({why} used up; "
                f"causes: {', '.join(self.causes)}); last error: {type(exc).__name__}: {exc}",
                url=self.url,
            ) from exc
        self._log(exc, cause, wait)
        return cause, wait


async def retrying(
    attempt: Callable[[], Awaitable[T]],
    *,
    url: str,
    policy: RetryPolicy,
    rng: random.Random,
    on_retry: Callable[[str], None] | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] | None = None,
    endpoint: str | None = None,
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
        endpoint: the server the URL's store talks to (an S3 ``endpoint_url``), named in
            the retries' WARNING beside the URL's bucket or host.

    Raises:
        PermanentFetchError: at once, for a failure that retrying cannot fix.
        TransientFetchError: when attempts or the deadline run out; chained to the last
            failure.
        asyncio.CancelledError: never swallowed.
    """
    attempts = _Attempts(url, policy, rng, clock or asyncio.get_running_loop().time, endpoint)
    while True:
        try:
            result = await attempt()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            cause, wait = attempts.failed(exc)
            if on_retry is not None:
                on_retry(cause)
            await sleep(wait)
        else:
            attempts.succeeded()
            return result


def retrying_sync(
    attempt: Callable[[], T],
    *,
    url: str,
    policy: RetryPolicy,
    rng: random.Random | None = None,
    on_failure: Callable[[Exception], None] | None = None,
    until: float | None = None,
    endpoint: str | None = None,
) -> T:
    """:func:`retrying` for blocking calls (listing, HEAD, small objects at open).

    Args:
        on_failure: called with each failure before it is judged; it may raise instead
            (a check that turns the failure into a permanent one).
        until: a :func:`time.monotonic` time no wait before a retry passes (the deadline
            of a request at open: :mod:`._deadline`, whose attempt then raises).
        endpoint: as :func:`retrying`'s.
    """
    attempts = _Attempts(url, policy, rng or random.Random(), time.monotonic, endpoint)
    while True:
        try:
            result = attempt()
        except Exception as exc:
            if on_failure is not None:
                on_failure(exc)
            _, wait = attempts.failed(exc)
            if until is not None:
                wait = min(wait, max(0.0, until - time.monotonic()))
            time.sleep(wait)
        else:
            attempts.succeeded()
            return result


def endpoint_name(url: str, endpoint: str | None = None) -> str:
    """What a retry WARNING names: the URL's scheme and bucket or host, and ``endpoint``
    (the server) where given: ``s3://bucket at http://10.0.0.5:9000``."""
    scheme, sep, rest = url.partition("://")
    where = f"{scheme}://{rest.split('/', 1)[0]}" if sep else url.split("?", 1)[0][:200]
    return f"{where} at {endpoint}" if endpoint else where
