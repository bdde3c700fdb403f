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
from collections.abc import Sequence

from ..order._plan import Piece
from ..shards._urls import Shard
from ._lanes import LaneReader, chunk_count

__all__ = ["soonest"]


def soonest(
    lanes: Sequence[tuple[int, LaneReader]],
    upcoming: Sequence[tuple[int, Piece, Shard, int]],
    *,
    window: int,
    chunk_bytes: int,
    budget: int,
) -> list[tuple[int, int]]:
    """The ``budget`` chunks needed soonest, as ``(piece position, chunk)``, soonest first.

    Each lane or upcoming piece is a run of chunks whose need times grow by a fixed step;
    the runs are merged on one heap of their next chunks, ties broken by position and
    chunk. (A merge of one generator per run cost about 0.5 ms a call over 64 lanes, once
    a chunk: half the consumer's CPU per GET with 1 MiB chunks.)

    Args:
        lanes: the open lanes, each with its count of undrawn resident samples.
        upcoming: the pieces still to open, in plan order: ``(position, piece, shard,
            samples in the whole shard)``; only the first ``budget`` matter.
        window: the most lanes open at once.
        chunk_bytes: bytes per chunk.
        budget: how many chunks to name.
    """
    # (need time, position, chunk, run's start time, run's first chunk, step, run's stop)
    runs: list[tuple[float, int, int, float, int, float, int]] = []
    finish: list[float] = []
    for resident, lane in lanes:
        t = float(resident)
        if lane.wants_more:
            n_chunks = lane.n_chunks
            first = lane.chunk + 1
            per = (lane.count - lane.returned) / (n_chunks - first)
            last = n_chunks if lane.to_end else first + 1
            runs.append((t, lane.position, first, t, first, per, last))
            t += max(0, lane.piece.stop - lane.returned)
        finish.append(t)
    finish += [0.0] * max(0, window - len(lanes))
    heapq.heapify(finish)
    for position, piece, shard, count in upcoming[:budget]:
        t = heapq.heappop(finish)
        n_chunks = chunk_count(piece, shard, chunk_bytes)
        last = n_chunks if piece.stop == count else 1
        per = (count - piece.index0) / n_chunks
        runs.append((t, position, 0, t, 0, per, last))
        heapq.heappush(finish, t + piece.count)
    heapq.heapify(runs)
    wanted: list[tuple[int, int]] = []
    while runs and len(wanted) < budget:
        _, position, chunk, start, first, per, stop = runs[0]
        wanted.append((position, chunk))
        chunk += 1
        if chunk < stop:
            heapq.heapreplace(
                runs, (start + (chunk - first) * per, position, chunk, start, first, per, stop)
            )
        else:
            heapq.heappop(runs)
    return wanted
