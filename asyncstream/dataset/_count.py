"""Counting the samples of shards that no index covers, through the fetch engine.

A shard with no count anywhere is read once, front to back, and its samples counted by the
same tar reader the stream uses (:class:`~._tar.ShardReader`). The reading is the fetch
engine's (:mod:`._engine`), exactly as an epoch's: ``inflight`` chunked ranged GETs at
once, each checked against the listed ETag, with the stream's :class:`RetryPolicy`,
:class:`Timeouts`, adaptive concurrency and hedging; so counting survives the faults an
epoch survives, at close to raw-fetch speed. Chunks are taken in shard order (each
shard's in byte order, as the tar reader needs them) while the engine keeps downloading
ahead into a ring of ``2 x inflight`` slots.

Each shard's count is handed to ``on_shard`` as soon as the shard is read (the local
index cache keeps it there), so an interrupted count resumes where it stopped.

Under ``torch.distributed`` (initialised, world size > 1), :func:`count_shared` splits
the shards still to count between the ranks and shares the counts, so each shard is read
once in all. Every rank that constructs the dataset takes part: all of them see the same
shards without an index, so they agree on whether to.
"""

from __future__ import annotations

import itertools
import multiprocessing
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .._config import FetchConfig
from .._exceptions import AsyncStreamError, EngineError
from ..engine._configure import engine_config
from ..engine._engine import Engine
from ..shards._compressed import open_reader
from ..shards._limits import ReadLimits, sample_limit
from ..shards._tar import check_not_empty
from ..shards._urls import Shard
from ..stores._s3 import S3Options
from ..stores._store import ChunkRequest

__all__ = [
    "CountProgress",
    "CountSettings",
    "Counted",
    "count_shards",
    "count_shared",
    "distributed",
]

_PROGRESS_EVERY_S = 0.25  # engine statistics (retries) asked at most this often


@dataclass(frozen=True, kw_only=True)
class CountSettings:
    """How shards are read to be counted: with a stream's fetch settings.

    Args:
        fetch: how chunks are fetched (inflight, chunk size, retries, timeouts, ETag
            checks, adaptive concurrency, hedging, transport).
        s3: how to reach the store.
        withhold: web origins (``scheme://host:port``) sent none of the configured
            credentials (those only a remote index named, :mod:`._trust`).
    """

    fetch: FetchConfig = field(default_factory=FetchConfig)
    s3: S3Options = field(default_factory=S3Options)
    withhold: frozenset[str] = frozenset()


@dataclass(frozen=True)
class CountProgress:
    """Where a count stands: shards and bytes read so far, samples found, retries, and
    the seconds since reading began (the engine up: its start-up is not counted)."""

    shards: int
    shards_total: int
    samples: int
    bytes: int
    bytes_total: int
    retries: int
    seconds: float


@dataclass(frozen=True)
class Counted:
    """The counts, in shard order, and how the reading went."""

    counts: list[int]
    bytes: int
    seconds: float
    retries: int


OnShard = Callable[[Shard, int], None]
OnProgress = Callable[[CountProgress], None]


def _chunks(shard: Shard, slot: int) -> Iterator[ChunkRequest]:
    for offset in range(0, shard.size, slot):
        length = min(slot, shard.size - offset)
        yield ChunkRequest(
            shard.url, offset, length, shard.etag, offset + length >= shard.size, shard.size
        )


