"""Prefetch: which chunks an epoch will need soonest, as far as it can be told.

A pure function of the window's state, one stage of an epoch (:mod:`._run`). Need time is
counted in samples drawn from a lane (lanes drain at about the same rate): a lane's next
chunk is needed once its resident samples are drawn, each later chunk of its piece one
chunk's worth of samples after that; a piece still to open takes the place of the lane
that finishes first, and its chunks follow from there. Chunks beyond a lane's next are
asked for only where the piece runs to its shard's end (so they are surely read).
Downloads start in the order returned; a wrong guess costs a wait, never the order, since
the shuffle takes chunks when it needs them.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Sequence

from ..order._plan import Piece
from ..shards._urls import Shard
from ._lanes import LaneReader, chunk_count

__all__ = ["soonest"]


def _chunk_needs(
    start: float, position: int, first: int, stop: int, per_chunk: float
) -> Iterator[tuple[float, int, int]]:
    """``(need time, piece position, chunk)`` for chunks ``first..stop-1`` of a piece."""
    for chunk in range(first, stop):
        yield start + (chunk - first) * per_chunk, position, chunk


def soonest(
    lanes: Sequence[tuple[int, LaneReader]],
    upcoming: Sequence[tuple[int, Piece, Shard, int]],
    *,
    window: int,
    chunk_bytes: int,
    budget: int,
) -> list[tuple[int, int]]:
    """The ``budget`` chunks needed soonest, as ``(piece position, chunk)``, soonest first.

    Args:
        lanes: the open lanes, each with its count of undrawn resident samples.
        upcoming: the pieces still to open, in plan order: ``(position, piece, shard,
            samples in the whole shard)``; only the first ``budget`` matter.
        window: the most lanes open at once.
        chunk_bytes: bytes per chunk.
        budget: how many chunks to name.
    """
    streams: list[Iterator[tuple[float, int, int]]] = []
    finish: list[float] = []
    for resident, lane in lanes:
        t = float(resident)
        if lane.wants_more:
            left = lane.n_chunks - lane.chunk - 1
            last = lane.n_chunks if lane.to_end else lane.chunk + 2
            per = (lane.count - lane.returned) / left
            streams.append(_chunk_needs(t, lane.position, lane.chunk + 1, last, per))
            t += max(0, lane.piece.stop - lane.returned)
        finish.append(t)
    finish += [0.0] * max(0, window - len(lanes))
    heapq.heapify(finish)
    for position, piece, shard, count in upcoming[:budget]:
        t = heapq.heappop(finish)
        n_chunks = chunk_count(piece, shard, chunk_bytes)
        last = n_chunks if piece.stop == count else 1
        per = (count - piece.index0) / n_chunks
        streams.append(_chunk_needs(t, position, 0, last, per))
        heapq.heappush(finish, t + piece.count)
    return [(p, c) for _, p, c in itertools.islice(heapq.merge(*streams), budget)]
