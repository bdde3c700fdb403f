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
handshake alone held the training process 10 us an image. The buffers here are torch's
``file_system`` storages (named, reference-counted, unlinked by ``torch_shm_manager`` when
the last process lets go, a crashed one included), whatever the process-wide strategy.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

__all__ = ["BufferPool", "BufferViews", "Handle"]

SLOTS = 128
"""Buffers a worker keeps at most; a batch that finds none free (more in flight than
this) gets a buffer of its own, not reused."""

_GRAIN = 1 << 20  # buffers grow in whole MiB, with a quarter more than asked

Handle = tuple[bytes, bytes, int]
"""A ``file_system`` storage's name: ``(manager handle, segment name, bytes)``."""


def _new(nbytes: int) -> torch.UntypedStorage:
    return torch.UntypedStorage._new_using_filename_cpu(nbytes)


def _handle(storage: torch.UntypedStorage) -> Handle:
    manager, name, size = storage._share_filename_cpu_()
    return bytes(manager), bytes(name), int(size)


def _open(handle: Handle) -> torch.UntypedStorage:
    return torch.UntypedStorage._new_shared_filename_cpu(*handle)


def _array(storage: torch.UntypedStorage) -> npt.NDArray[np.uint8]:
    return torch.empty(0, dtype=torch.uint8).set_(storage).numpy()


class BufferPool:
    """A worker's batch buffers: :meth:`take` one for a batch's bytes, send its
    :meth:`wire` form; it is free again once the training process lets go of the batch."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._flags_storage = _new(SLOTS)
        self.flags = _array(self._flags_storage)  # 1: in use by a batch in flight
        self.flags[:] = 0
        self.flags_handle = _handle(self._flags_storage)
        self.buffers: list[tuple[torch.UntypedStorage, Handle]] = []
        self.made = 0  # buffers allocated in all (reuse shows as few)

    def take(self, nbytes: int) -> tuple[int, npt.NDArray[np.uint8], Handle]:
        """A free buffer of at least ``nbytes``, marked in use: its slot (``-1``: one of
        its own, not reused), its bytes, its handle."""
        flags = self.flags
        slot = next((i for i in range(len(self.buffers)) if flags[i] == 0), -1)
        if slot < 0 and len(self.buffers) < SLOTS:
            slot = len(self.buffers)
            self.buffers.append(self._allocate(nbytes))
        elif slot >= 0 and self.buffers[slot][0].nbytes() < nbytes:
            self.buffers[slot] = self._allocate(nbytes)  # the old one goes with its last user
        if slot < 0:
            storage, handle = self._allocate(nbytes)
            # Dropped here once sent: its count of users keeps it until the training
            # process has mapped it (which takes the count back), as torch's own
            # hand-over of file_system storages does.
            storage._shared_incref()  # type: ignore[no-untyped-call]
        else:
            storage, handle = self.buffers[slot]
            flags[slot] = 1
        return slot, _array(storage), handle

    def _allocate(self, nbytes: int) -> tuple[torch.UntypedStorage, Handle]:
        size = -(-max(1, nbytes + nbytes // 4) // _GRAIN) * _GRAIN
        storage = _new(size)
        self.made += 1
        return storage, _handle(storage)

    def wire(self, slot: int, handle: Handle) -> dict[str, Any]:
        """What the training process needs to map the buffer and free it."""
        return {"slot": slot, "handle": handle, "flags": self.flags_handle, "pid": self.pid}


class _Lease:
    """Frees a worker's buffer (clears its flag) when the batch that holds it is dropped."""

    __slots__ = ("flags", "slot", "storage")

    def __init__(
        self, flags: npt.NDArray[np.uint8], slot: int, storage: torch.UntypedStorage
    ) -> None:
        self.flags, self.slot, self.storage = flags, slot, storage

    def __del__(self) -> None:
        if self.slot >= 0:
            self.flags[self.slot] = 0


class BufferViews:
    """The training process's side: each worker's buffers, mapped once and kept (those of
    a worker that was replaced, as DataLoader workers are at a restart, are let go)."""

    def __init__(self) -> None:
        # By worker id: its flags' segment name, the flags, and its buffers by slot (the
        # segment name and the mapping).
        self._workers: dict[
            int,
            tuple[bytes, npt.NDArray[np.uint8], dict[int, tuple[bytes, torch.UntypedStorage]]],
        ] = {}

    def open(self, wire: dict[str, Any], worker: int) -> tuple[npt.NDArray[np.uint8], _Lease]:
        """The bytes of the buffer ``wire`` names (sent by ``worker``), and the lease that
        frees it when the batch (which must hold it as long as the bytes are read) is
        dropped."""
        flags_handle: Handle = wire["flags"]
        known = self._workers.get(worker)
        if known is None or known[0] != flags_handle[1]:
            known = self._workers[worker] = (flags_handle[1], _array(_open(flags_handle)), {})
        _, flags, mapped = known
        handle: Handle = wire["handle"]
        slot: int = wire["slot"]
        if slot < 0:
            storage = _open(handle)
            storage._shared_decref()  # the sender's count (see BufferPool.take)
        else:
            buffer = mapped.get(slot)
            if buffer is None or buffer[0] != handle[1]:  # new, or the worker grew it
                buffer = mapped[slot] = (handle[1], _open(handle))
            storage = buffer[1]
        return _array(storage), _Lease(flags, slot, storage)

    def forget(self) -> None:
        """Drop every mapping (the workers are gone); batches still held keep theirs."""
        self._workers.clear()
