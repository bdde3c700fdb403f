"""A ring of fixed-size slots in one POSIX shared-memory segment.

The consumer (training) process owns the ring: it creates the segment and finally unlinks it.
The engine (a spawned child process, or a thread) attaches by name, downloads byte ranges into
slots and publishes them; the consumer reads them zero-copy and hands them back::

            engine: acquire()         engine: publish()         consumer: take()
      FREE ─────────────────▶ FILLING ─────────────────▶ READY ─────────────────▶ IN_USE
       ▲ ▲                       │                                                  │
       │ └── engine: abandon() ──┘                                                  │
       └─────────────────────────────── consumer: release() ────────────────────────┘

Each state has one side that may move a slot out of it (the engine owns FREE and FILLING, the
consumer READY and IN_USE), so one engine and one consumer need no lock: a state is one byte
in the shared header and a transition is check-then-store. Several engine threads must
serialize ``acquire()``. A state byte is no notification: say which slot moved over a queue.

Layout: a 64-byte header (magic, version, geometry), one state byte per slot, then the slots,
each starting on a 4096-byte boundary.

Cleanup: ``SharedMemory`` registers the segment with multiprocessing's resource tracker, which
unlinks what is still registered once every process sharing it has exited, SIGKILL included.
Spawned, forked and forkserver children share their parent's tracker, whose registry is a set:
:meth:`Ring.attach` registers again and never unregisters (that would drop the owner's entry).
"""

from __future__ import annotations

import contextlib
import enum
import mmap
import os
import re
import secrets
import struct
import weakref
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory
from types import TracebackType
from typing import TYPE_CHECKING

from asyncstream._exceptions import AsyncStreamError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = [
    "Ring",
    "RingError",
    "SlotState",
    "check_node_room",
    "check_room",
    "local_ranks",
    "shm_free",
]

_MAGIC = b"ASRING\x00\x00"
_VERSION = 1
_HEADER = struct.Struct("<8sIIQ")  # magic, version, n_slots, slot_bytes
_STATES_AT = 64
_ALIGN = 4096
_MAX_SLOTS = 1 << 20
_MAX_BYTES = 1 << 40
_TAG = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]{0,11}")  # "<tag>-<pid>-<8 hex>" <= 30 chars


def shm_free() -> int | None:
    """Bytes free in /dev/shm, or ``None`` where there is none (shared memory lives
    elsewhere there)."""
    if not os.path.isdir("/dev/shm"):
        return None
    st = os.statvfs("/dev/shm")
    return st.f_bavail * st.f_frsize


def check_room(nbytes: int, hint: str = "use fewer or smaller slots") -> None:
    """Refuse a ring larger than the free space in /dev/shm: tmpfs accepts any size, then
    kills the process with SIGBUS at the first write past its end.

    Raises:
        ValueError: with both numbers and the two ways out.
    """
    free = shm_free()
    if free is not None and nbytes > free:
        raise ValueError(
            f"a ring of {nbytes / 2**20:.0f} MiB does not fit the {free / 2**20:.0f} MiB "
            f"free in /dev/shm: {hint}, or enlarge /dev/shm (docker run --shm-size=..., "
            "or a Kubernetes emptyDir with medium: Memory)"
        )


def local_ranks() -> int:
    """Ranks on this node: ``LOCAL_WORLD_SIZE`` (torchrun sets it), else 1."""
    value = os.environ.get("LOCAL_WORLD_SIZE", "")
    return int(value) if value.isdigit() and int(value) > 0 else 1


