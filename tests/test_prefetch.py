"""The prefetch stage's ranking against its first implementation, kept here as the
specification: one generator per run of chunks, merged by ``heapq.merge``, each run
worked out from the lane or piece itself (``soonest`` takes them worked out ahead, by
``lane_ahead`` and ``piece_ahead``)."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Sequence
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncstream.order._plan import Piece
from asyncstream.shards._urls import Shard
from asyncstream.stream._lanes import Ahead, LaneReader, chunk_count, lane_ahead, piece_ahead
from asyncstream.stream._native import NEXTC
from asyncstream.stream._prefetch import _soonest, soonest


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


aheads = st.builds(
    Ahead,
    position=st.integers(0, 200),
    first=st.integers(0, 20),
    per=st.one_of(st.floats(0, 500, allow_nan=False), st.integers(0, 500).map(float)),
    stop=st.integers(0, 30),
    tail=st.integers(0, 1000),
)


@st.composite
def rankings(draw: st.DrawFn) -> dict[str, Any]:
    """The native ranking's inputs as the stream makes them, and beyond: runs that name
    their first chunk past their stop, equal times, empty lanes and pieces, budget 0."""
    positions = draw(st.lists(st.integers(0, 10**6), unique=True, max_size=80))
    ahead = [draw(aheads)._replace(position=p) for p in positions]
    split = draw(st.integers(0, len(ahead)))
    lanes = [(draw(st.integers(0, 600)), a if draw(st.booleans()) else None) for a in ahead[:split]]
    return {
        "lanes": lanes,
        "upcoming": ahead[split:],
        "window": draw(st.integers(max(1, len(lanes)), 80)),
        "budget": draw(st.integers(0, 70)),
    }


@pytest.mark.skipif(NEXTC is None, reason="the native extension is not built")
@settings(max_examples=500, deadline=None)
@given(rankings())
def test_the_native_ranking_names_the_chunks_the_python_one_does(case: dict[str, Any]) -> None:
    assert NEXTC is not None
    native = NEXTC.soonest(case["lanes"], case["upcoming"], case["window"], case["budget"])
    assert native == _soonest(**case)


@pytest.mark.skipif(NEXTC is None, reason="the native extension is not built")
def test_the_native_ranking_refuses_what_is_no_window() -> None:
    assert NEXTC is not None
    with pytest.raises(TypeError, match="a lane is"):
        NEXTC.soonest([(1, 2, 3)], [], 4, 4)
    with pytest.raises(TypeError, match="an Ahead is a tuple of 5"):
        NEXTC.soonest([(1, (0, 1, 2.0))], [], 4, 4)
    with pytest.raises(TypeError):
        NEXTC.soonest([(1, ("a", 0, 1.0, 2, 3))], [], 4, 4)
    with pytest.raises(TypeError, match="sequence"):
        NEXTC.soonest(5, [], 4, 4)
    with pytest.raises(IndexError):  # no lane at all: the reference's heap is empty too
        NEXTC.soonest([], [Ahead(0, 0, 1.0, 2, 3)], 0, 4)
    with pytest.raises(IndexError):
        _soonest([], [Ahead(0, 0, 1.0, 2, 3)], window=0, budget=4)


def test_numbers_beyond_64_bits_are_ranked_by_the_python_ranking() -> None:
    big = Ahead(2**70, 0, 1.0, 3, 5)
    lanes = [(10, Ahead(1, 0, 2.0, 2, 4)), (3, None)]
    assert soonest(lanes, [big], window=4, budget=5) == _soonest(lanes, [big], window=4, budget=5)
    assert (2**70, 0) in soonest(lanes, [big], window=4, budget=5)
