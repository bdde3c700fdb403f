"""Batch buffers in shared memory, reused: a DataLoader worker's pool, and the training
process's view of it.

A worker writes each batch's encoded images into one buffer of its pool and sends the
buffer's name, not the buffer; the training process maps each buffer once and keeps the
mapping; when the batch is dropped there (DALI is done with it: see
``PipelineDriver.retired``), a flag in a small shared array tells the worker the buffer is
free again. So, after the first batches, a batch costs neither a new segment nor its
page faults, on either side.

Why not hand a shared-memory tensor over, as the DataLoader does by default: torch's
default sharing strategy (``file_descriptor``) passes each tensor's file descriptor over a
Unix socket, after an HMAC handshake with a resource-sharer thread in the worker, which
must take the worker's GIL to answer while the worker builds the next batch; and every
batch is a fresh segment whose every page faults in twice (written by the worker, read by
DALI). Measured on 2 cores (``bench.feed``'s tiny images, one worker, no DALI): the
handshake alone held the training process 10 us an image.

Names and cleanup. A buffer is a POSIX shared-memory segment named as the stream's rings
are (``asyncstream-batch-<pid>-<hex>``) and registered with multiprocessing's resource
tracker, which DataLoader workers share with the training process. The training process
unlinks each name as soon as it has mapped the buffer (the memory lives on while either
side maps it); a worker unlinks at its exit the names it made that nobody mapped; the
tracker unlinks whatever is left once every process is gone, a killed one included. Not
torch's ``file_system`` storages: their manager client (``libshm``) allocates through
whichever manager it met first, a dead worker's included, and hangs there.
"""

from __future__ import annotations

import _posixshmem  # type: ignore[import-not-found]  # what SharedMemory uses
import contextlib
import mmap
import os
import secrets
from multiprocessing import resource_tracker, util
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["BatchBuffer", "BufferPool", "BufferViews", "Handle"]

SLOTS = 128
"""Buffers a worker keeps at most; a batch that finds none free (more in flight than
this) gets a buffer of its own, not reused."""

_GRAIN = 1 << 20  # buffers grow in whole MiB, with a quarter more than asked

Handle = tuple[str, int]
"""A buffer's name in shared memory and its size in bytes."""

_TAG = "asyncstream-batch"  # segment names: <tag>-<pid>-<hex>, as the ring's (leak checks)


class _Segment:
    """A worker's buffer: its name, size and bytes (mapped by hand: see :func:`_map`)."""

    __slots__ = ("array", "name", "size")

    def __init__(self, nbytes: int) -> None:
        while True:
            name = f"{_TAG}-{os.getpid()}-{secrets.token_hex(4)}"
            with contextlib.suppress(FileExistsError):
                # Made (and registered with the resource tracker) by SharedMemory, then
                # closed at once and mapped again by hand.
                SharedMemory(name=name, create=True, size=nbytes).close()
                break
        self.name, self.size = name, nbytes
        self.array = _map(name, nbytes)


def _map(name: str, nbytes: int) -> npt.NDArray[np.uint8]:
    """A segment's bytes, mapped by hand rather than with ``SharedMemory``, whose
    ``close`` (and so its ``__del__``) refuses while views of it are alive: this mapping
    lives until the last array over it is dropped."""
    fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
    try:
        mapping = mmap.mmap(fd, nbytes)
    finally:
        os.close(fd)
    return np.frombuffer(mapping, dtype=np.uint8)


def _attach(handle: Handle) -> npt.NDArray[np.uint8]:
    """Map a worker's segment here and unlink its name: the memory lives on while either
    side maps it, and no name is left behind."""
    array = _map(*handle)
    _unlink(handle[0])
    return array