def check_node_room(ring_bytes: int, workers: int, hint: str) -> int:
    """Refuse rings that /dev/shm cannot hold for every reader of this node, up front.

    Every rank of the node (``LOCAL_WORLD_SIZE``) runs ``max(1, workers)`` readers (the
    rank itself, or each of its DataLoader workers), each with a ring of ``ring_bytes``.
    Checked before any of them allocates, so the node is refused with its total rather
    than by a SIGBUS in whichever reader comes last.

    Returns:
        The node's total ring bytes.

    Raises:
        ValueError: the total does not fit the free space in /dev/shm; the message gives
            ranks, workers, the ring and the total.
    """
    ranks, readers = local_ranks(), max(1, workers)
    total = ranks * readers * ring_bytes
    free = shm_free()
    if free is not None and total > free:
        raise ValueError(
            f"this node's rings need {total / 2**20:.0f} MiB ({ranks} rank(s) x {readers} "
            f"reader(s) x {ring_bytes / 2**20:.0f} MiB) and /dev/shm has "
            f"{free / 2**20:.0f} MiB free: {hint}, or enlarge /dev/shm (docker run "
            "--shm-size=..., or a Kubernetes emptyDir with medium: Memory)"
        )
    return total


class RingError(AsyncStreamError, RuntimeError):
    """An illegal slot transition, a closed ring, or a segment that is gone or is no ring."""


class SlotState(enum.IntEnum):
    """The state of one slot, stored as one byte in the shared header."""

    FREE = 0
    FILLING = 1
    READY = 2
    IN_USE = 3


