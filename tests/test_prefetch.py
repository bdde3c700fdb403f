"""The prefetch stage's ranking against its first implementation, kept here as the
specification: one generator per run of chunks, merged by ``heapq.merge``, each run
worked out from the lane or piece itself (``soonest`` takes them worked out ahead, by
``lane_ahead`` and ``piece_ahead``)."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Sequence
from typing import Any, cast

from hypothesis import given, settings
from hypothesis import strategies as st

from asyncstream.order._plan import Piece
from asyncstream.shards._urls import Shard
from asyncstream.stream._lanes import LaneReader, chunk_count, lane_ahead, piece_ahead
from asyncstream.stream._prefetch import soonest


def _chunk_needs(
    start: float, position: int, first: int, stop: int, per_chunk: float
) -> Iterator[tuple[float, int, int]]:
    for chunk in range(first, stop):
        yield start + (chunk - first) * per_chunk, position, chunk


def reference(
    lanes: Sequence[tuple[int, LaneReader]],
    upcoming: Sequence[tuple[int, Piece, Shard, int]],
    *,
    window: int,
    chunk_bytes: int,
    budget: int,
) -> list[tuple[int, int]]:
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


CHUNK = 1 << 20


@st.composite
def windows(draw: st.DrawFn) -> dict[str, Any]:
    n_shards = draw(st.integers(1, 12))
    shards = [Shard(f"file:///s{i}.tar", draw(st.integers(1, 9 * CHUNK))) for i in range(n_shards)]
    counts = [draw(st.integers(1, 400)) for _ in range(n_shards)]
    lanes: list[tuple[int, LaneReader]] = []
    position = 0
    for i in draw(st.lists(st.integers(0, n_shards - 1), max_size=10)):
        stop = draw(st.integers(1, counts[i]))
        piece = Piece(i, 0, stop)
        lane = LaneReader(position, piece, shards[i], cast(Any, None), counts[i], CHUNK)
        lane.chunk = draw(st.integers(0, lane.n_chunks - 1))
        lane.returned = draw(st.integers(0, stop))
        lanes.append((draw(st.integers(0, 50)), lane))
        position += 1
    upcoming = []
    for i in draw(st.lists(st.integers(0, n_shards - 1), max_size=10)):
        first = draw(st.integers(0, counts[i] - 1))
        stop = draw(st.sampled_from([counts[i], draw(st.integers(first + 1, counts[i]))]))
        upcoming.append((position, Piece(i, first, stop), shards[i], counts[i]))
        position += 1
    return {
        "lanes": lanes,
        "upcoming": upcoming,
        "window": draw(st.integers(max(1, len(lanes)), 16)),
        "chunk_bytes": CHUNK,
        "budget": draw(st.integers(0, 40)),
    }


def ranked(case: dict[str, Any]) -> list[tuple[int, int]]:
    """``soonest`` over a case of the reference's inputs, each worked out ahead."""
    return soonest(
        [(resident, lane_ahead(lane)) for resident, lane in case["lanes"]],
        [piece_ahead(*up, case["chunk_bytes"]) for up in case["upcoming"]],
        window=case["window"],
        budget=case["budget"],
    )


@settings(max_examples=300, deadline=None)
@given(windows())
def test_soonest_ranks_as_the_reference(case: dict[str, Any]) -> None:
    assert ranked(case) == reference(**case)


def test_soonest_ranks_by_need_time_then_position() -> None:
    shards = [Shard(f"file:///s{i}.tar", 4 * CHUNK) for i in range(2)]
    lanes = []
    for position in range(2):
        lane = LaneReader(
            position, Piece(position, 0, 100), shards[position], cast(Any, None), 100, CHUNK
        )
        lane.chunk = 0
        lanes.append((10, lane))  # both lanes need their next chunk after 10 draws
    wanted = ranked(
        {"lanes": lanes, "upcoming": [], "window": 2, "chunk_bytes": CHUNK, "budget": 5}
    )
    # chunks 1, 2, 3 of each lane at 10, 10 + 100/3, ...: lane 0 first at equal times.
    assert wanted == [(0, 1), (1, 1), (0, 2), (1, 2), (0, 3)]
