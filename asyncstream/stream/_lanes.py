"""The chunk reader: each open piece read chunk by chunk from the ring, and indexed.

One stage of an epoch (:mod:`._run`): it turns the pieces of the plan into the samples of
one resident chunk at a time. A :class:`LaneReader` follows one piece: its shard's
:class:`~._tar.ShardReader` and the chunk resident in the ring. :class:`ChunkReader`
requests chunks from the fetch engine (ahead of need, as the prefetch stage asks, or when
a lane needs one), takes them when the shuffle needs them, indexes them in place and
hands each slot back as soon as its lane moves on.

Chunks of a piece: a piece starts reading at byte ``offset`` (0 for a fresh plan), so
its first chunk runs from there to the next multiple of ``chunk_bytes`` and every later
chunk is aligned: ``[(k + j) * slot, (k + j + 1) * slot)`` for ``k = offset // slot``.
Aligned chunks are what every reader of the shard asks for, so the numbering of a piece
that starts at 0 is the shard's own. A compressed shard's pieces all start at stored byte
0 (:mod:`._compressed`: its reader decompresses from the start and drops the tar bytes
before the piece's offset), so their chunks are always the shard's own.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from .._exceptions import DataError, StateError
from ..engine._engine import Engine, Ready
from ..order._plan import Piece
from ..shards._compressed import CompressedReader, fetch_start, open_reader
from ..shards._tar import Records, ShardReader
from ..shards._urls import Shard
from ..stores._store import ChunkRequest

if TYPE_CHECKING:
    from ._settings import StreamSettings

__all__ = [
    "Ahead",
    "ChunkReader",
    "Item",
    "LaneReader",
    "Places",
    "chunk_count",
    "fetch_offset",
    "lane_ahead",
    "lane_places",
    "piece_ahead",
]

Item = int  # a sample by its index in the shard: its record is records[index - first]
_EMPTY = memoryview(b"")


def fetch_offset(piece: Piece, shard: Shard) -> int:
    """The stored byte a piece's first chunk starts at: its header offset, or 0 for a
    compressed shard, which is always read from its start (:mod:`._compressed`)."""
    return fetch_start(shard.url, piece.offset)


def chunk_count(piece: Piece, shard: Shard, chunk_bytes: int) -> int:
    """Chunks a piece reads when it runs to its shard's end."""
    return max(1, math.ceil(shard.size / chunk_bytes) - fetch_offset(piece, shard) // chunk_bytes)


class Ahead(NamedTuple):
    """What the ranking needs of an open lane or a piece still to open, fixed from one of
    its chunks to the next: worked out once a chunk, where ranking 64 lanes worked it out
    for each lane at each ranking (a ranking cost 84 µs, 1.7 µs a sample, with 1 MiB
    blocks over 64 lanes; 45 µs and 0.9 µs with these, in Python, and 10 µs in C:
    ``python -m bench.samplecost --many --defaults --paths take --steps``). See
    :mod:`._prefetch`.

    Attributes:
        position: the piece's position.
        first: its next chunk to ask for (0 for a piece still to open).
        per: samples per chunk from there on.
        stop: the chunk after the last one to ask for.
        tail: the samples its piece has still to give after its resident ones (an open
            lane), or all of them (a piece still to open): when it frees its lane.
    """

    position: int
    first: int
    per: float
    stop: int
    tail: int


def lane_ahead(lane: LaneReader) -> Ahead | None:
    """An open lane's :class:`Ahead`, or ``None`` where it wants no more chunks."""
    if not lane.wants_more:
        return None
    n_chunks = lane.n_chunks
    first = lane.chunk + 1
    per = (lane.count - lane.returned) / (n_chunks - first)
    stop = n_chunks if lane.to_end else first + 1
    return Ahead(lane.position, first, per, stop, max(0, lane.piece.stop - lane.returned))


def piece_ahead(position: int, piece: Piece, shard: Shard, count: int, chunk_bytes: int) -> Ahead:
    """A piece's :class:`Ahead` before it opens (``count``: samples in its shard)."""
    n_chunks = chunk_count(piece, shard, chunk_bytes)
    stop = n_chunks if piece.stop == count else 1
    return Ahead(position, 0, (count - piece.index0) / n_chunks, stop, piece.count)


@dataclass
class LaneReader:
    """One piece being read: its shard's reader and its resident chunk."""

    position: int  # the piece's position in the reader's pieces
    piece: Piece
    shard: Shard
    reader: ShardReader | CompressedReader
    count: int  # samples in the whole shard
    chunk_bytes: int
    chunk: int = -1  # the resident chunk, numbered from the piece's first
    returned: int = 0  # in-shard index of the next sample the reader returns
    returned_before: int = 0  # ... before the resident chunk was fed
    reader_start: int = 0  # reader.pending_offset before the resident chunk was fed
    ready: Ready | None = None
    view: memoryview = _EMPTY  # the resident chunk, which the records' fields lie in
    records: Records = field(default_factory=list)  # what the resident chunk completed
    first: int = 0  # in-shard index of records[0]
    ahead: Ahead | None = None  # lane_ahead(self) as of the resident chunk

    @functools.cached_property
    def n_chunks(self) -> int:
        """Chunks the piece reads when it runs to its shard's end (its piece, shard and
        chunk size never change)."""
        return chunk_count(self.piece, self.shard, self.chunk_bytes)

    @property
    def to_end(self) -> bool:
        """Whether the piece runs to its shard's end (then a wrong count is caught)."""
        return self.piece.stop == self.count

    @property
    def wants_more(self) -> bool:
        needed = self.returned < self.piece.stop or self.to_end
        return needed and self.chunk + 1 < self.n_chunks

    def chunk_range(self, chunk: int) -> tuple[int, int]:
        """``(offset, length)`` of the piece's chunk number ``chunk``."""
        first = fetch_offset(self.piece, self.shard)
        slot, base = self.chunk_bytes, first // self.chunk_bytes
        start = first if chunk == 0 else (base + chunk) * slot
        end = min((base + chunk + 1) * slot, self.shard.size)
        return start, end - start

    def state(self) -> dict[str, int]:
        """The lane's state as plain data: its piece (by position), resident chunk and
        where its shard's reader stands (the undrawn samples are the shuffle's)."""
        return {
            "piece": self.position,
            "chunk": self.chunk,
            "reader_start": self.reader_start,
            "returned_before": self.returned_before,
            "returned": self.returned,
        }


class ChunkReader:
    """Reads the pieces of one reader's epoch through a fetch engine.

    Args:
        settings: the stream's settings (shards, counts, slot size).
        pieces: the reader's pieces, in order.
        engine: returns the run's engine, starting it on first use.
    """

    def __init__(
        self, settings: StreamSettings, pieces: list[Piece], engine: Callable[[], Engine]
    ) -> None:
        self.settings = settings
        self.pieces = pieces
        self.engine = engine
        self.requested: dict[tuple[int, int], int] = {}  # (piece position, chunk) -> id
        self.open: dict[int, LaneReader] = {}  # the open lanes by piece position, as opened
        self.general_members = 0  # tar members the general parser read (stats())
        self._ahead: dict[int, Ahead] = {}  # piece_ahead by position, for the prefetch

    def lane(self, position: int) -> LaneReader:
        """A new lane for the piece at ``position``, before its first chunk."""
        piece = self.pieces[position]
        shard = self.settings.shards[piece.shard]
        lane = self.open[position] = LaneReader(
            position,
            piece,
            shard,
            open_reader(shard.url, shard.size, piece.offset, self.settings.read_limits),
            self.settings.counts[piece.shard],
            self.settings.chunk_bytes,
            returned=piece.index0,
            returned_before=piece.index0,
            reader_start=piece.offset,
        )
        return lane

    def piece_ahead(self, position: int) -> Ahead:
        """The :class:`Ahead` of the piece at ``position`` before it opens (worked out
        once: the prefetch ranks the next pieces every few chunks)."""
        ahead = self._ahead.get(position)
        if ahead is None:
            piece = self.pieces[position]
            s = self.settings
            ahead = self._ahead[position] = piece_ahead(
                position, piece, s.shards[piece.shard], s.counts[piece.shard], s.chunk_bytes
            )
        return ahead

    def chunk_request(self, position: int, chunk: int) -> ChunkRequest:
        """The ranged GET of chunk ``chunk`` of the piece at ``position``."""
        piece = self.pieces[position]
        shard = self.settings.shards[piece.shard]
        first = fetch_offset(piece, shard)
        slot, base = self.settings.chunk_bytes, first // self.settings.chunk_bytes
        start = first if chunk == 0 else (base + chunk) * slot
        end = min((base + chunk + 1) * slot, shard.size)
        return ChunkRequest(
            shard.url,
            start,
            end - start,
            shard.etag,
            end >= shard.size,
            shard.size,
            self.settings.store_of(piece.shard),
        )

    def request(self, wanted: list[tuple[int, int]]) -> None:
        """Ask the engine for these chunks now, in this order (prefetch)."""
        fresh = [key for key in wanted if key not in self.requested]
        if fresh:
            ids = self.engine().submit([self.chunk_request(*key) for key in fresh])
            self.requested.update(zip(fresh, ids, strict=True))

    def _take(self, position: int, chunk: int) -> Ready:
        engine = self.engine()
        rid = self.requested.pop((position, chunk), None)
        if rid is None:
            (rid,) = engine.submit([self.chunk_request(position, chunk)])
        return engine.wait(rid)

    def load(self, lane: LaneReader) -> list[Item]:
        """Make the lane's next chunk resident and index it; returns the samples of its
        piece that the chunk completed."""
        engine = self.engine()
        self.release(lane)
        lane.chunk += 1
        ready = self._take(lane.position, lane.chunk)
        lane.reader_start = lane.reader.pending_offset
        lane.returned_before = lane.returned
        view = engine.view(ready)
        general = lane.reader.general_members
        samples = lane.reader.records(view, ready.request.offset, final=ready.request.final)
        self.general_members += lane.reader.general_members - general
        first = lane.returned
        lane.ready, lane.view, lane.records, lane.first = ready, view, samples, first
        lane.returned += len(samples)
        if ready.request.final and lane.returned != lane.count:
            raise DataError(
                f"{lane.shard.url}: holds {lane.returned} samples, but {lane.count} were "
                "expected (samples_per_shard or the index is out of date)"
            )
        lane.ahead = lane_ahead(lane)
        piece = lane.piece
        if not piece.take:
            lo, hi = max(piece.first, first), min(piece.stop, first + len(samples))
            return list(range(lo, hi))
        return [i for i in range(first, first + len(samples)) if piece.wants(i)]

    def restore(self, saved: Mapping[str, Any]) -> set[int]:
        """Reopen a saved lane exactly: its reader where it was, its chunk resident.

        Returns the in-shard indices of the samples of its resident chunk.
        """
        if saved["piece"] >= len(self.pieces):
            raise StateError("state_dict names a piece this reader does not have")
        lane = self.lane(saved["piece"])
        lane.reader = open_reader(
            lane.shard.url, lane.shard.size, saved["reader_start"], self.settings.read_limits
        )
        lane.returned = saved["returned_before"]
        chunk_start, _ = lane.chunk_range(saved["chunk"])
        offset = fetch_start(lane.shard.url, saved["reader_start"])
        engine = self.engine()
        while offset < chunk_start:  # the carried sample's earlier bytes (compressed: all)
            length = min(self.settings.chunk_bytes, chunk_start - offset)
            (rid,) = engine.submit(
                [
                    ChunkRequest(
                        lane.shard.url,
                        offset,
                        length,
                        lane.shard.etag,
                        False,
                        lane.shard.size,
                        self.settings.store_of(lane.piece.shard),
                    )
                ]
            )
            ready = engine.wait(rid)
            try:
                if lane.reader.records(engine.view(ready), offset):
                    raise StateError("state_dict does not match the shard's contents")
            finally:
                engine.release(ready.slot)
            offset += length
        lane.chunk = saved["chunk"] - 1
        items = set(self.load(lane))
        returned = saved.get("returned")
        if returned is not None and lane.returned != returned:
            raise StateError(
                f"state_dict does not match {lane.shard.url}: its chunk {saved['chunk']} "
                f"ends at sample {lane.returned}, the state says {returned}"
            )
        return items

    def state(self) -> dict[str, Any]:
        """The chunk reader's state as plain data: each open lane's (:meth:`LaneReader.
        state`), in the order the lanes were opened."""
        return {"lanes": [lane.state() for lane in self.open.values()]}

    def reset(self, state: Mapping[str, Any] | None = None) -> dict[int, set[int]]:
        """Close every open lane, then reopen a saved state's lanes exactly (``None``:
        none, a fresh start), each with its chunk resident.

        Returns each reopened lane's resident samples (in-shard indices), by piece.

        Raises:
            StateError: a lane that names no piece of this reader, or that does not
                match its shard's contents.
        """
        for lane in list(self.open.values()):
            self.close(lane)
        held: dict[int, set[int]] = {}
        for saved in state["lanes"] if state is not None else ():
            held[saved["piece"]] = self.restore(saved)
        return held

    def close(self, lane: LaneReader) -> None:
        """A lane is done: hand its chunk back and forget it."""
        self.release(lane)
        self.open.pop(lane.position, None)

    def release(self, lane: LaneReader) -> None:
        """Hand the lane's resident chunk back to the engine; the engine is told with the
        next request (:meth:`request`) or wait, or by :meth:`flush`."""
        if lane.ready is not None:
            lane.view, lane.records = _EMPTY, []
            self.engine().release(lane.ready.slot, tell=False)
            lane.ready = None

    def flush(self) -> None:
        """Tell the engine of the chunks :meth:`release` handed back."""
        self.engine().flush()


Place = tuple[Records, memoryview, str, int]


def place(reader: LaneReader) -> Place:
    """Where a lane's resident samples are: ``(records, view, url, first)``."""
    return reader.records, reader.view, reader.shard.url, reader.first


def lane_places(lanes: Sequence[Any]) -> list[Place]:
    """Each window lane's ``(records, view, url, first)``: where a run of draws finds its
    samples, as ``_tarwalk.deliver`` and ``_tarwalk.dicts`` (and ``take``'s Python loop)
    read them. ``lanes`` are the shuffle's, each holding its :class:`LaneReader` as
    ``meta["reader"]``."""
    return [place(lane.meta["reader"]) for lane in lanes]


class Places:
    """:func:`lane_places` of a window shuffle's lanes, kept as the epoch opens, refills
    and closes them, one lane at a time: a run of draws looks it up, and with 1 MiB
    blocks over 64 lanes a run is a few samples long (a lane empties every block's
    worth of samples), where building it anew cost 13.6 µs a run, 1.5 µs a sample
    (``python -m bench.samplecost --many --defaults --paths take --steps``).

    Each change is told after the shuffle made it; a change not told (a reset) makes
    the shuffle's :attr:`~asyncstream.order._shuffle.WindowShuffle.changes` run ahead,
    and the list is built anew at the next look.
    """

    def __init__(self) -> None:
        self._places: list[Place] = []
        self._at = -1  # the shuffle's changes the list is current with

    def of(self, shuffle: Any) -> list[Place]:
        """The places of ``shuffle``'s lanes, in lane order."""
        if self._at != shuffle.changes:
            self._places = lane_places(shuffle.lanes)
            self._at = shuffle.changes
        return self._places

    def _told(self, shuffle: Any) -> bool:
        """Whether the list was current before the change the shuffle just made."""
        if self._at == shuffle.changes - 1:
            self._at += 1
            return True
        return False

    def opened(self, shuffle: Any, reader: LaneReader) -> None:
        """The shuffle opened a lane, last, for ``reader``."""
        if self._told(shuffle):
            self._places.append(place(reader))

    def refilled(self, shuffle: Any, index: int, reader: LaneReader) -> None:
        """The shuffle's lane ``index`` took ``reader``'s next chunk."""
        if self._told(shuffle):
            self._places[index] = place(reader)

    def closed(self, shuffle: Any, index: int) -> None:
        """The shuffle closed its lane ``index``."""
        if self._told(shuffle):
            del self._places[index]
