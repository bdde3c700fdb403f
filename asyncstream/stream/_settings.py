"""A stream's settings, once its dataset is open: what decides an epoch's order and how it
is fetched.

Its own module, below the stages that read it (the plan and state, the chunk reader, the
prefetch, the run), so that each of them stands on it and none on the run.
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass, field
from typing import Literal

from .._config import RING_BUDGET_BYTES, FetchConfig, OrderConfig
from ..dataset._count import CountSettings
from ..engine._configure import engine_config
from ..engine._engine import EngineConfig
from ..order._mix import SourcePlan
from ..shards._limits import ReadLimits, sample_limit
from ..shards._urls import Shard
from ..stores._s3 import S3Options
from ._dataset_id import DatasetId, dataset_id

__all__ = ["StreamSettings"]


@dataclass(frozen=True, kw_only=True)
class StreamSettings:
    """A stream's dataset and its settings: what decides an epoch's order (``order``)
    and how it is fetched (``fetch``, ``cache``), each group whole."""

    shards: tuple[Shard, ...]
    counts: tuple[int, ...]
    order: OrderConfig
    fetch: FetchConfig = field(default_factory=FetchConfig)
    s3: S3Options
    cache_dir: str | None = None  # validated, absolute (``CacheConfig.path``)
    cache_limit: int | None = None
    sources: tuple[SourcePlan, ...] = ()  # a mixed stream's sources (:mod:`._mix`)
    endpoints: tuple[tuple[str, S3Options], ...] = ()  # the sources' own options, named
    # Web origins only a remote index named (trust_index_urls): no configured credentials
    # go there, from whichever process reads (a spawned DataLoader worker too).
    withhold: frozenset[str] = frozenset()

    # The order settings, read by the plan, the shuffle and the state.
    @property
    def window(self) -> int:
        return self.order.window

    @property
    def shuffle(self) -> bool:
        return self.order.shuffle

    @property
    def seed(self) -> int:
        return self.order.seed

    @property
    def mode(self) -> Literal["samples", "shards"]:
        return self.order.mode

    @property
    def remainder(self) -> Literal["drop", "pad"]:
        return self.order.remainder

    def fingerprint(self) -> str:
        """Identifies the dataset: its shards' relative names, sizes and sample counts,
        not where they live (:mod:`._dataset_id`)."""
        return self.dataset_id.fingerprint

    @functools.cached_property
    def dataset_id(self) -> DatasetId:
        """The dataset's identity, computed once: every ``state_dict()`` names the
        dataset (a loader saves before each batch)."""
        groups = [(s.first, s.stop) for s in self.sources]
        return dataset_id(self.shards, self.counts, groups)

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
        """Chunks requested ahead at most: ``prefetch``, or (unset or ``"auto"``)
        :meth:`default_prefetch`, or the epoch's chunk count if smaller. The same number
        sizes the ring's prefetch slots: every requested chunk fits at once, so a chunk a
        lane waits for never queues behind prefetched ones."""
        chunks = sum(
            n * -(-s.size // self.chunk_bytes)
            for s, n in zip(self.shards, self._passes, strict=True)
        )
        prefetch = self.fetch.prefetch
        wanted = prefetch if isinstance(prefetch, int) else self.default_prefetch()
        return max(1, min(wanted, chunks))

    @property
    def get_bytes(self) -> int:
        """The bytes one GET reads: ``fetch.chunk_bytes``, or the block where smaller."""
        return min(self.fetch.chunk_bytes, self.chunk_bytes)

    @property
    def inflight_range(self) -> tuple[int, int]:
        """The downloads allowed at the start and at most, for this stream's GETs
        (:meth:`~asyncstream.FetchConfig.inflight_range`)."""
        return self.fetch.inflight_range(self.get_bytes)

    def default_prefetch(self) -> int:
        """``prefetch`` where it is not set: twice the blocks of the most GETs allowed
        (``inflight``; under ``"auto"`` its ceiling), cut to keep a ring of
        :data:`~asyncstream._config.RING_BUDGET_BYTES` (128 MiB) per reader where that
        leaves at least the blocks that keep the starting GETs busy (``inflight``; under
        ``"auto"`` where it starts): at most what the window's lanes and the hedge slot
        leave of the budget. Where the budget cannot be kept so (blocks of several MiB:
        set by the user, or a loaded state's), twice the most GETs' blocks, as before the
        budget; a block read by several GETs (``chunk_bytes`` below the block) counts for
        as many. Under ``"auto"`` the engine never runs more downloads than these slots.

        Twice ``inflight``, because lanes empty in random order and some prefetched blocks
        always wait for their lane (:mod:`._run`). Over the S3-like nginx link, window 64
        and 1 MiB blocks with 56 blocks ahead read 1.23x the 16 MiB default's MB/s, with
        48 ahead 1.03x, in one run (``bench/RESULTS.md``, issue 30 item 2): the budget's
        last slots count.
        """
        block, per_get = self.chunk_bytes, self.get_bytes
        start, most = self.inflight_range

        def blocks(gets: int) -> int:
            return max(1, -(-gets * per_get // block))

        room = RING_BUDGET_BYTES // block - self.lanes - self.fetch.hedge_slots
        return min(2 * blocks(most), room) if room >= blocks(start) else 2 * blocks(most)

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
        return (self.lanes + self.prefetch_slots + self.fetch.hedge_slots) * self.chunk_bytes

    @functools.cached_property
    def chunk_bytes(self) -> int:
        """The block (ring slot) used: ``order.block_bytes``, else ``fetch.chunk_bytes``,
        capped at the largest shard. Part of the order (a checkpoint's identity)."""
        block = self.order.block_bytes or self.fetch.chunk_bytes
        return max(1, min(block, max((s.size for s in self.shards), default=1)))

    @functools.cached_property
    def read_limits(self) -> ReadLimits:
        """What a shard's reader may hold (``fetch.max_sample_bytes``, by default the
        block, at least 16 MiB) and what a cut shard is (``fetch.on_truncated``)."""
        return ReadLimits(
            max_sample_bytes=sample_limit(self.fetch.max_sample_bytes, self.chunk_bytes),
            on_truncated=self.fetch.on_truncated,
        )

    @property
    def request_bytes(self) -> int | None:
        """The most bytes one GET reads of a block, where a block is larger; else None."""
        return self.fetch.chunk_bytes if self.fetch.chunk_bytes < self.chunk_bytes else None

    def engine_config(self, seed: int) -> EngineConfig:
        """The fetch engine's settings for one reader (``seed``: its backoff jitter)."""
        return engine_config(
            self.fetch,
            s3=self.s3,
            endpoints=self.endpoints,
            cache_dir=self.cache_dir,
            cache_limit=self.cache_limit,
            seed=seed,
            request_bytes=self.request_bytes,
            withhold=self.withhold,
            # auto: no more downloads than the prefetch slots could ever hold
            inflight=min(self.inflight_range[1], self.prefetch_slots)
            if self.fetch.auto_inflight
            else None,
            auto_start=self.inflight_range[0],
        )

    def counting(self) -> CountSettings:
        """How this stream's shards are read when they must be counted: as an epoch
        reads them."""
        return CountSettings(fetch=self.fetch, s3=self.s3, withhold=self.withhold)
