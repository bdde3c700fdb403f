"""One epoch of one reader: plan, engine, tar index and window shuffle together.

One epoch of one reader is an :class:`_EpochRun`: the epoch plan (:mod:`._plan`) gives its
pieces, the fetch engine (:mod:`._engine`) streams their chunks into the ring, a
:class:`~._tar.ShardReader` per open shard indexes each resident chunk in place, and the
:class:`~._shuffle.WindowShuffle` decides which sample comes next. Each emitted sample is
copied out of the ring into ``bytes``, so what user code holds never changes under it; a
chunk's slot goes back to the engine as soon as its last sample is emitted.

Prefetch: up to ``prefetch`` chunks are requested ahead, those predicted to be needed
first (see :meth:`EpochRun._prefetch`: the lanes' next chunks, later chunks of their
shards, and the chunks of the pieces that will take over from the lanes that finish
first). A wrong guess only costs a wait, never the order: the shuffle takes chunks
when it needs them, whatever arrived first. The ring has ``window + prefetch`` slots
(plus the engine's hedge slot): ``window`` for the lanes' resident chunks, ``prefetch``
for chunks downloading or downloaded and waiting for their lane. ``prefetch`` defaults
to twice ``inflight``: lanes empty in random order, so some prefetched chunks always
wait READY for their lane, and with only ``inflight`` slots for them fewer than
``inflight`` downloads would run (measured under the S3-like profile: 6.4 of 8 on
average, against 7.9 of 8 with twice the slots).
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import json
import multiprocessing
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from ._engine import Engine, EngineConfig, Ready
from ._exceptions import DataError, StateError
from ._fetch import ChunkRequest
from ._plan import Piece, Topology, epoch_plan
from ._retry import RetryPolicy, Timeouts
from ._s3 import S3Options
from ._shuffle import Lane, WindowShuffle, mix_key
from ._tar import Sample, ShardReader
from ._urls import Shard

__all__ = ["STATE_VERSION", "EpochRun", "StreamSettings", "default_topology"]

STATE_VERSION = 1
Item = tuple[int, Sample]  # (in-shard sample index, sample)


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

    def fingerprint(self) -> str:
        """Identifies the dataset: URLs, sizes, ETags and sample counts."""
        digest = hashlib.sha256()
        for shard, n in zip(self.shards, self.counts, strict=True):
            digest.update(f"{shard.url}\0{shard.size}\0{shard.etag}\0{n}\n".encode())
        return digest.hexdigest()[:32]

    @property
    def ring_bytes(self) -> int:
        """Shared memory of one reader's ring: window, prefetch and hedge slots."""
        return (self.window + self.prefetch + int(self.hedge)) * self.slot_bytes

    @property
    def slot_bytes(self) -> int:
        return max(1, min(self.chunk_bytes, max((s.size for s in self.shards), default=1)))


