"""How a stream and its DataLoader workers' copies agree on epochs and a loaded state.

A DataLoader with workers iterates *copies* of the stream, one per worker process, and
persistent workers keep theirs from one epoch to the next, so a plain attribute set in the
main process would never reach them. :class:`SharedEpoch` is a table of int64 cells in
shared memory that the main process (the owner) and the workers read and write live:

* **base** and **pinned**: the epoch :meth:`ShardStream.set_epoch` chose, and for each
  reader slot whether that choice still holds for its next iteration (an iteration that
  begins, that is draws or ends, consumes it);
* **last** and **width**: per reader slot (the worker id; 0 in the main process), the
  epoch its last iteration began and the number of readers it was one of. Without a
  pin, a slot's next iteration reads ``last + 1``: epochs advance by themselves, each
  worker counting its own iterations, so the workers of one DataLoader iteration agree
  without waiting for each other (persistent or not). When the number of workers
  changes, the first iteration of the new number reads the epoch after the last one
  begun by the old (**floor** records it for the slots that come later);
* **mark** and **used**: the mark of the state :meth:`ShardStream.load_state_dict` left
  pending in the main process (0 for none), and per slot the mark of the state it
  resumed, so a worker started before that load can tell its copy lacks the state
  (and refuse), and a later DataLoader iteration's copies know it was used;
* how many worker iterations started since the epoch or state was last set: while it is
  not 0, the main process knows its own ``state_dict()`` would not describe what was read
  (the workers read, not it).

Forked workers inherit the cells; spawned ones get them while being spawned. Plain
pickling and ``copy.deepcopy`` make an independent copy with cells of its own. Every
write is one aligned int64 store; the one update that two workers may race on (the
first iteration after the number of workers changed) writes ``floor`` before the slot,
so a reader sees one or the other.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Iterator
from multiprocessing.context import get_spawning_popen
from multiprocessing.sharedctypes import RawArray
from typing import Any

__all__ = ["LOCAL", "SLOTS", "Refused", "SharedEpoch"]

LOCAL = -1  # the pending mark of a state loaded by a copy itself, not by the stream it copies
SLOTS = 512  # DataLoader workers per rank, at most

_BASE, _MARK, _ITERATIONS, _FLOOR, _HEADER = 0, 1, 2, 3, 4
_LAST, _WIDTH, _PINNED, _USED = (_HEADER + k * SLOTS for k in range(4))
_CELLS = _HEADER + 4 * SLOTS


class SharedEpoch:
    """Epochs, pins, the pending state's mark and the worker iterations, shared with workers."""

    def __init__(self, epoch: int = 0) -> None:
        self._cells = RawArray(ctypes.c_int64, _CELLS)
        self._owner = os.getpid()
        self.publish(epoch, pin=False)

    @classmethod
    def _attach(cls, cells: ctypes.Array[ctypes.c_int64], owner: int) -> SharedEpoch:
        shared = cls.__new__(cls)
        shared._cells, shared._owner = cells, owner
        return shared

    @classmethod
    def _copy(cls, values: list[int]) -> SharedEpoch:
        shared = cls()
        for i, value in enumerate(values):
            shared._cells[i] = value
        return shared

    def __reduce__(self) -> tuple[Any, ...]:
        if get_spawning_popen() is not None:  # multiprocessing can pass shared memory only then
            return SharedEpoch._attach, (self._cells, self._owner)
        return SharedEpoch._copy, (list(self._cells),)

    @property
    def owned(self) -> bool:
        """Whether this process created the cells (a DataLoader worker only reads them)."""
        return self._owner == os.getpid()

    @property
    def mark(self) -> int:
        return int(self._cells[_MARK])

    @property
    def base(self) -> int:
        """The epoch :meth:`publish` set last."""
        return int(self._cells[_BASE])

    @property
    def worker_iterations(self) -> int:
        """Worker iterations started since the last :meth:`publish` or :meth:`loaded`."""
        return int(self._cells[_ITERATIONS])

    @property
    def upcoming(self) -> int:
        """The epoch the next iteration reads, as the main process sees it: the chosen
        epoch, or the one after the latest begun since."""
        c = self._cells
        last = max(c[_LAST : _LAST + SLOTS])
        return max(int(c[_BASE]), int(c[_FLOOR]), last + 1 if last >= 0 else 0)

    def publish(self, epoch: int, *, pin: bool = True) -> None:
        """Choose the epoch of every reader's next iteration (:meth:`ShardStream.set_epoch`);
        forgets the epochs begun and resets the worker iterations."""
        c = self._cells
        c[_BASE], c[_FLOOR], c[_ITERATIONS] = epoch, -1, 0
        c[_LAST : _LAST + SLOTS] = [-1] * SLOTS
        c[_WIDTH : _WIDTH + SLOTS] = [0] * SLOTS
        c[_PINNED : _PINNED + SLOTS] = [int(pin)] * SLOTS

    def loaded(self, mark: int) -> None:
        """The main process loaded a state (``mark`` > 0), or used its own (0)."""
        self._cells[_MARK], self._cells[_ITERATIONS] = mark, 0

    def next_epoch(self, slot: int, width: int) -> tuple[int, bool, bool]:
        """The epoch reader ``slot`` of ``width`` readers reads next: ``(epoch, pinned,
        rebased)``, ``pinned`` if :meth:`publish` chose it, ``rebased`` if the number of
        readers changed since the last iteration began (see the module docstring)."""
        _check_slot(slot)
        c = self._cells
        if c[_PINNED + slot]:
            return int(c[_BASE]), True, False
        last = int(c[_LAST + slot])
        if last >= 0 and c[_WIDTH + slot] == width:
            return last + 1, False, False
        old = [
            int(c[_LAST + v]) for v in range(SLOTS) if c[_LAST + v] >= 0 and c[_WIDTH + v] != width
        ]
        if old:
            return max(old) + 1, False, True
        return max(int(c[_BASE]), int(c[_FLOOR])), False, False

    def begin(self, slot: int, width: int, epoch: int, *, rebased: bool = False) -> None:
        """Reader ``slot`` began ``epoch``: its pin is used, its next epoch follows this one."""
        c = self._cells
        if rebased:
            c[_FLOOR] = epoch  # before the slot, for a racing worker of the same iteration
        c[_LAST + slot], c[_WIDTH + slot], c[_PINNED + slot] = epoch, width, 0

    def finished(self, slot: int, width: int, epoch: int) -> None:
        """Reader ``slot`` loaded a state with nothing left of ``epoch``: that epoch counts
        as read (the next unpinned iteration reads the one after), and a pin still holds."""
        c = self._cells
        c[_LAST + slot], c[_WIDTH + slot] = epoch, width

    def use(self, slot: int, mark: int) -> None:
        """Reader ``slot`` resumed the main process's pending state ``mark``."""
        self._cells[_USED + slot] = mark

    def spent(self, slot: int, width: int, mark: int) -> bool:
        """Whether the pending state ``mark`` is spent for reader ``slot`` of ``width``:
        it resumed it, or readers of another DataLoader (another width) did."""
        c = self._cells
        return bool(c[_USED + slot] == mark) or any(
            c[_USED + v] == mark and c[_WIDTH + v] != width for v in range(SLOTS)
        )

    def last(self, slot: int) -> int:
        """The epoch reader ``slot`` began last since :meth:`publish` (-1: none)."""
        return int(self._cells[_LAST + slot])

    def used_by_any(self, mark: int) -> bool:
        """Whether some reader resumed the pending state ``mark`` (so it is spent)."""
        return mark in self._cells[_USED : _USED + SLOTS]

    def worker_started(self) -> None:
        """A worker's copy starts an iteration (a lost update between two workers still
        leaves the count above 0, which is all the owner asks of it)."""
        self._cells[_ITERATIONS] += 1


def _check_slot(slot: int) -> None:
    if not 0 <= slot < SLOTS:
        raise ValueError(
            f"a ShardStream supports at most {SLOTS} DataLoader workers per rank (worker {slot})"
        )


class Refused(Iterator[dict[str, Any]]):
    """Iterated by a DataLoader worker instead of an epoch it refuses. Torch reports an error
    raised by ``next()`` in the main process, but one raised by ``iter()`` at the start of a
    later epoch kills a persistent worker."""

    def __init__(self, error: Exception) -> None:
        self._error = error

    def __next__(self) -> dict[str, Any]:
        raise self._error

    def take(self, n: int, sink: Callable[..., bool]) -> int:
        """As :meth:`~._iteration.Iteration.take`: raises the refusal."""
        raise self._error

    def close(self) -> None:
        """Nothing to stop: the epoch was refused."""