def count_shards(
    shards: Sequence[Shard],
    settings: CountSettings,
    *,
    on_shard: OnShard | None = None,
    progress: OnProgress | None = None,
) -> Counted:
    """Read each shard once and count its samples.

    Args:
        shards: the shards.
        settings: how to read them.
        on_shard: called with each shard and its count as soon as it is read.
        progress: called after every chunk with a :class:`CountProgress`.

    Returns:
        The counts, in the order of ``shards``; the bytes read, the seconds it took
        once the engine was up, and the retries it needed.

    Raises:
        FetchError: a chunk could not be fetched within the retry policy (names the shard).
        CorruptTarError: a shard is not a well-formed tar, or is empty (names the shard
            and offset).
        EngineError: the fetch engine died.
    """
    if not shards:
        return Counted([], 0, 0.0, 0)
    for shard in shards:
        check_not_empty(shard.url, shard.size)  # an empty object has no chunk to count
    slot = settings.fetch.chunk_for(max(s.size for s in shards))
    limits = ReadLimits(
        max_sample_bytes=sample_limit(settings.fetch.max_sample_bytes, slot),
        on_truncated=settings.fetch.on_truncated,
    )
    n_slots = 2 * settings.fetch.inflight_max
    config = engine_config(settings.fetch, s3=settings.s3, withhold=settings.withhold)
    # DataLoader workers are daemonic and may not start processes.
    mode: Literal["thread", "process"] = (
        "thread" if multiprocessing.current_process().daemon else "process"
    )
    requests = (request for shard in shards for request in _chunks(shard, slot))
    total = sum(s.size for s in shards)
    counts: list[int] = []
    samples = done = retries = 0
    with Engine(config, n_slots=n_slots, slot_bytes=slot, mode=mode) as engine:
        try:
            engine.stats()  # the engine is up: reading is timed from now, not its start-up
        except EngineError as exc:
            if exc.__cause__ is not None:  # it died; no cause: only slow to start
                raise
        began = asked = time.monotonic()
        submitted: deque[int] = deque()

        def top_up() -> None:
            # Submission is bounded too: a few ring's worth ahead, never the whole dataset.
            batch = list(itertools.islice(requests, 4 * n_slots - len(submitted)))
            submitted.extend(engine.submit(batch))

        for shard in shards:
            reader = open_reader(shard.url, shard.size, limits=limits)
            found = 0
            for request in _chunks(shard, slot):
                if not submitted:
                    top_up()
                ready = engine.wait(submitted.popleft())
                try:
                    found += len(
                        reader.feed(engine.view(ready), request.offset, final=request.final)
                    )
                finally:
                    engine.release(ready.slot)
                if len(submitted) < 2 * n_slots:
                    top_up()
                done += request.length
                if request.final:  # kept before it is reported: an interruption keeps it
                    counts.append(found)
                    samples, found = samples + found, 0
                    if on_shard is not None:
                        on_shard(shard, counts[-1])
                if progress is not None:
                    now = time.monotonic()
                    if now - asked >= _PROGRESS_EVERY_S or request.final:
                        retries, asked = int(engine.stats()["retries_total"]), now
                    progress(
                        CountProgress(
                            len(counts),
                            len(shards),
                            samples + found,
                            done,
                            total,
                            retries,
                            now - began,
                        )
                    )
        seconds = time.monotonic() - began
        retries = int(engine.stats()["retries_total"])
    return Counted(counts, done, seconds, retries)


def distributed() -> tuple[int, int] | None:
    """``(rank, world size)`` under an initialised ``torch.distributed`` of more than one
    process; ``None`` otherwise (torch is never imported here: if the training script did
    not import it, it cannot have initialised it)."""
    dist: Any = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    world = int(dist.get_world_size())
    return (int(dist.get_rank()), world) if world > 1 else None


def count_shared(
    shards: Sequence[Shard],
    missing: Sequence[int],
    count: Callable[[Sequence[Shard]], list[int]],
    known: Callable[[Sequence[Shard]], dict[str, int]],
) -> dict[int, int]:
    """Count shards between the ranks of ``torch.distributed``; every rank gets every count.

    Collective: every rank calls it with the same ``shards``. The ranks' ``missing``
    (positions in ``shards`` this rank has no count for) are joined, the union split
    ``[rank::world]``, each rank counts its part (taking what its cache already ``known``
    has) and the counts are gathered on every rank. A failure on one rank is raised on
    every rank, so none waits for the others forever.

    Args:
        shards: the dataset's shards, the same on every rank.
        missing: positions in ``shards`` that this rank has no count for.
        count: counts a list of shards (reads them).
        known: counts this rank's cache has for a list of shards.

    Returns:
        Position to count, for every position missing on any rank.

    Raises:
        AsyncStreamError: counting failed on another rank.
        Exception: whatever counting raised on this rank.
    """
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    # A group of its own, destroyed before returning: a gloo group that has run a
    # collective and is still alive when the interpreter exits can abort the process
    # there ("terminate called without an active exception", SIGABRT), so the exchange
    # must not leave the training script's default group in that state.
    group = dist.new_group(backend="gloo")
    try:
        wanted: list[Any] = [None] * world
        dist.all_gather_object(wanted, list(missing), group=group)
        union = sorted({int(i) for part in wanted for i in part})
        mine = union[rank::world]
        error: BaseException | None = None
        result: dict[int, int] | str
        try:
            part = [shards[i] for i in mine]
            have = known(part)
            todo = [s for s in part if s.url not in have]
            counted = dict(zip((s.url for s in todo), count(todo), strict=True))
            result = {i: have.get(shards[i].url, counted.get(shards[i].url, 0)) for i in mine}
        except Exception as exc:
            error, result = exc, f"{type(exc).__name__}: {exc}"
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, result, group=group)
    finally:
        dist.destroy_process_group(group)
    if error is not None:
        raise error
    failed = [(r, g) for r, g in enumerate(gathered) if isinstance(g, str)]
    if failed:
        other, why = failed[0]
        raise AsyncStreamError(f"counting samples failed on rank {other}: {why}")
    return {int(i): int(n) for part in gathered for i, n in part.items()}
