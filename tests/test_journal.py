"""Snapshots of the window shuffle (``asyncstream/order/_journal.py``) against its state.

:meth:`WindowShuffle.state` is the reference: a shuffle is driven as the stream drives it
(pieces opened, lanes refilled and closed, runs of draws, tails of runs put back), a
snapshot taken now and then beside a copy of ``state()`` at that moment; when the epoch is
over, every snapshot must still make exactly its copy, list for list and in the same
order. Seeds, windows, modes, shuffle on and off, a blend, the native and the Python
draw, and journals short enough to be dropped and based anew every few entries are drawn
by hypothesis.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asyncstream.order import _journal, _shuffle
from tests._fuzz import FUZZ
from tests.test_native_draw import Driven


@contextmanager
def draw_path(native: bool, limit: int) -> Iterator[None]:
    """The native or the Python draw, and journals dropped past ``limit`` entries."""
    saved = _shuffle.NATIVE, _journal._MIN_LIMIT
    _shuffle.NATIVE = native and saved[0]
    _journal._MIN_LIMIT = limit
    try:
        yield
    finally:
        _shuffle.NATIVE, _journal._MIN_LIMIT = saved


def make(
    sizes: list[int], chunk: int, *, window: int, mode: str, shuffle: bool, blend: bool
) -> Driven:
    """A shuffle over pieces of ``sizes[p]`` samples in chunks of ``chunk`` samples, as
    ``simulate_window_order`` drives it (``test_native_draw``'s driver; a blend over two
    sources, the pieces alternating, when ``blend``)."""
    return Driven(
        sizes,
        chunk,
        window=window,
        key=0x5EED ^ len(sizes),
        mode=mode,
        shuffle=shuffle,
        groups=[p % 2 for p in range(len(sizes))] if blend else None,
        totals=[sum(sizes[0::2]), sum(sizes[1::2])] if blend else None,
    )


@FUZZ
@given(
    data=st.data(),
    window=st.integers(1, 6),
    mode=st.sampled_from(["samples", "shards"]),
    shuffle=st.booleans(),
    blend=st.booleans(),
    native=st.booleans(),
    limit=st.sampled_from([0, 3, 1024]),
    sizes=st.lists(st.integers(0, 30), min_size=0, max_size=8),
    chunk=st.integers(1, 12),
)
def test_every_snapshot_makes_the_state_it_was_taken_at(
    data: st.DataObject,
    window: int,
    mode: str,
    shuffle: bool,
    blend: bool,
    native: bool,
    limit: int,
    sizes: list[int],
    chunk: int,
) -> None:
    taken: list[tuple[Any, dict[str, Any]]] = []
    with draw_path(native, limit):
        driven = make(sizes, chunk, window=window, mode=mode, shuffle=shuffle, blend=blend)
        s = driven.shuffle
        while True:
            if data.draw(st.booleans(), label="snapshot"):
                taken.append((s.snapshot(), copy.deepcopy(s.state())))
            if not driven.serve():
                break
            indices, samples = s.draw_many(data.draw(st.integers(1, 9), label="run"))
            back = data.draw(st.integers(0, len(indices)), label="put back")
            if back and data.draw(st.booleans(), label="snapshot before putting back"):
                taken.append((s.snapshot(), copy.deepcopy(s.state())))
            if back:
                s.undraw(indices[len(indices) - back :], samples[len(samples) - back :])
        taken.append((s.snapshot(), copy.deepcopy(s.state())))
    for snapshot, state in taken:
        made = snapshot.state()
        assert made == state
        assert json.dumps(made) == json.dumps(state)  # the same keys, in the same order
        assert snapshot.draws == state["draws"]


def test_a_snapshot_never_changes_and_makes_new_lists() -> None:
    driven = make([40, 25, 33], 10, window=2, mode="samples", shuffle=True, blend=False)
    s = driven.shuffle
    driven.serve()
    s.draw_many(3)
    snapshot, state = s.snapshot(), copy.deepcopy(s.state())
    first = snapshot.state()
    first["lanes"][0]["remaining"].clear()  # a caller's to change: not the snapshot's
    while driven.serve():
        s.draw_many(5)
    assert snapshot.state() == state
    assert (
        snapshot.state()["lanes"][0]["remaining"] is not snapshot.state()["lanes"][0]["remaining"]
    )


def test_a_draw_put_back_past_a_snapshot_leaves_it_as_taken() -> None:
    driven = make([30, 30], 30, window=2, mode="shards", shuffle=True, blend=False)
    s = driven.shuffle
    driven.serve()
    s.draw_many(1)
    driven.serve()
    indices, samples = s.draw_many(6)
    snapshot, state = s.snapshot(), copy.deepcopy(s.state())
    s.undraw(indices, samples)  # behind the snapshot: the journal is dropped, not cut
    assert snapshot.state() == state
    assert s.snapshot().state() == s.state()


def test_a_snapshot_is_made_in_another_thread_while_the_shuffle_goes_on() -> None:
    driven = make([400] * 6, 100, window=4, mode="samples", shuffle=True, blend=False)
    s = driven.shuffle
    taken = []
    while driven.serve():
        taken.append((s.snapshot(), copy.deepcopy(s.state())))
        s.draw_many(7)
        if len(taken) == 40:
            break
    made: list[dict[str, Any]] = []
    thread = threading.Thread(target=lambda: made.extend(t.state() for t, _ in taken))
    thread.start()
    while driven.serve():
        s.draw_many(7)
    thread.join()
    assert made == [state for _, state in taken]


def test_a_reset_starts_a_new_base() -> None:
    driven = make([20, 20, 20], 20, window=3, mode="samples", shuffle=True, blend=False)
    s = driven.shuffle
    for _ in range(3):
        driven.serve()
        s.draw_many(1)
    before, state = s.snapshot(), copy.deepcopy(s.state())
    s.reset(json.loads(json.dumps(state)))
    s.draw_many(4)
    assert before.state() == state
    assert s.snapshot().state() == s.state()


def test_the_pick_randoms_are_the_draw_s() -> None:
    key = 0xDEADBEEF12345678
    assert _journal.pick_randoms(key, 7, 5) == [
        _shuffle._splitmix((key + 2 * d + 1) & ((1 << 64) - 1)) for d in range(7, 12)
    ]
    assert _journal.pick_randoms((1 << 64) - 1, (1 << 62), 2) == [
        _shuffle._splitmix(((1 << 64) - 1 + 2 * d + 1) & ((1 << 64) - 1))
        for d in range(1 << 62, (1 << 62) + 2)
    ]


@pytest.mark.parametrize("resident", [0, 100, 4096, 100_000])
def test_a_journal_is_dropped_when_a_new_base_costs_less(resident: int) -> None:
    assert _journal.journal_limit(resident) == max(1024, resident // 4)
