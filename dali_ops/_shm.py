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

Segments and cleanup. A buffer is a segment with no name (``asyncstream.engine._segment``:
a memfd where the kernel has them), so a container's small /dev/shm does not bind: a
worker's buffers take memory, not /dev/shm. The worker keeps each buffer's descriptor open
while the buffer is in its pool, and the wire names it by ``(pid, fd, inode, size)``; the
training process opens it once through ``/proc/PID/fd/FD`` (the kernel lets a process of
the same user do so: a ptrace read check, which Yama's ``ptrace_scope`` leaves alone; only
a batch buffer of that process with the inode named is opened, so a descriptor number
reused for another file is refused), maps it and closes its descriptor. Nothing is ever
left behind: a segment's memory goes with the last descriptor and mapping of it,
whichever process dies, a killed one included. A batch that finds no buffer free (more in
flight than the pool holds) is sent in the wire itself, pickled: rare, and nothing to
reach later. Not torch's ``file_system`` storages: their manager client (``libshm``)
allocates through whichever manager it met first, a dead worker's included, and hangs
there.
"""

from __future__ import annotations

import mmap
import os
from typing import Any

import numpy as np
import numpy.typing as npt

from asyncstream.engine._segment import check, create

__all__ = ["BatchBuffer", "BufferPool", "BufferViews", "Handle"]

SLOTS = 128
"""Buffers a worker keeps at most; a batch that finds none free (more in flight than
this) gets a buffer of its own, not reused."""

_GRAIN = 1 << 20  # buffers grow in whole MiB, with a quarter more than asked

Handle = tuple[int, int, int, int]
"""A worker's buffer: the worker's pid, the buffer's descriptor there, its inode and its
size in bytes."""

_TAG = "asyncstream-batch"  # segment labels: <tag>-<pid>-<hex>, as the ring's (leak checks)


class _Segment:
    """A worker's buffer: its descriptor (kept open for the training process to open),
    its handle and its bytes."""

    __slots__ = ("array", "fd", "handle", "size")

    def __init__(self, nbytes: int) -> None:
        check(
            nbytes,
            f"a DataLoader worker's batch buffer of {nbytes >> 20} MiB",
            "use smaller batches",
        )
        self.fd = create(_TAG, nbytes)
        try:
            mapping = mmap.mmap(self.fd, nbytes)
        except BaseException:
            os.close(self.fd)
            raise
        self.size = nbytes
        self.handle: Handle = (os.getpid(), self.fd, os.fstat(self.fd).st_ino, nbytes)
        self.array = np.frombuffer(mapping, dtype=np.uint8)

    def __del__(self) -> None:
        fd, self.fd = getattr(self, "fd", -1), -1
        if fd >= 0:
            os.close(fd)  # the mapping lives on while arrays over it do


class _Private:
    """Plain memory: the buffers of a pool that is not shared (the thread feed's), and a
    worker's batch's own buffer when its pool has none free (sent pickled).

    An anonymous private mapping, not ``np.empty``: NumPy asks for transparent huge pages
    on arrays of 4 MiB and more (``madvise``), and where the kernel's THP ``defrag`` is
    ``madvise`` (Debian's and Ubuntu's default) each 2 MiB page faulted in may first
    compact memory. On this 2-core machine after some hours of work the realistic run's
    first epoch, when the feed's ~10 buffers of ~37 MiB are first written, faulted in 134
    to 146 huge pages and ran at 889 to 902 images/s; with this mapping (4 KiB pages, or
    huge pages only where the kernel gives them without compacting) none, at 943 to 966,
    the steady epochs level (``python -m bench.feed --parts real --baseline da829a4``,
    bench/RESULTS.md).
    """

    __slots__ = ("array", "size")

    def __init__(self, nbytes: int) -> None:
        self.size = nbytes
        mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.array = np.frombuffer(mapping, dtype=np.uint8)


def _attach(handle: Handle) -> npt.NDArray[np.uint8]:
    """Map a worker's buffer here, through its descriptor in the worker.

    Raises:
        OSError: the buffer is gone (the worker exited or let go of it), or the descriptor
            now holds another file.
    """
    pid, fd, inode, nbytes = (int(x) for x in handle)
    path = f"/proc/{pid}/fd/{fd}"
    target = os.readlink(path)  # a worker's buffer, or nothing is opened
    if not target.startswith((f"/memfd:{_TAG}-{pid}-", f"/dev/shm/{_TAG}-{pid}-")):
        raise FileNotFoundError(f"no batch buffer of process {pid} at descriptor {fd}")
    opened = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        st = os.fstat(opened)
        if st.st_ino != inode or st.st_size < nbytes:
            raise FileNotFoundError(
                f"the batch buffer of process {pid} is gone (its descriptor {fd} holds "
                "another file now)"
            )
        mapping = mmap.mmap(opened, nbytes)
    finally:
        os.close(opened)
    return np.frombuffer(mapping, dtype=np.uint8)


class BufferPool:
    """A producer's batch buffers; a batch writes its images into one
    (:class:`BatchBuffer`), which is free again once the training process lets go of the
    batch.

    Args:
        shared: a DataLoader worker's buffers, in segments the training process maps
            (``True``); ``False``: plain memory, for the batches a thread of the training
            process builds (:meth:`BatchBuffer.keep`), reused all the same.
    """

    def __init__(self, *, shared: bool = True) -> None:
        self.pid = os.getpid()
        self.shared = shared
        self.flags_handle: Handle | None = None
        if shared:
            self._flags: _Segment | None = _Segment(SLOTS)  # its descriptor stays open
            self.flags = self._flags.array  # 1: in use by a batch in flight
            self.flags[:] = 0
            self.flags_handle = self._flags.handle
        else:
            self._flags = None
            self.flags = np.zeros(SLOTS, dtype=np.uint8)
        self.buffers: list[_Segment | _Private] = []
        self.made = 0  # buffers allocated in all (reuse shows as few)
        self.hint = 0  # the bytes of the largest batch so far: what a new batch asks for

    def take(self, nbytes: int) -> tuple[int, _Segment | _Private]:
        """A free buffer of at least ``nbytes``, marked in use: its slot (``-1``: one of
        its own, not reused) and its segment."""
        flags = self.flags
        slot = flags[: len(self.buffers)].tobytes().find(0)  # the first free one, or -1
        if slot < 0 and len(self.buffers) < SLOTS:
            slot = len(self.buffers)
            self.buffers.append(self._allocate(nbytes))
        elif slot >= 0 and self.buffers[slot].size < nbytes:
            self.buffers[slot] = self._allocate(nbytes)  # the old one goes with its last user
        if slot < 0:
            self.made += 1
            return slot, _Private(max(1, nbytes))
        flags[slot] = 1
        return slot, self.buffers[slot]

    def nbytes(self) -> int:
        """The memory of the buffers kept."""
        return sum(buffer.size for buffer in self.buffers)

    def free(self, slot: int) -> None:
        """A buffer taken but not sent is free again."""
        if slot >= 0:
            self.flags[slot] = 0

    def _allocate(self, nbytes: int) -> _Segment | _Private:
        size = -(-max(1, nbytes + nbytes // 4) // _GRAIN) * _GRAIN
        self.made += 1
        return _Segment(size) if self.shared else _Private(size)


class BatchBuffer:
    """One batch's images, written into a buffer of ``pool`` as they come (so a stream's
    views can be copied once, straight into shared memory): the buffer grows, into
    another of the pool, when a batch outgrows it; :meth:`wire` hands it over, or
    :meth:`free` gives it back unsent.
    """

    def __init__(self, pool: BufferPool) -> None:
        self.pool = pool
        self.slot = -1
        self.segment: _Segment | _Private | None = None
        self.data: memoryview | None = None  # the buffer's bytes, written through
        self.used = 0

    def put(self, data: Any) -> tuple[int, int]:
        """Copy ``data`` (bytes-like) in; returns where it lies: ``(start, stop)``."""
        start, stop = self.used, self.used + len(data)
        if self.data is None:
            self._grow(stop)
        elif stop > len(self.data):  # twice as large at least: a batch grows a few times
            self._grow(max(stop, 2 * len(self.data)))
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

    def keep(self) -> tuple[npt.NDArray[np.uint8] | None, _Lease | None]:
        """Hand the buffer over within this process (a batch built by a thread of the
        training process): its written bytes and the lease that gives it back to the pool
        once the batch holding both is dropped; ``(None, None)`` (and the buffer given
        back) where no image was put."""
        if self.segment is None:
            self.free()
            return None, None
        self.pool.hint = max(self.pool.hint, self.used)
        data = self.segment.array[: self.used]
        lease = _Lease(self.pool.flags, self.slot)
        self.slot, self.segment, self.data = -1, None, None  # the lease's now
        return data, lease

    def wire(self) -> dict[str, Any] | None:
        """What the training process needs to map the buffer and free it; ``None`` (and
        the buffer given back) when nothing was written."""
        if self.segment is None or not self.used:
            self.free()
            return None
        self.pool.hint = max(self.pool.hint, self.used)
        wire: dict[str, Any] = {"slot": self.slot, "flags": self.pool.flags_handle}
        if isinstance(self.segment, _Segment):
            wire["handle"] = self.segment.handle
        else:  # a buffer of its own: its bytes go in the wire
            wire["data"] = self.segment.array[: self.used]
        self.slot, self.segment, self.data = -1, None, None  # the training process's now
        return wire

    def free(self) -> None:
        """Give the buffer back unsent (a batch abandoned, or regrown elsewhere)."""
        self.pool.free(self.slot)
        self.slot, self.segment, self.data = -1, None, None


class _Lease:
    """Frees a worker's buffer (clears its flag) when the batch that holds it is dropped."""

    __slots__ = ("flags", "slot")

    def __init__(self, flags: npt.NDArray[np.uint8] | None, slot: int) -> None:
        self.flags, self.slot = flags, slot

    def __del__(self) -> None:
        if self.flags is not None and self.slot >= 0:
            self.flags[self.slot] = 0


