"""The iterator ``iter(ShardStream)`` returns: one epoch's run, guarded against misuse."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from .._exceptions import StateError
from ._native import NEXTC
from ._run import EpochRun, RecordSink
from ._stall import StallMeter

__all__ = ["Iteration", "Owner", "SampleViews"]

_clock = time.perf_counter  # the stall meter's clock


class Owner(Protocol):
    """The stream an iterator belongs to (:class:`~asyncstream.ShardStream`), told when the
    iterator is closed early. A protocol, so that this module stands below the stream."""

    def _stop_iteration(self, iteration: Iteration) -> None: ...


class SampleViews(Protocol):
    """What :meth:`ShardStream.iter_views` returns: an iterator of samples whose members
    are views of the ring, which can also hand out samples in bulk (:meth:`take`)."""

    def __iter__(self) -> Iterator[dict[str, Any]]: ...

    def __next__(self) -> dict[str, Any]: ...

    def close(self) -> None:
        """End the iteration early: its run stops; ``next()`` then raises
        ``StopIteration`` and ``take`` returns 0."""
        ...

    def take(self, n: int, sink: RecordSink) -> int:
        """Up to ``n`` samples, each handed to ``sink(view, url, record)`` as it is drawn
        rather than returned as a dict: the next ``n`` samples of this iterator, in its
        order, the state then as after ``n`` calls of ``next()``; for a consumer that
        takes the members it needs straight out of the ring (``DALIImageLoader`` builds
        its batches so), without a dict, a copy or an iterator call per sample.

        ``record`` is ``(key, header offset, *fields)``, each field ``(extension, start,
        stop, owned)``: the member's bytes are ``owned`` where not ``None``, else
        ``view[start:stop]``, valid only until ``sink`` returns. ``sink`` returns whether
        to go on (the sample it was given counts as drawn either way) and must not raise.
        The stall meter counts the call as one ``next()``.

        Returns:
            The samples drawn; 0 once the epoch has ended.

        Raises:
            StateError: as ``next()`` (another thread reading, a replaced iterator).
            AsyncStreamError: the stream's errors, as ``next()`` raises them.
        """
        ...


class _PyHandout:
    """The reference's base: nothing (its ``next()`` is ``_next_slow`` itself)."""


# next()'s fast path in C where it is built (_nextc.Handout), else the reference below.
if TYPE_CHECKING or NEXTC is None:  # noqa: SIM108 (mypy takes a class only from a branch)
    _Handout = _PyHandout
else:
    _Handout = NEXTC.Handout


class Iteration(_Handout, Iterator[dict[str, Any]]):
    """The iterator ``iter(stream)`` returns: one epoch's run, guarded against misuse.

    A stream serves one iterator at a time (one engine, one ring, one position). A new
    ``iter()`` from the thread that made the live iterator replaces it: DataLoader and
    StatefulDataLoader do that when they restart an epoch, while the old iterator is
    still referenced, so refusing the new one would break them; the replaced iterator
    then raises :class:`StateError` if used again, instead of silently stopping. A new
    ``iter()`` from *another* thread while the live one is being read, or two threads
    calling ``next()`` at once, raise :class:`StateError` at once.

    The iterator holds its stream (``owner``) until it ends, fails or is closed, so a
    stream used in place (``for sample in ShardStream(url):``, ``list(ShardStream(url))``)
    reads its whole epoch instead of being collected, and closed, under it; the stream
    closes once nothing else holds it.

    ``on_begin`` is called once, after the first sample is drawn: only then does the
    iteration count as its epoch begun (an iterator made and dropped unread, as
    StatefulDataLoader does when it loads a finished state, leaves the epochs alone).
    ``meter`` times each ``next()`` against the loop's work between calls.
    """

    def __init__(
        self,
        run: EpochRun,
        owner: Owner | None = None,
        meter: StallMeter | None = None,
        on_begin: Callable[[], None] | None = None,
    ) -> None:
        self.run = run
        self.meter = meter
        self._on_begin = on_begin
        self.thread = threading.get_ident()
        self.started = False
        self.replaced = False
        self.closed = False
        self._owner = owner  # the stream, kept alive while this iterator may run
        # One token, taken by the call reading the run (list.pop and append are atomic):
        # a second reader finds it gone. As a non-blocking lock, for a fifth of the cost.
        token = [True]
        self._token = token  # (read by the C fast path: the token is there or not)
        self._take_token, self._give_token = token.pop, token.append
        self._next_sample = run.__next__
        self._ready = run.ready  # the run's samples drawn ahead, handed out by pop()

    def _next_slow(self) -> dict[str, Any]:
        """``next()``: the reference, and where the extension is built the path of every
        case its fast path leaves (``_nextc.Handout``: a sample drawn ahead handed out,
        counted by a C meter, with nothing else to do)."""
        try:
            self._take_token()
        except IndexError:
            raise _two_readers() from None
        try:
            if self.closed or self.replaced:
                self._refuse()
            ready = self._ready
            if ready and self._on_begin is None:  # drawn ahead: the run's __next__, inline
                meter = self.meter
                if meter is None:
                    return ready.pop()
                started = _clock()
                sample = ready.pop()
                meter.record(started, _clock())
                return sample
            self.started = True
            try:
                if self._on_begin is not None:
                    return self._first()
                if self.meter is None:
                    return self._next_sample()
                return self.meter.timed(self._next_sample)
            except BaseException:
                self._owner = None  # the run is over: the stream may go
                raise
        finally:
            self._give_token(True)

    if NEXTC is None:  # else the C type's next() runs, calling _next_slow where it must
        __next__ = _next_slow

    def take(self, n: int, sink: RecordSink) -> int:
        """Up to ``n`` samples handed to ``sink`` as records (:meth:`SampleViews.take`)."""
        try:
            self._take_token()
        except IndexError:
            raise _two_readers() from None
        try:
            if self.closed or self.replaced:
                if self.closed:
                    return 0
                self._refuse()
            self.started = True
            run = self.run
            try:
                if self.meter is None:
                    taken = run.take(n, sink)
                else:
                    taken = self.meter.timed(lambda: run.take(n, sink))
            except BaseException:
                self._owner = None  # the run is over: the stream may go
                raise
            if taken and self._on_begin is not None:
                on_begin, self._on_begin = self._on_begin, None
                on_begin()
            if taken < n and run.closed:
                self._owner = None
            return taken
        finally:
            self._give_token(True)

    def _first(self) -> dict[str, Any]:
        """The first sample: drawn, then the epoch counted as begun (``on_begin``)."""
        sample = self._next_sample() if self.meter is None else self.meter.timed(self._next_sample)
        on_begin, self._on_begin = self._on_begin, None
        if on_begin is not None:
            on_begin()
        return sample

    def _refuse(self) -> None:
        if self.closed:
            raise StopIteration
        raise StateError(
            "this ShardStream iterator was ended by a newer iter(), set_epoch(), "
            "load_state_dict() or close() on its stream: a stream serves one "
            "iterator at a time"
        )

    def close(self) -> None:
        """End this iterator early (as a generator's ``close()``): its run stops and the
        stream is no longer held by it; ``next()`` then raises ``StopIteration``."""
        self.closed = True
        owner, self._owner = self._owner, None
        if owner is not None:
            owner._stop_iteration(self)

    @property
    def live(self) -> bool:
        return self.started and not self.replaced and not self.closed and not self.run.closed


def _two_readers() -> StateError:
    return StateError(
        "two threads are reading one ShardStream iterator at once; give each "
        "thread a stream of its own (or use DataLoader workers)"
    )