def default_topology(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Rank and world size: as given, else torch.distributed, else RANK/WORLD_SIZE, else 0/1."""
    if rank is not None and world_size is not None:
        return rank, world_size
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return (
                dist.get_rank() if rank is None else rank,
                dist.get_world_size() if world_size is None else world_size,
            )
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    env_rank = int(os.environ.get("RANK", "0"))
    env_world = int(os.environ.get("WORLD_SIZE", "1"))
    return (env_rank if rank is None else rank, env_world if world_size is None else world_size)


def worker_topology(rank: int, world_size: int) -> Topology:
    """The topology of the calling process, DataLoader worker included."""
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    if info is None:
        return Topology(rank, world_size)
    return Topology(rank, world_size, info.id, info.num_workers)


@dataclass
class _LaneState:
    """What a lane needs beyond its items: its piece, reader and current chunk."""

    piece: Piece
    shard: Shard
    reader: ShardReader
    count: int  # samples in the whole shard
    chunk_bytes: int
    chunk: int = -1  # index of the resident chunk
    returned: int = 0  # samples the reader has returned so far (next in-shard index)
    returned_before: int = 0  # ... before the resident chunk was fed
    reader_start: int = 0  # reader.pending_offset before the resident chunk was fed
    ready: Ready | None = None

    @property
    def n_chunks(self) -> int:
        return -(-self.shard.size // self.chunk_bytes)

    @property
    def wants_more(self) -> bool:
        # A piece that runs to the shard's end reads it all, so a wrong count is caught.
        needed = self.returned < self.piece.stop or self.piece.stop == self.count
        return needed and self.chunk + 1 < self.n_chunks


class EpochRun(Iterator[dict[str, Any]]):
    """One epoch of one reader; iterate it for samples. Close it to stop the engine."""

    def __init__(
        self,
        settings: StreamSettings,
        *,
        epoch: int,
        topology: Topology,
        state: dict[str, Any] | None = None,
        engine: Engine | None = None,
    ) -> None:
        self.settings = settings
        self.epoch = epoch
        self.topology = topology
        self.pieces, self.remainder_samples = epoch_plan(
            settings.counts,
            seed=settings.seed,
            epoch=epoch,
            shuffle=settings.shuffle,
            topology=topology,
            remainder=settings.remainder,
        )
        self.shuffle: WindowShuffle[Item] = WindowShuffle(
            len(self.pieces),
            window=settings.window,
            key=mix_key(settings.seed, epoch, topology.rank, topology.worker),
            mode=settings.mode,
            shuffle=settings.shuffle,
        )
        self.emitted = 0
        self.requested: dict[tuple[int, int], int] = {}  # (piece position, chunk) -> id
        self.engine = engine  # an idle engine of the previous epoch, reused
        self.closed = False
        self.primed = False
        self._state = state
        self._engine()  # boots while the caller sets up (a DALI pipeline, say)

    # -- engine -------------------------------------------------------------------------

    def _engine(self) -> Engine:
        if self.engine is None:
            s = self.settings
            config = EngineConfig(
                inflight=s.inflight,
                retry=s.retry,
                timeouts=s.timeouts,
                check_etag=s.check_etag,
                adaptive=s.adaptive,
                hedge=s.hedge,
                s3=s.s3,
                seed=mix_key(s.seed, self.epoch, self.topology.rank, self.topology.worker),
            )
            # DataLoader workers are daemonic and may not start processes.
            mode: Literal["thread", "process"] = (
                "thread" if multiprocessing.current_process().daemon else "process"
            )
            self.engine = Engine(
                config, n_slots=s.window + s.prefetch, slot_bytes=s.slot_bytes, mode=mode
            )
        return self.engine

    def _request(self, position: int, chunk: int) -> ChunkRequest:
        shard = self.settings.shards[self.pieces[position].shard]
        size = self.settings.slot_bytes
        offset = chunk * size
        length = min(size, shard.size - offset)
        return ChunkRequest(shard.url, offset, length, shard.etag, offset + length >= shard.size)

    def _take(self, position: int, chunk: int) -> Ready:
        engine = self._engine()
        rid = self.requested.pop((position, chunk), None)
        if rid is None:
            (rid,) = engine.submit([self._request(position, chunk)])
        return engine.wait(rid)

    def _prefetch(self) -> None:
        """Request the ``prefetch`` chunks needed soonest, as far as it can be told.

        Need time is counted in samples drawn from a lane (lanes drain at about the same
        rate): a lane's next chunk is needed once its resident samples are drawn, each
        later chunk of its shard one chunk's worth of samples after that; a piece still to
        open takes the place of the lane that finishes first, and its chunks follow from
        there. Chunks beyond the next are asked for only where the piece runs to its
        shard's end (so they are surely read). Downloads start in request order; a wrong
        guess costs a wait, never the order.
        """
        budget = self.settings.prefetch
        room = budget - len(self.requested)
        if room <= 0:
            return
        streams: list[Iterator[tuple[float, int, int]]] = []
        finish: list[float] = []
        for lane in self.shuffle.lanes:
            meta: _LaneState = lane.meta["state"]
            t = float(lane.remaining)
            if meta.wants_more:
                left = meta.n_chunks - meta.chunk - 1
                last = meta.n_chunks if meta.piece.stop == meta.count else meta.chunk + 2
                per = (meta.count - meta.returned) / left
                streams.append(_chunk_needs(t, lane.piece, meta.chunk + 1, last, per))
                t += max(0, meta.piece.stop - meta.returned)
            finish.append(t)
        finish += [0.0] * max(0, self.shuffle.window - len(self.shuffle.lanes))
        heapq.heapify(finish)
        upcoming = self.shuffle.next_piece
        for position in range(upcoming, min(len(self.pieces), upcoming + budget)):
            t = heapq.heappop(finish)
            piece = self.pieces[position]
            count = self.settings.counts[piece.shard]
            n_chunks = -(-self.settings.shards[piece.shard].size // self.settings.slot_bytes)
            last = n_chunks if piece.stop == count else 1
            streams.append(_chunk_needs(t, position, 0, last, count / n_chunks))
            heapq.heappush(finish, t + piece.stop - piece.first)
        fresh: list[tuple[int, int]] = []
        for _, position, chunk in itertools.islice(heapq.merge(*streams), budget):
            if (position, chunk) not in self.requested:
                fresh.append((position, chunk))
                if len(fresh) == room:
                    break
        if fresh:
            ids = self._engine().submit([self._request(p, c) for p, c in fresh])
            self.requested.update(zip(fresh, ids, strict=True))

    # -- lanes --------------------------------------------------------------------------

    def _load(self, meta: _LaneState, position: int) -> list[Item]:
        """Make the lane's next chunk resident and index it; returns its new items."""
        if meta.ready is not None:
            self._engine().release(meta.ready.slot)
            meta.ready = None
        meta.chunk += 1
        ready = self._take(position, meta.chunk)
        meta.reader_start = meta.reader.pending_offset
        meta.returned_before = meta.returned
        samples = meta.reader.feed(
            self._engine().view(ready), ready.request.offset, final=ready.request.final
        )
        meta.ready = ready
        first = meta.returned
        meta.returned += len(samples)
        if ready.request.final and meta.returned != meta.count:
            raise DataError(
                f"{meta.shard.url}: holds {meta.returned} samples, but {meta.count} were "
                "expected (samples_per_shard or the manifest is out of date)"
            )
        piece = meta.piece
        lo, hi = max(piece.first - first, 0), min(piece.stop - first, len(samples))
        return [(first + i, samples[i]) for i in range(lo, hi)]

    def _new_lane_state(self, position: int, start: int = 0) -> _LaneState:
        piece = self.pieces[position]
        shard = self.settings.shards[piece.shard]
        reader = ShardReader(shard.url, shard.size, start)
        count = self.settings.counts[piece.shard]
        return _LaneState(piece, shard, reader, count, self.settings.slot_bytes)

    def _release_lane(self, lane: Lane[Item]) -> None:
        meta: _LaneState = lane.meta["state"]
        if meta.ready is not None and self.engine is not None:
            self.engine.release(meta.ready.slot)
            meta.ready = None

    # -- iteration ----------------------------------------------------------------------

    def __iter__(self) -> EpochRun:
        return self

    def __next__(self) -> dict[str, Any]:
        if self.closed:
            raise StopIteration
        try:
            if self._state is not None:
                self._restore(self._state)
                self._state = None
            elif not self.primed:
                self._prefetch()  # the first window's chunks, all at once
            self.primed = True
            return self._next()
        except StopIteration:
            self.closed = True  # the engine is idle again: finish() hands it back
            raise
        except BaseException:
            self.close()
            raise

    def _next(self) -> dict[str, Any]:
        shuffle = self.shuffle
        while True:
            need = shuffle.need()
            if need.kind == "draw":
                index, (_, sample) = shuffle.draw()
                self.emitted += 1
                return self._emit(sample, shuffle.lanes[index].meta["state"].shard.url)
            if need.kind == "done":
                raise StopIteration
            if need.kind == "open":
                meta = self._new_lane_state(need.piece)
                items = self._load(meta, need.piece)
                shuffle.open(items, {"state": meta})
            else:
                lane = shuffle.lanes[need.lane]
                meta = lane.meta["state"]
                if meta.wants_more:
                    shuffle.refill(need.lane, self._load(meta, lane.piece))
                else:
                    self._release_lane(shuffle.close(need.lane))
            self._prefetch()

    @staticmethod
    def _emit(sample: Sample, url: str) -> dict[str, Any]:
        out: dict[str, Any] = {"__key__": sample.key, "__url__": url}
        for ext, data in sample.fields.items():
            out[ext] = bytes(data)  # the one copy out of the ring
        return out

    # -- state --------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """The exact position, as plain JSON-able data (see ``ShardStream.state_dict``)."""
        if self._state is not None:
            return self._state
        lanes = []
        for lane in self.shuffle.lanes:
            meta: _LaneState = lane.meta["state"]
            lanes.append(
                {
                    "piece": lane.piece,
                    "chunk": meta.chunk,
                    "reader_start": meta.reader_start,
                    "returned_before": meta.returned_before,
                    "remaining": [index for index, _ in lane.items[lane.cursor :]],
                }
            )
        return {
            "draws": self.shuffle.draws,
            "next_piece": self.shuffle.next_piece,
            "emitted": self.emitted,
            "lanes": lanes,
        }

    def _restore(self, state: dict[str, Any]) -> None:
        self.shuffle.draws = state["draws"]
        self.emitted = state["emitted"]
        for entry in state["lanes"]:
            position = entry["piece"]
            meta = self._new_lane_state(position, entry["reader_start"])
            meta.returned = entry["returned_before"]
            chunk_start = entry["chunk"] * self.settings.slot_bytes
            offset = entry["reader_start"]
            while offset < chunk_start:  # the carried sample's earlier bytes
                length = min(self.settings.slot_bytes, chunk_start - offset)
                request = ChunkRequest(meta.shard.url, offset, length, meta.shard.etag, False)
                engine = self._engine()
                (rid,) = engine.submit([request])
                ready = engine.wait(rid)
                if meta.reader.feed(engine.view(ready), offset):
                    raise StateError("state_dict does not match the shard's contents")
                engine.release(ready.slot)
                offset += length
            meta.chunk = entry["chunk"] - 1
            items = dict(self._load(meta, position))
            try:
                chosen = [(i, items[i]) for i in entry["remaining"]]
            except KeyError as exc:
                raise StateError(
                    f"state_dict names sample {exc} that the resident chunk of "
                    f"{meta.shard.url} does not hold"
                ) from None
            self.shuffle.next_piece = position
            self.shuffle.open(chosen, {"state": meta})
        self.shuffle.next_piece = state["next_piece"]
        self._prefetch()

    def stats(self) -> dict[str, Any]:
        """Fetch statistics plus the shuffle's: radius, emitted, remainder."""
        out: dict[str, Any] = {
            "epoch": self.epoch,
            "samples": self.emitted,
            "shuffle_radius": self.shuffle.resident(),
            "open_shards": len(self.shuffle.lanes),
            "remainder_policy": self.settings.remainder,
            "remainder_samples": self.remainder_samples,
        }
        if self.engine is not None:
            out["fetch"] = self.engine.stats()
        return out

    def __del__(self) -> None:
        if "closed" in self.__dict__:  # not when __init__ failed
            self.close()  # last resort; ShardStream closes runs explicitly

    def finish(self) -> Engine | None:
        """End the run; return its engine if it is idle (all chunks taken, all slots free)."""
        self.closed = True
        engine, self.engine = self.engine, None
        if engine is not None and engine.idle:
            return engine
        if engine is not None:
            engine.close()
        return None

    def close(self) -> None:
        """Stop the engine and free the ring. Idempotent."""
        self.closed = True
        if self.engine is not None:
            self.engine.close()
            self.engine = None


def _chunk_needs(
    start: float, position: int, first: int, stop: int, per_chunk: float
) -> Iterator[tuple[float, int, int]]:
    """``(need time, piece position, chunk)`` for chunks ``first..stop-1`` of a piece."""
    for chunk in range(first, stop):
        yield start + (chunk - first) * per_chunk, position, chunk


def json_state(
    settings: StreamSettings, epoch: int, topology: Topology, run: dict[str, Any]
) -> dict[str, Any]:
    """The full state dict: identity of the stream plus the run's position."""
    return {
        "version": STATE_VERSION,
        "dataset": settings.fingerprint(),
        "seed": settings.seed,
        "epoch": epoch,
        "shuffle": settings.shuffle,
        "mode": settings.mode,
        "window": settings.window,
        "chunk_bytes": settings.slot_bytes,
        "remainder": settings.remainder,
        "topology": [topology.rank, topology.world_size, topology.worker, topology.num_workers],
        "position": run,
    }


def check_state(
    state: Any, settings: StreamSettings, topology_of_state: Topology | None = None
) -> None:
    """Refuse a state dict that does not belong to this stream, with the reason."""
    if not isinstance(state, dict):
        raise StateError(f"a state_dict must be a dict, got {type(state).__name__}")
    try:
        json.dumps(state)
    except (TypeError, ValueError) as exc:
        raise StateError(f"state_dict is not plain JSON data: {exc}") from exc
    expected = {
        "version": STATE_VERSION,
        "dataset": settings.fingerprint(),
        "seed": settings.seed,
        "shuffle": settings.shuffle,
        "mode": settings.mode,
        "window": settings.window,
        "chunk_bytes": settings.slot_bytes,
        "remainder": settings.remainder,
    }
    for name, value in expected.items():
        if name not in state:
            raise StateError(f"state_dict has no {name!r}: not a ShardStream state, or corrupted")
        if state[name] != value:
            what = "another dataset" if name == "dataset" else f"{name}={state[name]!r}"
            raise StateError(f"state_dict was saved from {what}, this stream has {name}={value!r}")
    _check_position(state.get("position"), settings)


def _check_position(position: Any, settings: StreamSettings) -> None:
    def bad(why: str) -> StateError:
        return StateError(f"state_dict position is corrupted: {why}")

    if not isinstance(position, dict):
        raise bad("missing")
    for name in ("draws", "next_piece", "emitted"):
        if not isinstance(position.get(name), int) or position[name] < 0:
            raise bad(f"{name} must be an integer >= 0")
    lanes = position.get("lanes")
    if not isinstance(lanes, list) or len(lanes) > settings.window:
        raise bad("lanes must be a list of at most window entries")
    for lane in lanes:
        if not isinstance(lane, dict):
            raise bad("a lane must be a dict")
        for name in ("piece", "chunk", "reader_start", "returned_before"):
            if not isinstance(lane.get(name), int) or lane[name] < 0:
                raise bad(f"lane {name} must be an integer >= 0")
        remaining = lane.get("remaining")
        if not isinstance(remaining, list) or not all(isinstance(i, int) for i in remaining):
            raise bad("lane remaining must be a list of integers")
        if lane["piece"] >= position["next_piece"]:
            raise bad("a lane's piece is not yet opened")
