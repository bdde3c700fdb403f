"""The engine's statistics: one typed record of its counters, and the one method that
turns it into the dict :meth:`Engine.stats() <asyncstream.engine._engine.Engine.stats>`
(and so the stream's ``stats()["fetch"]``) exposes.

A new metric is one field here and, where its name or shape in the dict differs, one
line in :meth:`EngineStats.as_dict`; the scheduler bumps the field where it happens.
"""

from __future__ import annotations

import collections
import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["EngineStats"]

_LATENCY_WINDOW = 4096


def _latencies() -> collections.deque[float]:
    return collections.deque(maxlen=_LATENCY_WINDOW)


@dataclass(kw_only=True)
class EngineStats:
    """The engine's counters, updated by the scheduler as things happen.

    Args:
        limit: the concurrency limit at the start (``inflight``, or where
            ``inflight="auto"`` starts).
        clock: monotonic seconds (injectable for tests).
    """

    limit: int
    clock: Callable[[], float] = time.monotonic
    bytes: int = 0  # bytes of chunks handed over
    chunks: int = 0  # chunks handed over
    shards: int = 0  # shards whose last chunk was handed over
    retries: collections.Counter[str] = field(default_factory=collections.Counter)  # by cause
    failed_chunks: int = 0
    inflight: int = 0  # downloads running now (a coalesced group is one)
    inflight_peak: int = 0
    concurrency_limit_min: int = 0  # the lowest the adaptive limit went
    concurrency_limit_max: int = 0  # the highest it went (above the start: auto's doing)
    throttle_cuts: int = 0  # times the adaptive limit was halved
    hedged: int = 0  # hedges sent
    hedge_wins: int = 0  # hedges that finished first
    # Reads started at the store: a coalesced group is one, retries are not counted;
    # with a cache, hits are reads too (its "misses" are the ones that went out).
    requests: int = 0
    coalesced_chunks: int = 0  # chunks that rode on an earlier chunk's GET
    part_reads: int = 0  # GETs of parts of chunks larger than one GET (_parts), retries too
    first_byte: collections.deque[float] = field(default_factory=_latencies)
    total: collections.deque[float] = field(default_factory=_latencies)
    started: float = field(init=False)
    _busy: float = field(init=False, default=0.0)  # integral of downloads in flight
    _busy_since: float = field(init=False)

    def __post_init__(self) -> None:
        self.concurrency_limit_min = self.concurrency_limit_max = self.limit
        self.started = self._busy_since = self.clock()

    def add_inflight(self, n: int) -> None:
        """``n`` downloads started (or ended, when negative)."""
        now = self.clock()
        self._busy += self.inflight * (now - self._busy_since)
        self._busy_since = now
        self.inflight += n
        self.inflight_peak = max(self.inflight_peak, self.inflight)

    def handed_over(self, length: int, final: bool) -> None:
        """A chunk of ``length`` bytes was published (``final``: its shard's last)."""
        self.bytes += length
        self.chunks += 1
        self.shards += final

    def timed(self, first_byte: float, total: float) -> None:
        """One download's time to first byte and its whole time, as the consumer saw it."""
        self.first_byte.append(first_byte)
        self.total.append(total)

    def as_dict(
        self,
        *,
        concurrency_limit: int,
        store: dict[str, Any],
        endpoints: list[dict[str, Any]],
        tasks: int,
        stores: list[dict[str, Any]] | None = None,
        autotune: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The statistics as :meth:`Engine.stats` returns them.

        Args:
            concurrency_limit: the adaptive limit now.
            store: the main S3 store's own statistics (its transport, cache counters).
            endpoints: those of the other endpoints' stores, named, in the settings' order
                (left out of the dict when there are none).
            tasks: asyncio tasks alive in the engine's loop.
            stores: every store the engine opened, each its own statistics under its
                scheme and endpoint (a stream of sources in several stores has one each).
            autotune: under ``inflight="auto"``, what the tuner did (``steps`` tried,
                ``kept``, ``windows`` judged, its ``phase``, the ``ceiling``); else None.
        """
        self.add_inflight(0)
        seconds = self.clock() - self.started
        stats: dict[str, Any] = {
            "bytes": self.bytes,
            "chunks": self.chunks,
            "shards": self.shards,
            "retries": dict(self.retries),
            "retries_total": sum(self.retries.values()),
            "failed_chunks": self.failed_chunks,
            "inflight": self.inflight,
            "inflight_peak": self.inflight_peak,
            # Time-weighted mean of downloads in flight since the engine started.
            "inflight_mean": self._busy / seconds if seconds > 0 else 0.0,
            "concurrency_limit_min": self.concurrency_limit_min,
            "concurrency_limit_max": self.concurrency_limit_max,
            "concurrency_start": self.limit,
            "throttle_cuts": self.throttle_cuts,
            "hedged": self.hedged,
            "hedge_wins": self.hedge_wins,
            "requests": self.requests,
            "coalesced_chunks": self.coalesced_chunks,
            "part_reads": self.part_reads,
            "first_byte_s": _summary(self.first_byte),
            "chunk_s": _summary(self.total),
            "seconds": seconds,
            # CPU and peak RSS of the engine's process (the whole process in thread mode).
            "cpu_s": time.process_time(),
            "max_rss_bytes": _peak_rss(),
            "concurrency_limit": concurrency_limit,
            "autotune": autotune,
            **store,
            "tasks": tasks,
        }
        if endpoints:
            stats["endpoints"] = endpoints
        stats["stores"] = stores or []
        return stats


def _peak_rss() -> int:
    """Peak RSS of this process in bytes.

    ``/proc/self/status`` where there is one: Linux's ``ru_maxrss`` survives ``exec``, so
    in the engine process it would report the forked consumer's peak.
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _summary(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def q(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))]

    return {
        "mean": sum(ordered) / len(ordered),
        "p50": q(0.5),
        "p95": q(0.95),
        "p99": q(0.99),
        "max": ordered[-1],
    }