class BufferViews:
    """The training process's side: each worker's buffers, mapped once and kept (those of
    a worker that was replaced, as DataLoader workers are at a restart, are let go).

    It opens the workers' buffers through ``/proc/PID/fd`` (see the module), forked or
    spawned workers alike.
    """

    def __init__(self) -> None:
        # By worker id: its flags' handle, the flags, and its buffers by slot (the handle
        # and the mapping).
        self._workers: dict[
            int,
            tuple[Handle, npt.NDArray[np.uint8], dict[int, tuple[Handle, npt.NDArray[np.uint8]]]],
        ] = {}

    def open(self, wire: dict[str, Any], worker: int) -> tuple[npt.NDArray[np.uint8], _Lease]:
        """The bytes of the buffer ``wire`` names (sent by ``worker``), and the lease that
        frees it when the batch (which must hold it as long as the bytes are read) is
        dropped."""
        slot: int = wire["slot"]
        if "data" in wire:  # a batch's own buffer, sent in the wire
            return wire["data"], _Lease(None, -1)
        flags_handle: Handle = tuple(wire["flags"])
        known = self._workers.get(worker)
        if known is None or known[0] != flags_handle:
            known = self._workers[worker] = (flags_handle, _attach(flags_handle), {})
        _, flags, mapped = known
        handle: Handle = tuple(wire["handle"])
        buffer = mapped.get(slot)
        if buffer is None or buffer[0] != handle:  # new, or the worker grew it
            buffer = mapped[slot] = (handle, _attach(handle))
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