class _Segment(SharedMemory):
    """``SharedMemory`` that can let go of its mapping while views of it are still alive."""

    _mmap: mmap.mmap | None  # CPython internals (3.8-3.13), declared for the type checker
    _fd: int
    _name: str

    def detach(self) -> None:
        try:
            self.close()
        except BufferError:
            # Views are alive: orphan the mmap (it unmaps itself when the last view dies) so
            # that close() and __del__ never retry it, and close the descriptor now.
            self._mmap = None
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def _layout(n_slots: int, slot_bytes: int) -> tuple[int, int, int]:
    """Return ``(data_offset, stride, total_bytes)`` of a ring of this shape."""
    data_offset = -(-(_STATES_AT + n_slots) // _ALIGN) * _ALIGN
    stride = -(-slot_bytes // _ALIGN) * _ALIGN
    return data_offset, stride, data_offset + n_slots * stride


class Ring:
    """``n_slots`` slots of ``slot_bytes`` each in one shared-memory segment.

    Make one with :meth:`create` (the owner) or :meth:`attach` (the other side). Properties stay
    readable after :meth:`close`; everything else raises :class:`RingError`.
    """

    def __init__(self, shm: _Segment, n_slots: int, slot_bytes: int, *, owner: bool) -> None:
        assert shm.buf is not None
        self._shm, self._buf, self._name, self._owner = shm, shm.buf, shm.name, owner
        self._n_slots, self._slot_bytes = n_slots, slot_bytes
        self._data_offset, self._stride, _ = _layout(n_slots, slot_bytes)
        self._states = shm.buf[_STATES_AT : _STATES_AT + n_slots]
        self._views: list[weakref.ref[memoryview]] = []
        self._prune_at = 64
        self._closed = self._unlinked = False

    @classmethod
    def create(cls, n_slots: int, slot_bytes: int, *, tag: str = "asyncstream") -> Ring:
        """Create a ring, all slots FREE, in a new 0600 segment named ``<tag>-<pid>-<hex>``.

        Args:
            n_slots: number of slots, 1 to 2**20.
            slot_bytes: usable bytes per slot, at least 1.
            tag: name prefix, 1 to 12 characters of ``[A-Za-z0-9_.-]``.

        Raises:
            ValueError: a bad argument, or a ring larger than the free space in /dev/shm.
        """
        if not 1 <= n_slots <= _MAX_SLOTS:
            raise ValueError(f"n_slots must be between 1 and {_MAX_SLOTS}, got {n_slots}")
        if slot_bytes < 1:
            raise ValueError(f"slot_bytes must be >= 1, got {slot_bytes}")
        if not _TAG.fullmatch(tag):
            raise ValueError(f"tag must be 1 to 12 characters of [A-Za-z0-9_.-], got {tag!r}")
        total = _layout(n_slots, slot_bytes)[2]
        if total > _MAX_BYTES:
            raise ValueError(f"a ring of {total} bytes exceeds the limit of {_MAX_BYTES} bytes")
        check_room(total)
        while True:
            name = f"{tag}-{os.getpid()}-{secrets.token_hex(4)}"
            with contextlib.suppress(FileExistsError):
                shm = _Segment(name=name, create=True, size=total)  # SharedMemory uses 0600
                break
        assert shm.buf is not None
        _HEADER.pack_into(shm.buf, 0, _MAGIC, _VERSION, n_slots, slot_bytes)
        return cls(shm, n_slots, slot_bytes, owner=True)

    @classmethod
    def attach(cls, name: str, *, foreign: bool = False) -> Ring:
        """Attach to the ring named ``name``, created by another process or thread.

        Args:
            name: the segment name.
            foreign: the caller is a process that does not share the owner's resource
                tracker (not a multiprocessing child): the segment is then dropped from the
                caller's own tracker, so that its exit does not remove the owner's segment.

        Raises:
            RingError: no segment has this name, or it does not hold a ring of this version.
        """
        try:
            shm = _Segment(name=name)
        except FileNotFoundError as exc:
            msg = f"no ring named {name!r}: the segment is gone or was never created"
            raise RingError(msg) from exc
        if foreign:
            # Python < 3.13 registers attached segments too; this tracker is ours alone.
            resource_tracker.unregister(shm._name, "shared_memory")
        assert shm.buf is not None
        magic, version, n_slots, slot_bytes = b"", 0, 0, 0
        if shm.size >= _STATES_AT:
            magic, version, n_slots, slot_bytes = _HEADER.unpack_from(shm.buf)
        if magic != _MAGIC:
            problem = f"magic {magic!r} is not {_MAGIC!r}"
        elif version != _VERSION:
            problem = f"version {version} is not {_VERSION}"
        elif not (1 <= n_slots <= _MAX_SLOTS and slot_bytes >= 1) or (
            _layout(n_slots, slot_bytes)[2] > shm.size
        ):
            problem = f"{n_slots} slots of {slot_bytes} bytes do not fit in {shm.size} bytes"
        elif max(shm.buf[_STATES_AT : _STATES_AT + n_slots]) > max(SlotState):
            problem = "its slot state table is corrupt"
        else:
            return cls(shm, n_slots, slot_bytes, owner=False)
        shm.detach()
        raise RingError(f"shared memory {name!r} is not a valid ring: {problem}")

    @property
    def name(self) -> str:
        """The segment name, to pass to :meth:`attach`."""
        return self._name

    @property
    def n_slots(self) -> int:
        """Number of slots."""
        return self._n_slots

    @property
    def slot_bytes(self) -> int:
        """Usable bytes per slot."""
        return self._slot_bytes

    @property
    def nbytes(self) -> int:
        """Size of the whole segment, header included."""
        return self._shm.size

    def _check(self, slot: int = 0) -> None:
        if self._closed:
            raise RingError(f"ring {self._name!r} is closed")
        if not 0 <= slot < self._n_slots:
            raise IndexError(f"slot {slot} is out of range for a ring of {self._n_slots} slots")

    def _move(self, slot: int, expected: SlotState, new: SlotState, op: str) -> None:
        self._check(slot)
        actual = SlotState(self._states[slot])
        if actual is not expected:
            raise RingError(
                f"ring {self._name!r} slot {slot}: {op}() expects {expected.name}, "
                f"but the slot is {actual.name}"
            )
        self._states[slot] = new

    def acquire(self) -> int | None:
        """Engine: move the lowest FREE slot to FILLING and return it; None if none is FREE."""
        self._check()
        slot = self._states.tobytes().find(SlotState.FREE)
        if slot >= 0:
            self._states[slot] = SlotState.FILLING
            return slot
        return None

    def publish(self, slot: int) -> None:
        """Engine: FILLING -> READY, once the slot's bytes are written."""
        self._move(slot, SlotState.FILLING, SlotState.READY, "publish")

    def abandon(self, slot: int) -> None:
        """Engine: FILLING -> FREE, after a failed or cancelled download."""
        self._move(slot, SlotState.FILLING, SlotState.FREE, "abandon")

    def take(self, slot: int) -> None:
        """Consumer: READY -> IN_USE, before reading the slot."""
        self._move(slot, SlotState.READY, SlotState.IN_USE, "take")

    def release(self, slot: int) -> None:
        """Consumer: IN_USE -> FREE, once nothing reads the slot any more."""
        self._move(slot, SlotState.IN_USE, SlotState.FREE, "release")

    def state(self, slot: int) -> SlotState:
        """The current state of ``slot``."""
        self._check(slot)
        return SlotState(self._states[slot])

    def states(self) -> list[SlotState]:
        """A snapshot of every slot's state."""
        self._check()
        return [SlotState(b) for b in self._states.tobytes()]

    def free_count(self) -> int:
        """Number of FREE slots."""
        self._check()
        return self._states.tobytes().count(SlotState.FREE)

    def _slice(self, slot: int, nbytes: int) -> memoryview:
        start = self._data_offset + slot * self._stride
        view = self._buf[start : start + nbytes]
        self._views.append(weakref.ref(view))
        if len(self._views) >= self._prune_at:  # forget dead views, amortized O(1)
            self._views = [ref for ref in self._views if ref() is not None]
            self._prune_at = max(64, 2 * len(self._views))
        return view

    def view(self, slot: int) -> memoryview:
        """A writable zero-copy view of all ``slot_bytes`` of ``slot``, released on close."""
        self._check(slot)
        return self._slice(slot, self._slot_bytes)

    def array(self, slot: int, nbytes: int) -> npt.NDArray[np.uint8]:
        """A writable zero-copy ``uint8`` array of the first ``nbytes`` bytes of ``slot``."""
        import numpy as np  # here: the engine's process, which never calls it, starts faster

        self._check(slot)
        if not 0 <= nbytes <= self._slot_bytes:
            raise ValueError(f"nbytes must be between 0 and {self._slot_bytes}, got {nbytes}")
        return np.frombuffer(self._slice(slot, nbytes), dtype=np.uint8)

    def close(self) -> None:
        """Detach from the segment (idempotent); the segment lives on until unlinked.

        Views from :meth:`view` are released. Numpy arrays over the ring that are still alive
        stay valid and keep the mapping; it is unmapped when the last of them dies.
        """
        if self._closed:
            return
        self._closed = True
        views = [ref() for ref in self._views]
        self._views.clear()
        for view in (*views, self._states):
            if view is not None:
                with contextlib.suppress(BufferError):  # exported further: dies with its user
                    view.release()
        self._shm.detach()

    def unlink(self) -> None:
        """Remove the segment, normally the owner's job; idempotent.

        Processes still attached keep their mapping, but no new attach succeeds.
        """
        if not self._unlinked:
            self._unlinked = True
            with contextlib.suppress(FileNotFoundError):  # unlinked by another Ring already
                self._shm.unlink()  # also unregisters it from the resource tracker

    def __enter__(self) -> Ring:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close, and unlink if this side created the ring."""
        self.close()
        if self._owner:
            self.unlink()

    def __del__(self) -> None:
        # Detach but leave live views alone; SharedMemory.__del__ would raise BufferError.
        shm: _Segment | None = getattr(self, "_shm", None)
        if shm is not None:
            shm.detach()

    def __repr__(self) -> str:
        free = "closed" if self._closed else f"free={self.free_count()}"
        return (
            f"Ring(name={self._name!r}, n_slots={self._n_slots}, "
            f"slot_bytes={self._slot_bytes}, {free})"
        )
