"""A stream's settings, once its dataset is open: what decides an epoch's order and how it
is fetched.

Its own module, below the stages that read it (the plan and state, the chunk reader, the
prefetch, the run), so that each of them stands on it and none on the run.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
from dataclasses import dataclass, field, fields
from typing import Literal

from ..dataset._count import CountSettings
from ..order._mix import SourcePlan
from ..shards._urls import Shard
from ..stores._retry import RetryPolicy, Timeouts
from ..stores._s3 import S3Options

__all__ = ["StreamSettings"]


@dataclass(frozen=True, kw_only=True)
class StreamSettings:
    """Everything that decides an epoch's order and how it is fetched."""

    shards: tuple[Shard, ...]
    counts: tuple[int, ...]
    window: int
    inflight: int
    prefetch: int
    chunk_bytes: int
    shuffle: bool
    seed: int
    mode: Literal["samples", "shards"]
    remainder: Literal["drop", "pad"]
    s3: S3Options
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    timeouts: Timeouts = field(default_factory=Timeouts)
    check_etag: bool = True
    adaptive: bool = True
    hedge: bool = True
    cache_dir: str | None = None
    cache_limit: int | None = None
    coalesce_bytes: int = 8 << 20
    sources: tuple[SourcePlan, ...] = ()  # a mixed stream's sources (:mod:`._mix`)
    endpoints: tuple[tuple[str, S3Options], ...] = ()  # the sources' own options, named

    def fingerprint(self) -> str:
        """Identifies the dataset: URLs, sizes, ETags and sample counts."""
        digest = hashlib.sha256()
        for shard, n in zip(self.shards, self.counts, strict=True):
            digest.update(f"{shard.url}\0{shard.size}\0{shard.etag}\0{n}\n".encode())
        return digest.hexdigest()[:32]

    @functools.cached_property
    def epoch_samples(self) -> int:
        """Samples in an epoch, all ranks together: the dataset's, or the sum of a mixed
        stream's quotas."""
        if self.sources:
            return sum(s.quota for s in self.sources)
        return sum(self.counts)

    @functools.cached_property
    def _passes(self) -> tuple[int, ...]:
        """How many times an epoch may read each shard, at most (a source's quota can
        take its shards more than once, and cut one at each end)."""
        if not self.sources:
            return (1,) * len(self.shards)
        out = [0] * len(self.shards)
        for s in self.sources:
            size = sum(self.counts[s.first : s.stop])
            passes = -(-s.quota // size) + 1 if s.quota and size else 0
            out[s.first : s.stop] = [passes] * (s.stop - s.first)
        return tuple(out)

    @property
    def lanes(self) -> int:
        """The most shards a reader keeps open: ``window``, or fewer where the epoch has
        fewer pieces (a reader's pieces are its shards plus at most two partial ones, so
        for the epoch's own plan this changes nothing but the ring's size)."""
        return max(1, min(self.window, sum(self._passes) + 2))

    @functools.cached_property
    def prefetch_slots(self) -> int:
        """Chunks requested ahead at most: ``prefetch``, or the epoch's chunk count if
        smaller. The same number sizes the ring's prefetch slots: every requested chunk
        fits at once, so a chunk a lane waits for never queues behind prefetched ones."""
        chunks = sum(
            n * -(-s.size // self.slot_bytes)
            for s, n in zip(self.shards, self._passes, strict=True)
        )
        return max(1, min(self.prefetch, chunks))

    @functools.cached_property
    def _source_starts(self) -> list[int]:
        return [s.first for s in self.sources]

    def source_of(self, shard: int) -> int:
        """The number of the source that shard ``shard`` belongs to (0 unmixed)."""
        if not self.sources:
            return 0
        return bisect.bisect_right(self._source_starts, shard) - 1

    def store_of(self, shard: int) -> str:
        """The endpoint of shard ``shard``'s store (see ``ChunkRequest.endpoint``)."""
        return self.sources[self.source_of(shard)].endpoint if self.sources else ""

    @property
    def ring_bytes(self) -> int:
        """Shared memory of one reader's ring: lane, prefetch and hedge slots."""
        return (self.lanes + self.prefetch_slots + int(self.hedge)) * self.slot_bytes

    @property
    def slot_bytes(self) -> int:
        return max(1, min(self.chunk_bytes, max((s.size for s in self.shards), default=1)))

    def counting(self) -> CountSettings:
        """How this stream's shards are read when they must be counted: as an epoch reads
        them (the engine settings that :class:`~._count.CountSettings` names)."""
        return CountSettings(**{f.name: getattr(self, f.name) for f in fields(CountSettings)})
