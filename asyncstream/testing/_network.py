"""How the network between a :class:`~asyncstream.testing.FaultProxy`'s clients and the S3
server behaves: a :class:`NetworkProfile` (first-byte latency, bandwidth) and the token
bucket that paces each connection's response bodies to it."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

from ._faults import check_seconds

__all__ = ["NetworkProfile", "Pacer"]


@dataclass(frozen=True, kw_only=True)
class NetworkProfile:
    """How the network between the proxy's clients and the S3 server should behave.

    Args:
        first_byte_latency: ``(low, high)`` seconds; every response starts a uniformly
            drawn time in this range later than the server answered.
        bandwidth_bytes_per_s: the rate each client connection's response bodies are paced
            to (a token bucket), or ``None`` for no limit. Request bodies are not paced.
    """

    first_byte_latency: tuple[float, float] = (0.0, 0.0)
    bandwidth_bytes_per_s: float | None = None

    def __post_init__(self) -> None:
        low, high = self.first_byte_latency
        check_seconds("first_byte_latency[0]", low)
        check_seconds("first_byte_latency[1]", high)
        if high < low:
            raise ValueError(f"first_byte_latency must be (low, high), got {(low, high)!r}")
        rate = self.bandwidth_bytes_per_s
        if rate is not None and not (isinstance(rate, int | float) and 0 < rate < math.inf):
            raise ValueError(f"bandwidth_bytes_per_s must be > 0 or None, got {rate!r}")

    @classmethod
    def s3_like(cls) -> NetworkProfile:
        """Roughly S3 seen from EC2 in the same region: 20-50 ms to first byte, 90 MB/s."""
        return cls(first_byte_latency=(0.020, 0.050), bandwidth_bytes_per_s=90e6)

    @classmethod
    def loopback(cls) -> NetworkProfile:
        """No shaping at all (the default)."""
        return cls()

    @property
    def shaped(self) -> bool:
        """Whether this profile changes anything."""
        return self.first_byte_latency[1] > 0 or self.bandwidth_bytes_per_s is not None


class Pacer:
    """A token bucket: ``take(n)`` sleeps until ``n`` more bytes fit the rate."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        # One slice is ~2 ms of traffic: few wake-ups, smooth enough for any test.
        self.slice = int(min(max(rate * 0.002, 16 * 1024), 1024 * 1024))
        self.capacity = float(self.slice)
        self.tokens = self.capacity
        self.stamp = asyncio.get_running_loop().time()

    async def take(self, n: int) -> None:
        now = asyncio.get_running_loop().time()
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        self.tokens -= n
        if self.tokens < 0:
            await asyncio.sleep(-self.tokens / self.rate)
