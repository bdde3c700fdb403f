"""The lanes' places and the shuffle's item lists, kept as the lanes change, against the
same built anew from the lanes: after every open, refill, close, draw and reset of a
window shuffle driven as an epoch drives it (:mod:`asyncstream.stream._run`)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Literal

from hypothesis import given, settings
from hypothesis import strategies as st

from asyncstream.order._shuffle import WindowShuffle
from asyncstream.stream._lanes import Places, lane_places


def _reader(piece: int, chunk: int) -> SimpleNamespace:
    """What a place is made of, named after its piece and chunk."""
    return SimpleNamespace(
        records=[f"{piece}.{chunk}"],
        view=memoryview(bytes([piece % 256, chunk % 256])),
        shard=SimpleNamespace(url=f"file:///s{piece}.tar"),
        first=10 * chunk,
    )


def _same(places: list[Any], expected: list[Any]) -> bool:
    """Equal places (memoryviews compared by their bytes, the rest by value)."""
    return [(r, bytes(v), u, f) for r, v, u, f in places] == [
        (r, bytes(v), u, f) for r, v, u, f in expected
    ]


@settings(max_examples=200, deadline=None)
@given(
    pieces=st.lists(st.lists(st.integers(0, 6), min_size=1, max_size=5), min_size=1, max_size=12),
    window=st.integers(1, 6),
    mode=st.sampled_from(["samples", "shards"]),
    tell=st.lists(st.booleans(), min_size=1),
    resets=st.sets(st.integers(0, 60)),
    key=st.integers(0, 2**32),
)
def test_places_and_item_lists_kept_as_the_lanes_change_equal_those_built_anew(
    pieces: list[list[int]],
    window: int,
    mode: Literal["samples", "shards"],
    tell: list[bool],
    resets: set[int],
    key: int,
) -> None:
    # pieces[p]: the samples each chunk of piece p holds (0 too: an empty chunk)
    shuffle: WindowShuffle[int] = WindowShuffle(len(pieces), window=window, key=key, mode=mode)
    places = Places()
    chunk: dict[int, int] = {}  # each open lane's resident chunk, by piece
    drawn: list[int] = []
    step = 0
    while True:
        step += 1
        told = tell[step % len(tell)]  # a change not told: the places are built anew
        need = shuffle.need()
        if need.kind == "done":
            break
        if need.kind == "open":
            piece = need.piece
            chunk[piece] = 0
            reader = _reader(piece, 0)
            shuffle.open(list(range(pieces[piece][0])), {"reader": reader})
            if told:
                places.opened(shuffle, reader)
        elif need.kind == "refill":
            lane = shuffle.lanes[need.lane]
            piece = lane.piece
            if chunk[piece] + 1 < len(pieces[piece]):
                chunk[piece] += 1
                reader = lane.meta["reader"] = _reader(piece, chunk[piece])
                shuffle.refill(need.lane, list(range(pieces[piece][chunk[piece]])))
                if told:
                    places.refilled(shuffle, need.lane, reader)
            else:
                shuffle.close(need.lane)
                if told:
                    places.closed(shuffle, need.lane)
        else:
            indices, samples = shuffle.draw_many(1 + step % 3)
            assert indices
            drawn += samples
        if step in resets:  # as a resume does: the lanes made anew from a state
            state = shuffle.state()
            meta = [lane.meta for lane in shuffle.lanes]
            shuffle.reset(state, meta)
        assert _same(places.of(shuffle), lane_places(shuffle.lanes))
        assert shuffle._lists == [lane.items for lane in shuffle.lanes]
        assert all(a is lane.items for a, lane in zip(shuffle._lists, shuffle.lanes, strict=True))
    assert len(drawn) == sum(sum(chunks) for chunks in pieces)
