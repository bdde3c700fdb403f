"""The stream's native hand-out (``asyncstream/stream/_nextc.c``) against its Python reference.

``_nextc.Meter`` is the core of the stall meter a stream's iterator counts with; the
Python :class:`StallMeter` is its specification. Driven by the same operations with the same
clock readings (``record``), the two give exactly the same figures, epoch and recent window
alike (hypothesis: windows, readings, epochs, pauses). ``_nextc.Handout`` is the base of the
stream's iterator: its ``next()`` hands out the samples the run drew ahead with no Python code
and leaves every other case to the reference (``Iteration._next_slow``); the same samples
come out in the same order, and the guards (a closed or replaced iterator, a second reader,
the first sample's ``on_begin``, a meter that is not the C one) act as the reference's.
"""

from __future__ import annotations

import pickle
import threading
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asyncstream import StallMeter, StateError
from asyncstream.stream import _native
from asyncstream.stream._iteration import Iteration
from asyncstream.stream._stall import new_meter
from tests._fuzz import FUZZ

pytestmark = pytest.mark.skipif(_native.NEXTC is None, reason="the extension is not built")

readings = st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("record"), readings, readings),
        st.tuples(st.just("new_epoch")),
        st.tuples(st.just("pause")),
        st.tuples(st.just("report")),
    ),
    max_size=60,
)


@FUZZ
@given(window=st.integers(1, 8), ops=operations)
def test_the_c_meter_counts_as_the_reference(window: int, ops: list[tuple[Any, ...]]) -> None:
    native, python = new_meter(window), StallMeter(window)
    assert type(native) is not StallMeter
    assert isinstance(native, StallMeter)
    for op in ops:
        for meter in (native, python):
            if op[0] == "record":
                meter.record(op[1], op[2])
            elif op[0] != "report":
                getattr(meter, op[0])()
        assert native.report() == python.report()
        assert native.recent() == python.recent()
        assert (native.waited, native.worked, native.calls) == (
            python.waited,
            python.worked,
            python.calls,
        )
    # pickled (a stream goes to its spawned workers so) and read on: still the same
    native, python = pickle.loads(pickle.dumps(native)), pickle.loads(pickle.dumps(python))
    for meter in (native, python):
        meter.record(2e6, 2e6 + 1.0)
    assert native.report() == python.report()


def test_the_c_meter_reads_the_clock_of_time_perf_counter() -> None:
    import time

    before = time.perf_counter()
    now = _native.NEXTC.clock()  # type: ignore[union-attr]
    assert before <= now <= time.perf_counter()
    meter = new_meter(4)
    started = meter.begin()
    assert before <= started <= time.perf_counter()
    meter.end(started)
    assert (meter.calls, meter.worked) == (1, 0.0)
    assert meter.waited >= 0.0
    assert meter.timed(lambda: "item") == "item"
    with pytest.raises(KeyError):
        meter.timed(lambda: {}["missing"])
    assert meter.calls == 3  # a call that raised is counted, as the reference counts it
    waited, worked, calls = meter.recent()
    assert calls == 3
    assert min(waited, worked) >= 0.0


def test_the_c_meter_refuses_what_the_reference_refuses() -> None:
    for window in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="window"):
            new_meter(window)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        new_meter(2).record("now", 1.0)  # type: ignore[arg-type]


class Run:
    """An epoch run as Iteration sees it: samples drawn ahead in ``ready`` (last first),
    the rest drawn one by one by ``__next__``."""

    def __init__(self, ahead: list[int], later: list[int]) -> None:
        self.ready: list[dict[str, Any]] = [{"n": n} for n in reversed(ahead)]
        self.later = [{"n": n} for n in later]
        self.calls = 0
        self.closed = False

    def __next__(self) -> dict[str, Any]:
        self.calls += 1
        if self.ready:  # as EpochRun.__next__
            return self.ready.pop()
        if not self.later:
            raise StopIteration
        sample = self.later.pop(0)
        if self.later:  # draw the rest ahead, as a run of next() does
            self.ready[:0] = list(reversed(self.later))
            self.later = []
        return sample


def read(iteration: Iteration) -> list[int]:
    return [sample["n"] for sample in iteration]


@pytest.mark.parametrize("meter", ["c", "python", None])
@FUZZ
@given(ahead=st.lists(st.integers(0, 99), max_size=10), later=st.lists(st.integers(0, 99)))
def test_next_hands_out_what_the_reference_does(
    meter: str | None, ahead: list[int], later: list[int]
) -> None:
    begun: list[int] = []

    def make(cls: type[Iteration]) -> tuple[Iteration, Any]:
        m = {"c": new_meter(), "python": StallMeter(), None: None}[meter]
        return cls(Run(ahead, later), meter=m, on_begin=lambda: begun.append(1)), m

    class Reference(Iteration):
        __next__ = Iteration._next_slow  # the Python path only

    native, native_meter = make(Iteration)
    python, python_meter = make(Reference)
    assert read(native) == read(python) == ahead + later
    assert len(begun) == (2 if ahead or later else 0)  # once each, at its first sample
    if meter is not None:
        assert native_meter.calls == python_meter.calls == len(ahead) + len(later) + 1


def test_the_guards_hold_on_the_fast_path() -> None:
    iteration = Iteration(Run([1, 2, 3, 4], []), meter=new_meter())
    assert next(iteration)["n"] == 1  # the first: on the reference's path, then fast
    assert next(iteration)["n"] == 2
    iteration._take_token()  # another thread is reading
    with pytest.raises(StateError, match="two threads"):
        next(iteration)
    iteration._give_token(True)
    assert next(iteration)["n"] == 3
    iteration.replaced = True
    with pytest.raises(StateError, match="ended by a newer iter"):
        next(iteration)
    iteration.replaced = False
    iteration.close()
    with pytest.raises(StopIteration):
        next(iteration)


def test_two_threads_on_one_iterator_are_refused_with_the_c_path() -> None:
    """A reader blocked inside the run (the slow path, the GIL released) holds the token:
    a second thread's next() on the fast path is refused, never handed a sample."""
    inside, go_on = threading.Event(), threading.Event()

    class Blocking(Run):
        def __next__(self) -> dict[str, Any]:
            inside.set()
            go_on.wait(10)
            return super().__next__()

    run = Blocking([], [1, 2, 3])
    iteration = Iteration(run, meter=new_meter())
    first: list[Any] = []
    reader = threading.Thread(target=lambda: first.append(next(iteration)))
    reader.start()
    assert inside.wait(10)
    run.ready.append({"n": 99})  # drawn ahead while the first reader is inside
    with pytest.raises(StateError, match="two threads"):
        next(iteration)
    go_on.set()
    reader.join(10)
    assert not reader.is_alive()
    # the refused call took nothing: every sample is read once, by the reader or after it
    assert sorted([first[0]["n"], *read(iteration)]) == [1, 2, 3, 99]
