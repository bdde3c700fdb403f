"""The network stages of the probe: ranged GETs through the fetch engine at K in flight.

One engine per K (its process started while the K before is measured), with hedging,
coalescing and the adaptive limit off, so that K is what the link sees. The requests are
the shards' chunks in order, round and round for the stage's seconds; the consumer takes
each in order and gives its slot back, as a stream does. The first K chunks warm the
connections and are not counted.

At K = 1 the engine's own timings give the first byte (request sent to first body byte)
and the rate of one connection (the chunk's bytes over its time less its first byte).
At each K: MB/s, and the reader's CPU (the engine process's plus this one's, over the
counted part) per GB and per GET, as ``bench``'s ``reader_cpu_us_per_get``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..engine._engine import Engine, EngineConfig
from ..engine._launch import EngineProcess, store_modules
from ..shards._urls import Shard
from ..stores._s3 import S3Options
from ..stores._store import ChunkRequest

__all__ = ["KResult", "measure_k"]


@dataclass(frozen=True)
class KResult:
    """The figures of one K (module docstring)."""

    inflight: int
    gets: int
    bytes: int
    seconds: float
    reader_cpu_s: float
    engine_cpu_s: float
    first_byte_s: dict[str, float]
    chunk_s: dict[str, float]
    retries: int

    @property
    def mb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e6 if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON."""
        gb = self.bytes / 1e9
        return {
            "inflight": self.inflight,
            "gets": self.gets,
            "bytes": self.bytes,
            "seconds": self.seconds,
            "mb_per_s": self.mb_per_s,
            "reader_cpu_s_per_gb": self.reader_cpu_s / gb if gb > 0 else None,
            "reader_cpu_us_per_get": 1e6 * self.reader_cpu_s / self.gets if self.gets else None,
            "engine_cpu_s_per_gb": self.engine_cpu_s / gb if gb > 0 else None,
            "first_byte_s": self.first_byte_s,
            "chunk_s": self.chunk_s,
            "retries": self.retries,
        }


def chunk_requests(shards: Sequence[Shard], chunk_bytes: int) -> list[ChunkRequest]:
    """Every shard cut into chunks of at most ``chunk_bytes``, in order."""
    return [
        ChunkRequest(s.url, o, min(chunk_bytes, s.size - o), s.etag, o + chunk_bytes >= s.size)
        for s in shards
        for o in range(0, s.size, chunk_bytes)
    ]


def measure_k(
    shards: Sequence[Shard],
    options: S3Options,
    *,
    ks: Sequence[int],
    chunk_bytes: int,
    seconds: float,
) -> list[KResult]:
    """MB/s, timings and the reader's CPU at each K in ``ks``, ``seconds`` each at most
    (after a warm-up of K chunks)."""
    requests = chunk_requests(shards, chunk_bytes)
    if not requests:
        raise ValueError("the shards hold no bytes to read")
    slot = max(r.length for r in requests)
    modules = store_modules(s.url for s in shards[:1])
    results: list[KResult] = []
    ahead: EngineProcess | None = EngineProcess(modules)
    try:
        for i, k in enumerate(ks):
            process, ahead = ahead, None
            config = EngineConfig(
                inflight=k, s3=options, hedge=False, adaptive=False, coalesce_bytes=0
            )
            with Engine(config, n_slots=k + 2, slot_bytes=slot, process=process) as engine:
                if i + 1 < len(ks):
                    ahead = EngineProcess(modules)  # boots while this K is measured
                results.append(_one_k(engine, k, itertools.cycle(requests), seconds))
    finally:
        if ahead is not None:
            ahead.close()
    return results


def _one_k(engine: Engine, k: int, requests: Iterator[ChunkRequest], seconds: float) -> KResult:
    window = 2 * (k + 2)  # submitted and untaken at most: the engine is never idle for want
    submitted = 0

    def top_up(taken: int) -> None:
        nonlocal submitted
        batch = [next(requests) for _ in range(taken + window - submitted)]
        engine.submit(batch)
        submitted += len(batch)

    top_up(0)
    for taken in range(k):  # warm-up: the connections open, the first responses come
        engine.release(engine.next().slot)
        top_up(taken + 1)
    before = engine.stats()
    cpu0 = time.process_time()
    started = time.perf_counter()
    deadline = started + seconds
    gets = nbytes = 0
    taken = k
    while True:
        ready = engine.next()
        engine.release(ready.slot)
        gets += 1
        nbytes += ready.nbytes
        taken += 1
        if time.perf_counter() >= deadline:
            break
        top_up(taken)
    elapsed = time.perf_counter() - started
    consumer = time.process_time() - cpu0
    after = engine.stats()
    engine_cpu = float(after["cpu_s"]) - float(before["cpu_s"])
    return KResult(
        inflight=k,
        gets=gets,
        bytes=nbytes,
        seconds=elapsed,
        reader_cpu_s=consumer + engine_cpu,
        engine_cpu_s=engine_cpu,
        first_byte_s=dict(after["first_byte_s"]),
        chunk_s=dict(after["chunk_s"]),
        retries=int(after["retries_total"]) - int(before["retries_total"]),
    )