def _unlink(name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        _posixshmem.shm_unlink("/" + name)
        resource_tracker.unregister("/" + name, "shared_memory")


class BufferPool:
    """A worker's batch buffers; a batch writes its images into one
    (:class:`BatchBuffer`), which is free again once the training process lets go of the
    batch."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        flags = _Segment(SLOTS)
        self.flags = flags.array  # 1: in use by a batch in flight
        self.flags[:] = 0
        self.flags_handle: Handle = (flags.name, SLOTS)
        self.buffers: list[_Segment] = []
        self.made = 0  # buffers allocated in all (reuse shows as few)
        self.hint = 0  # the bytes of the largest batch so far: what a new batch asks for
        self._names: list[str] = [flags.name]  # every name made, to unlink at exit
        util.Finalize(self, _unlink_all, args=(self._names,), exitpriority=10)

    def take(self, nbytes: int) -> tuple[int, _Segment]:
        """A free buffer of at least ``nbytes``, marked in use: its slot (``-1``: one of
        its own, not reused) and its segment."""
        flags = self.flags
        slot = next((i for i in range(len(self.buffers)) if flags[i] == 0), -1)
        if slot < 0 and len(self.buffers) < SLOTS:
            slot = len(self.buffers)
            self.buffers.append(self._allocate(nbytes))
        elif slot >= 0 and self.buffers[slot].size < nbytes:
            self.buffers[slot] = self._allocate(nbytes)  # the old one goes with its last user
        if slot < 0:
            return slot, self._allocate(nbytes)
        flags[slot] = 1
        return slot, self.buffers[slot]

    def free(self, slot: int) -> None:
        """A buffer taken but not sent is free again."""
        if slot >= 0:
            self.flags[slot] = 0

    def _allocate(self, nbytes: int) -> _Segment:
        segment = _Segment(-(-max(1, nbytes + nbytes // 4) // _GRAIN) * _GRAIN)
        self._names.append(segment.name)
        self.made += 1
        return segment


def _unlink_all(names: list[str]) -> None:
    """At a worker's exit: the names it made (those the training process mapped are gone
    already)."""
    for name in names:
        _unlink(name)


class BatchBuffer:
    """One batch's images, written into a buffer of ``pool`` as they come (so a stream's
    views can be copied once, straight into shared memory): the buffer grows, into
    another of the pool, when a batch outgrows it; :meth:`wire` hands it over, or
    :meth:`free` gives it back unsent.
    """

    def __init__(self, pool: BufferPool) -> None:
        self.pool = pool
        self.slot = -1
        self.segment: _Segment | None = None
        self.data: memoryview | None = None  # the buffer's bytes, written through
        self.used = 0

    def put(self, data: Any) -> tuple[int, int]:
        """Copy ``data`` (bytes-like) in; returns where it lies: ``(start, stop)``."""
        start, stop = self.used, self.used + len(data)
        if self.data is None or stop > len(self.data):
            self._grow(stop)
        assert self.data is not None
        self.data[start:stop] = data
        self.used = stop
        return start, stop

    def _grow(self, need: int) -> None:
        slot, segment = self.pool.take(max(need, self.pool.hint))
        data = segment.array.data  # a memoryview of it
        if self.data is not None:
            data[: self.used] = self.data[: self.used]
        self.free()
        self.slot, self.segment, self.data = slot, segment, data

    def wire(self) -> dict[str, Any] | None:
        """What the training process needs to map the buffer and free it; ``None`` (and
        the buffer given back) when nothing was written."""
        if self.segment is None or not self.used:
            self.free()
            return None
        self.pool.hint = max(self.pool.hint, self.used)
        wire = {
            "slot": self.slot,
            "handle": (self.segment.name, self.segment.size),
            "flags": self.pool.flags_handle,
        }
        self.slot, self.segment, self.data = -1, None, None  # the training process's now
        return wire

    def free(self) -> None:
        """Give the buffer back unsent (a batch abandoned, or regrown elsewhere)."""
        self.pool.free(self.slot)
        self.slot, self.segment, self.data = -1, None, None


class _Lease:
    """Frees a worker's buffer (clears its flag) when the batch that holds it is dropped."""

    __slots__ = ("flags", "slot")

    def __init__(self, flags: npt.NDArray[np.uint8], slot: int) -> None:
        self.flags, self.slot = flags, slot

    def __del__(self) -> None:
        if self.slot >= 0:
            self.flags[self.slot] = 0


class BufferViews:
    """The training process's side: each worker's buffers, mapped once and kept (those of
    a worker that was replaced, as DataLoader workers are at a restart, are let go).

    Make it before the workers start: it starts the resource tracker here first, so that
    the workers (forked or spawned) share it, and a name a worker registers is the one
    this process unregisters.
    """

    def __init__(self) -> None:
        resource_tracker.ensure_running()
        # By worker id: its flags' segment name, the flags, and its buffers by slot (the
        # segment name and the mapping).
        self._workers: dict[
            int,
            tuple[str, npt.NDArray[np.uint8], dict[int, tuple[str, npt.NDArray[np.uint8]]]],
        ] = {}

    def open(self, wire: dict[str, Any], worker: int) -> tuple[npt.NDArray[np.uint8], _Lease]:
        """The bytes of the buffer ``wire`` names (sent by ``worker``), and the lease that
        frees it when the batch (which must hold it as long as the bytes are read) is
        dropped."""
        flags_handle: Handle = wire["flags"]
        known = self._workers.get(worker)
        if known is None or known[0] != flags_handle[0]:
            known = self._workers[worker] = (flags_handle[0], _attach(flags_handle), {})
        _, flags, mapped = known
        handle: Handle = wire["handle"]
        slot: int = wire["slot"]
        if slot < 0:
            data = _attach(handle)
        else:
            buffer = mapped.get(slot)
            if buffer is None or buffer[0] != handle[0]:  # new, or the worker grew it
                buffer = mapped[slot] = (handle[0], _attach(handle))
            data = buffer[1]
        return data, _Lease(flags, slot)

    def nbytes(self) -> int:
        """The shared memory of the workers' buffers mapped here (all the buffers the
        workers keep, once each has been used)."""
        return sum(
            len(array) for _, _, mapped in self._workers.values() for _, array in mapped.values()
        )

    def forget(self) -> None:
        """Drop every mapping (the workers are gone); batches still held keep theirs."""
        self._workers.clear()
