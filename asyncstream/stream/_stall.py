"""Is the training loop waiting for data? Time inside ``next()`` against time between calls.

A :class:`StallMeter` is told when the loop asks for the next item (:meth:`StallMeter.begin`)
and when it gets it (:meth:`StallMeter.end`). Time between an ``end`` and the next
``begin`` is the loop's own work (the model's step); time between a ``begin`` and its
``end`` is the loop waiting for data. The share of waiting, over the epoch and over the
last ``window`` calls, says whether the data path keeps up: near 0 it does; a loop that
waits 30% of the time would run 1.4x faster with a faster data path.

The clock is ``time.perf_counter``; a meter costs two clock reads per item. Time between
epochs (between the last ``end`` of one and the first ``begin`` of the next) is not counted.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

from ._native import NEXTC

__all__ = ["StallMeter"]

T = TypeVar("T")


class StallMeter:
    """Measures how long a loop waits in ``next()`` against the time it works between calls.

    Args:
        window: the calls that make up the recent share.
    """

    def __init__(self, window: int = 200) -> None:
        _check_window(window)
        self._recent: deque[tuple[float, float]] = deque(maxlen=window)
        self._left: float | None = None  # when the last next() returned
        self._pending_work = 0.0
        self.waited = 0.0  # this epoch
        self.worked = 0.0
        self.calls = 0

    def begin(self) -> float:
        """The loop asks for the next item; returns the time, to give to :meth:`end`."""
        now = time.perf_counter()
        self._pending_work = 0.0 if self._left is None else now - self._left
        return now

    def end(self, started: float) -> None:
        """The loop has its item (or the end of the epoch) after asking at ``started``."""
        now = time.perf_counter()
        waited, worked = now - started, self._pending_work
        self.waited += waited
        self.worked += worked
        self.calls += 1
        self._recent.append((waited, worked))
        self._left = now

    def record(self, started: float, now: float) -> None:
        """One call that asked at ``started`` and had its item at ``now`` (clock
        readings): the figures of :meth:`timed` around a call made without it."""
        left = self._left
        waited, worked = now - started, 0.0 if left is None else started - left
        self.waited += waited
        self.worked += worked
        self.calls += 1
        self._recent.append((waited, worked))
        self._left = now

    def timed(self, produce: Callable[[], T]) -> T:
        """``produce()``, counted as the wait between :meth:`begin` and :meth:`end` (also
        when it raises, as at the end of an epoch): the same figures as the two calls,
        for one call on the path of every item.

        Args:
            produce: gets the next item, e.g. an iterator's ``__next__``.
        """
        started = time.perf_counter()
        try:
            return produce()
        finally:
            self.record(started, time.perf_counter())

    def new_epoch(self) -> None:
        """Start counting a new epoch (the time since the last item is not counted)."""
        self._left = None
        self.waited = self.worked = 0.0
        self.calls = 0

    def pause(self) -> None:
        """Stop counting the loop's work until the next :meth:`begin` (a pass ended)."""
        self._left = None

    @staticmethod
    def _share(waited: float, worked: float) -> float:
        total = waited + worked
        return waited / total if total > 0 else 0.0

    def recent(self) -> tuple[float, float, int]:
        """``(waited, worked, calls)`` over the last ``window`` calls."""
        waited = sum(w for w, _ in self._recent)
        worked = sum(k for _, k in self._recent)
        return waited, worked, len(self._recent)

    def report(self) -> dict[str, Any]:
        """The epoch's and the recent window's waiting, in seconds and as a share."""
        waited, worked, calls = self.recent()
        return {
            "epoch": {
                "waited_s": self.waited,
                "worked_s": self.worked,
                "waited_share": self._share(self.waited, self.worked),
                "calls": self.calls,
            },
            "recent": {
                "waited_s": waited,
                "worked_s": worked,
                "waited_share": self._share(waited, worked),
                "calls": calls,
            },
        }


def _check_window(window: int) -> None:
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be an integer >= 1, got {window!r}")


def new_meter(window: int = 200) -> StallMeter:
    """A :class:`StallMeter` for a stream's iterator: where the extension is built, one
    whose figures are kept in C (``_nextc.Meter``: the same figures from the same clock,
    the recent calls in a ring of doubles instead of a deque of tuples), so that the
    iterator's ``next()`` counts a call with no Python code (``_nextc.Handout``); else
    this Python class, the reference."""
    if NEXTC is None:
        return StallMeter(window)
    return _NativeStallMeter(window)


if NEXTC is not None:

    class _NativeStallMeter(NEXTC.Meter, StallMeter):  # type: ignore[misc, name-defined]
        """:class:`StallMeter` with the core of ``_nextc.Meter`` (every method but
        :meth:`report`, which reads the core's figures)."""

        def __init__(self, window: int = 200) -> None:
            _check_window(window)
            super().__init__(window)  # the C core's
