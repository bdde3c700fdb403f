"""A ring of fixed-size slots in one shared-memory segment that has no name.

The consumer (training) process owns the ring: it creates the segment (:mod:`._segment`: a
memfd where the kernel has them, so a container's small /dev/shm does not bind) and hands
its file descriptor to the engine (a child process: over their connection, ``SCM_RIGHTS``;
or a thread: a duplicate), which maps it, downloads byte ranges into slots and publishes
them; the consumer reads them zero-copy and hands them back::

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

Cleanup: the segment has no name, so nothing is left to remove: its memory goes with the
last descriptor and mapping of it, whichever process holds them, on a close, an exception or
a SIGKILL alike. The engine reaches this segment only through the descriptor it was given.
"""

from __future__ import annotations

import contextlib
import enum
import mmap
import os
import re
import struct
import weakref
from types import TracebackType
from typing import TYPE_CHECKING

from asyncstream._exceptions import AsyncStreamError

from ._segment import check, create, shm_free

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


def check_room(nbytes: int, hint: str = "use fewer or smaller slots") -> None:
    """Refuse a ring larger than the memory its segment can take (see
    :func:`~._segment.check`): a write past it is a SIGBUS (/dev/shm) or the OOM killer.

    Raises:
        ValueError: with both numbers, the size to ask for and the ways out.
    """
    check(nbytes, f"a ring of {-(-nbytes // 2**20)} MiB", hint)


def local_ranks() -> int:
    """Ranks on this node: ``LOCAL_WORLD_SIZE`` (torchrun sets it), else 1."""
    value = os.environ.get("LOCAL_WORLD_SIZE", "")
    return int(value) if value.isdigit() and int(value) > 0 else 1


def check_node_room(ring_bytes: int, workers: int, hint: str) -> int:
    """Refuse rings that this node cannot hold for every reader, up front.

    Every rank of the node (``LOCAL_WORLD_SIZE``) runs ``max(1, workers)`` readers (the
    rank itself, or each of its DataLoader workers), each with a ring of ``ring_bytes``.
    Checked before any of them allocates, so the node is refused with its total rather
    than by a SIGBUS or the OOM killer in whichever reader comes last.

    Returns:
        The node's total ring bytes.

    Raises:
        ValueError: the total does not fit the memory segments can take (the machine's or
            the container's; /dev/shm where there is no memfd); the message gives ranks,
            workers, the ring, the total and the size to ask for.
    """
    ranks, readers = local_ranks(), max(1, workers)
    total = ranks * readers * ring_bytes
    what = (
        f"this node's rings ({ranks} rank(s) x {readers} reader(s) x {ring_bytes / 2**20:.0f} MiB)"
    )
    check(total, what, hint)
    return total


class RingError(AsyncStreamError, RuntimeError):
    """An illegal slot transition, a closed ring, or a descriptor that holds no ring."""


def _label(fd: int) -> str:
    """The name a segment shows in ``/proc/self/fd`` (``/memfd:<name> (deleted)``), or
    ``""`` where it cannot be read."""
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""
    target = target.removesuffix(" (deleted)")
    return target.removeprefix("/memfd:").removeprefix("/dev/shm/")


class SlotState(enum.IntEnum):
    """The state of one slot, stored as one byte in the shared header."""

    FREE = 0
    FILLING = 1
    READY = 2
    IN_USE = 3


def _unmap(mapping: mmap.mmap) -> None:
    """Unmap now, or, while views of it are alive, when the last of them dies."""
    with contextlib.suppress(BufferError):
        mapping.close()


