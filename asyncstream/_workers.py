"""How a stream and its DataLoader workers' copies agree on the epoch and a loaded state.

A DataLoader with workers iterates *copies* of the stream, one per worker process, and
persistent workers keep theirs from one epoch to the next, so a plain attribute set in the
main process would never reach them. :class:`SharedEpoch` is three int64 cells in shared
memory that the main process (the owner) writes and the workers read live:

* the epoch :meth:`ShardStream.set_epoch` chose;
* the *mark* of the state :meth:`ShardStream.load_state_dict` left pending (0 for none),
  so a worker started before that load can tell its copy lacks the state, and refuse;
* how many worker iterations started since the epoch or state was last set: while it is
  not 0, the main process knows its own ``state_dict()`` would not describe what was read
  (the workers read, not it).

Forked workers inherit the cells; spawned ones get them while being spawned. Plain
pickling and ``copy.deepcopy`` make an independent copy with cells of its own.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from multiprocessing.context import get_spawning_popen
from multiprocessing.sharedctypes import RawArray
from typing import Any

__all__ = ["LOCAL", "Refused", "SharedEpoch"]

LOCAL = -1  # the pending mark of a state loaded by a copy itself, not by the stream it copies


class SharedEpoch:
    """The epoch, the pending state's mark and the worker iterations, shared with workers."""

    def __init__(self, epoch: int = 0, mark: int = 0) -> None:
        self._cells = RawArray(ctypes.c_int64, [epoch, mark, 0])
        self._owner = os.getpid()

    @classmethod
    def _attach(cls, cells: ctypes.Array[ctypes.c_int64], owner: int) -> SharedEpoch:
        shared = cls.__new__(cls)
        shared._cells, shared._owner = cells, owner
        return shared

    def __reduce__(self) -> tuple[Any, ...]:
        if get_spawning_popen() is not None:  # multiprocessing can pass shared memory only then
            return SharedEpoch._attach, (self._cells, self._owner)
        return SharedEpoch, (self.epoch, self.mark)

    @property
    def owned(self) -> bool:
        """Whether this process created the cells (a DataLoader worker only reads them)."""
        return self._owner == os.getpid()

    @property
    def epoch(self) -> int:
        return int(self._cells[0])

    @property
    def mark(self) -> int:
        return int(self._cells[1])

    @property
    def worker_iterations(self) -> int:
        """Worker iterations started since the last :meth:`publish`."""
        return int(self._cells[2])

    def publish(self, epoch: int, mark: int) -> None:
        """Set the epoch and the pending mark (owner only); resets the worker iterations."""
        self._cells[0], self._cells[1], self._cells[2] = epoch, mark, 0

    def worker_started(self) -> None:
        """A worker's copy starts an iteration (a lost update between two workers still
        leaves the count above 0, which is all the owner asks of it)."""
        self._cells[2] += 1


class Refused(Iterator[dict[str, Any]]):
    """Iterated by a DataLoader worker instead of an epoch it refuses. Torch reports an error
    raised by ``next()`` in the main process, but one raised by ``iter()`` at the start of a
    later epoch kills a persistent worker."""

    def __init__(self, error: Exception) -> None:
        self._error = error

    def __next__(self) -> dict[str, Any]:
        raise self._error
