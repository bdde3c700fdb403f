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

from ._lanes import Ahead
from ._native import NEXTC

__all__ = ["soonest"]


def soonest(
    lanes: Sequence[tuple[int, Ahead | None]],
    upcoming: Sequence[Ahead],
    *,
    window: int,
    budget: int,
) -> list[tuple[int, int]]:
    """The ``budget`` chunks needed soonest, as ``(piece position, chunk)``, soonest first:
    natively (``_soonest.c``: 45 µs a ranking over 64 lanes in Python, ``python -m
    bench.samplecost --many --defaults --paths take --steps``), else by :func:`_soonest`.

    Args:
        lanes: the open lanes, each with its count of undrawn resident samples and its
            :attr:`~._lanes.LaneReader.ahead`.
        upcoming: the pieces still to open, in plan order (:func:`~._lanes.piece_ahead`); only the
            first ``budget`` matter.
        window: the most lanes open at once.
        budget: how many chunks to name.
    """
    if NEXTC is not None:
        try:
            ranked: list[tuple[int, int]] = NEXTC.soonest(lanes, upcoming, window, budget)
            return ranked
        except OverflowError:  # a number beyond 64 bits: Python's ints have no bound
            pass
    return _soonest(lanes, upcoming, window=window, budget=budget)


def _soonest(
    lanes: Sequence[tuple[int, Ahead | None]],
    upcoming: Sequence[Ahead],
    *,
    window: int,
    budget: int,
) -> list[tuple[int, int]]:
    """:func:`soonest` in Python, with its arguments: the reference the native ranking is
    tested against.

    Each lane or upcoming piece is a run of chunks whose need times grow by a fixed step;
    the runs are merged on one heap of their next chunks, ties broken by position and
    chunk. (A merge of one generator per run cost about 0.5 ms a call over 64 lanes, once
    a chunk: half the consumer's CPU per GET with 1 MiB chunks.)
    """
    # (need time, position, chunk, run's start time, run's first chunk, step, run's stop)
    runs: list[tuple[float, int, int, float, int, float, int]] = []
    finish: list[float] = []
    for resident, ahead in lanes:
        t = float(resident)
        if ahead is not None:
            position, first, per, stop, tail = ahead
            runs.append((t, position, first, t, first, per, stop))
            t += tail
        finish.append(t)
    finish += [0.0] * max(0, window - len(lanes))
    heapq.heapify(finish)
    for position, _, per, stop, count in upcoming[:budget]:
        t = heapq.heappop(finish)
        runs.append((t, position, 0, t, 0, per, stop))
        heapq.heappush(finish, t + count)
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