def _layout(n_slots: int, slot_bytes: int) -> tuple[int, int, int]:
    """Return ``(data_offset, stride, total_bytes)`` of a ring of this shape."""
    data_offset = -(-(_STATES_AT + n_slots) // _ALIGN) * _ALIGN
    stride = -(-slot_bytes // _ALIGN) * _ALIGN
    return data_offset, stride, data_offset + n_slots * stride


class Ring:
    """``n_slots`` slots of ``slot_bytes`` each in one shared-memory segment.

    Make one with :meth:`create` (the owner) or :meth:`attach` (the other side, given a
    descriptor of it: :meth:`fileno`). Properties stay readable after :meth:`close`;
    everything else raises :class:`RingError`.
    """

    def __init__(
        self, fd: int, mapping: mmap.mmap, name: str, n_slots: int, slot_bytes: int
    ) -> None:
        self._fd, self._name = fd, name
        self._mapping: mmap.mmap | None = mapping
        self._buf = memoryview(mapping)
        self._size = len(mapping)
        self._n_slots, self._slot_bytes = n_slots, slot_bytes
        self._data_offset, self._stride, _ = _layout(n_slots, slot_bytes)
        self._states = self._buf[_STATES_AT : _STATES_AT + n_slots]
        self._views: list[weakref.ref[memoryview]] = []
        self._prune_at = 64
        self._closed = False

    @classmethod
    def create(cls, n_slots: int, slot_bytes: int, *, tag: str = "asyncstream") -> Ring:
        """Create a ring, all slots FREE, in a new segment (0600, no name anywhere: see
        :mod:`._segment`) labelled ``<tag>-<pid>-<hex>``.

        Args:
            n_slots: number of slots, 1 to 2**20.
            slot_bytes: usable bytes per slot, at least 1.
            tag: label prefix, 1 to 12 characters of ``[A-Za-z0-9_.-]``.

        Raises:
            ValueError: a bad argument, or a ring larger than the memory its segment can
                take (the message says how much to ask for).
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
        fd = create(tag, total)
        try:
            mapping = mmap.mmap(fd, total)
        except BaseException:
            os.close(fd)
            raise
        _HEADER.pack_into(mapping, 0, _MAGIC, _VERSION, n_slots, slot_bytes)
        name = _label(fd) or f"{tag}-{os.getpid()}"
        return cls(fd, mapping, name, n_slots, slot_bytes)

    @classmethod
    def attach(cls, fd: int, name: str = "") -> Ring:
        """Attach to a ring created by another process or thread, given a descriptor of
        its segment, which the ring then owns (closed with it, or here on an error).

        Args:
            fd: a descriptor of the segment (received, or a duplicate of :meth:`fileno`).
            name: the ring's label, for messages (default: read from the descriptor).

        Raises:
            RingError: the descriptor is no segment, or it does not hold a ring of this
                version.
        """
        name = name or _label(fd) or f"fd {fd}"
        try:
            size = os.fstat(fd).st_size
            mapping = mmap.mmap(fd, size) if size else None
        except (OSError, ValueError) as exc:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise RingError(f"no ring at {name!r}: {exc}") from exc
        magic, version, n_slots, slot_bytes = b"", 0, 0, 0
        if mapping is not None and size >= _STATES_AT:
            magic, version, n_slots, slot_bytes = _HEADER.unpack_from(mapping)
        if magic != _MAGIC:
            problem = f"magic {magic!r} is not {_MAGIC!r}"
        elif version != _VERSION:
            problem = f"version {version} is not {_VERSION}"
        elif not (1 <= n_slots <= _MAX_SLOTS and slot_bytes >= 1) or (
            _layout(n_slots, slot_bytes)[2] > size
        ):
            problem = f"{n_slots} slots of {slot_bytes} bytes do not fit in {size} bytes"
        elif max(mapping[_STATES_AT : _STATES_AT + n_slots]) > max(SlotState):  # type: ignore[index]
            problem = "its slot state table is corrupt"
        else:
            assert mapping is not None
            return cls(fd, mapping, name, n_slots, slot_bytes)
        if mapping is not None:
            mapping.close()
        os.close(fd)
        raise RingError(f"shared memory {name!r} is not a valid ring: {problem}")

    def fileno(self) -> int:
        """The segment's descriptor here, to hand to the engine (``SCM_RIGHTS``, or a
        duplicate for a thread): the one way to reach this ring."""
        if self._fd < 0:
            raise RingError(f"ring {self._name!r} is closed")
        return self._fd

    @property
    def name(self) -> str:
        """The segment's label (``<tag>-<pid>-<hex>``, as ``/proc/PID/fd`` shows it):
        for messages and leak checks; the segment itself is reached by descriptor."""
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
        return self._size

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
        """Let go of the segment here (idempotent): its mapping and descriptor. The memory
        goes with the last descriptor and mapping of it, in whichever process.

        Views from :meth:`view` are released. Numpy arrays over the ring that are still alive
        stay valid and keep the mapping; it is unmapped when the last of them dies.
        """
        if self._closed:
            return
        self._closed = True
        views = [ref() for ref in self._views]
        self._views.clear()
        for view in (*views, self._states, self._buf):
            if view is not None:
                with contextlib.suppress(BufferError):  # exported further: dies with its user
                    view.release()
        self._let_go()

    def _let_go(self) -> None:
        mapping, self._mapping = self._mapping, None
        if mapping is not None:
            _unmap(mapping)  # or, orphaned here, when the last view of it dies
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def __enter__(self) -> Ring:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close."""
        self.close()

    def __del__(self) -> None:
        # Let go but leave live views alone (they keep the mapping until they die).
        if hasattr(self, "_fd"):
            self._let_go()

    def __repr__(self) -> str:
        free = "closed" if self._closed else f"free={self.free_count()}"
        return (
            f"Ring(name={self._name!r}, n_slots={self._n_slots}, "
            f"slot_bytes={self._slot_bytes}, {free})"
        )
