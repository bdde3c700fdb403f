"""The stream stage of the probe: a :class:`~asyncstream.ShardStream` over the URL, no
decode, for a few seconds.

Its figures: samples/s and MB/s as the training loop would take them; the time to the
first sample (open, index, engine start); the bytes a sample takes in its shard (the
shards' bytes over their samples: tar headers and padding, or compressed, as the store
sends them); and the stream's own
ceiling: samples per CPU second of this process (the reader's thread that walks the
chunks and builds the samples), what it would reach if the network never made it wait.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..stores._s3 import S3Options
from ..stream._stream import ShardStream

__all__ = ["StreamResult", "measure_stream"]

_MAX_EPOCHS = 1000  # a tiny dataset read over and over within the seconds given


@dataclass(frozen=True)
class StreamResult:
    """The figures of the stream stage (module docstring)."""

    samples: int
    payload_bytes: int
    sample_wire_bytes: float
    seconds: float
    first_sample_s: float
    cpu_s: float
    settings: dict[str, int]

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON."""
        per_s = self.samples / self.seconds if self.seconds > 0 else 0.0
        return {
            "samples": self.samples,
            "seconds": self.seconds,
            "samples_per_s": per_s,
            "mb_per_s": self.payload_bytes / self.seconds / 1e6 if self.seconds > 0 else 0.0,
            "wire_mb_per_s": self.samples * self.sample_wire_bytes / self.seconds / 1e6
            if self.seconds > 0
            else 0.0,
            "first_sample_s": self.first_sample_s,
            "sample_bytes": self.payload_bytes / self.samples if self.samples else None,
            "sample_wire_bytes": self.sample_wire_bytes,
            "cpu_us_per_sample": 1e6 * self.cpu_s / self.samples if self.samples else None,
            "ceiling_samples_per_s": self.samples / self.cpu_s if self.cpu_s > 0 else None,
            "settings": self.settings,
        }


def measure_stream(
    url: str | list[str],
    options: S3Options,
    *,
    shard_bytes: int,
    inflight: int,
    chunk_bytes: int,
    seconds: float,
) -> StreamResult:
    """Read the stream for ``seconds`` at most (after its first sample); an epoch that ends
    sooner starts over. ``shard_bytes``: the bytes of the shards ``url`` names."""
    settings = {"inflight": inflight, "chunk_bytes": chunk_bytes}
    started = time.perf_counter()
    samples = payload = 0
    first = 0.0
    with ShardStream(url, s3=options, seed=0, inflight=inflight, chunk_bytes=chunk_bytes) as stream:
        cpu0 = time.process_time()
        counted_from = started
        deadline: float | None = None
        for epoch in range(_MAX_EPOCHS):
            stream.set_epoch(epoch)
            got = 0
            for sample in stream:
                got += 1
                if deadline is None:  # the open and the engine's start are not counted
                    first = time.perf_counter() - started
                    counted_from = time.perf_counter()
                    cpu0 = time.process_time()
                    deadline = counted_from + seconds
                    continue
                samples += 1
                for key, value in sample.items():
                    if not key.startswith("__"):
                        payload += len(value)
                if time.perf_counter() >= deadline:
                    break
            if not got or (deadline is not None and time.perf_counter() >= deadline):
                break
        elapsed = time.perf_counter() - counted_from
        cpu = time.process_time() - cpu0
        total = stream.num_samples
    return StreamResult(
        samples=samples,
        payload_bytes=payload,
        sample_wire_bytes=shard_bytes / total if total else 0.0,
        seconds=elapsed,
        first_sample_s=first,
        cpu_s=cpu,
        settings=settings,
    )
