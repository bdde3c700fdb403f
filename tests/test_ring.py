"""Tests of the shared-memory slot ring: lifecycle, cross-process bytes, cleanup (a ring
has no name: nothing is left once no process holds it)."""

from __future__ import annotations

import gc
import hashlib
import mmap
import multiprocessing
import multiprocessing.connection
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing import reduction
from pathlib import Path

import numpy as np
import pytest
from _procs import segments

from asyncstream._exceptions import AsyncStreamError
from asyncstream.engine import _segment
from asyncstream.engine._ring import Ring, RingError, SlotState

S = SlotState


@pytest.fixture
def ring() -> Iterator[Ring]:
    with Ring.create(4, 10_000) as r:
        yield r


def _held(name: str, pids: set[int] | None = None) -> bool:
    """Whether a live process (of ``pids``, or any) still holds the ring ``name``."""
    return name in segments((name,), pids)


def _wait_gone(name: str, timeout: float = 10.0) -> bool:
    """Poll until no process holds ``name``; False if one still does after ``timeout``."""
    deadline = time.monotonic() + timeout
    while _held(name):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _memfd(size: int) -> int:
    fd = os.memfd_create("foreign")
    os.ftruncate(fd, size)
    return fd


def _drive(ring: Ring, slot: int, state: SlotState) -> None:
    """Move a FREE ``slot`` of a one-slot ring to ``state`` through legal transitions."""
    if state >= S.FILLING:
        assert ring.acquire() == slot
    if state >= S.READY:
        ring.publish(slot)
    if state >= S.IN_USE:
        ring.take(slot)
    assert ring.state(slot) is state


def _pattern(slot: int, n: int) -> np.ndarray:
    return ((np.arange(n) * (slot + 3) + slot) % 251).astype(np.uint8)


# --- lifecycle ----------------------------------------------------------------------------


def test_full_lifecycle(ring: Ring) -> None:
    assert ring.states() == [S.FREE] * 4
    assert ring.acquire() == 0
    assert ring.state(0) is S.FILLING
    ring.publish(0)
    assert ring.state(0) is S.READY
    ring.take(0)
    assert ring.state(0) is S.IN_USE
    ring.release(0)
    assert ring.state(0) is S.FREE
    assert ring.acquire() == 0
    ring.abandon(0)
    assert ring.states() == [S.FREE] * 4
    assert ring.free_count() == 4


def test_acquire_lowest_free_then_none_when_full(ring: Ring) -> None:
    assert [ring.acquire() for _ in range(4)] == [0, 1, 2, 3]
    assert ring.acquire() is None
    assert ring.free_count() == 0
    ring.abandon(2)
    ring.publish(1)
    ring.take(1)
    ring.release(1)
    assert ring.free_count() == 2
    assert ring.acquire() == 1
    assert ring.acquire() == 2
    assert ring.acquire() is None


TRANSITIONS = [("publish", S.FILLING), ("abandon", S.FILLING), ("take", S.READY)]
TRANSITIONS.append(("release", S.IN_USE))


@pytest.mark.parametrize(
    ("method", "expected", "actual"),
    [(m, e, a) for m, e in TRANSITIONS for a in SlotState if a is not e],
)
def test_illegal_transition_raises(method: str, expected: SlotState, actual: SlotState) -> None:
    with Ring.create(1, 64) as ring:
        _drive(ring, 0, actual)
        with pytest.raises(RingError) as info:
            getattr(ring, method)(0)
        msg = str(info.value)
        assert "slot 0" in msg
        assert f"{method}()" in msg
        assert f"expects {expected.name}" in msg
        assert f"is {actual.name}" in msg
        assert ring.state(0) is actual  # unchanged
    assert isinstance(info.value, AsyncStreamError)
    assert isinstance(info.value, RuntimeError)


def test_slot_out_of_range(ring: Ring) -> None:
    with pytest.raises(IndexError, match="slot 4 is out of range"):
        ring.take(4)
    with pytest.raises(IndexError):
        ring.view(-1)


# --- creation and geometry ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n_slots": 0, "slot_bytes": 1}, "n_slots must be between 1 and"),
        ({"n_slots": 1, "slot_bytes": 0}, "slot_bytes must be >= 1, got 0"),
        ({"n_slots": 1 << 20, "slot_bytes": 1 << 30}, "exceeds the limit"),
        ({"n_slots": 1, "slot_bytes": 1, "tag": "a/b"}, "tag must be"),
        ({"n_slots": 1, "slot_bytes": 1, "tag": ""}, "tag must be"),
        ({"n_slots": 1, "slot_bytes": 1, "tag": "x" * 13}, "tag must be"),
    ],
)
def test_create_validates_arguments(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Ring.create(**kwargs)  # type: ignore[arg-type]


def test_create_refuses_more_than_memory_holds_and_says_how_much_to_ask() -> None:
    room = _segment.room()
    assert room is not None
    assert room.where == "memory"  # a memfd: /dev/shm does not bind
    too_many = room.free // (1 << 30) + 2
    with pytest.raises(ValueError, match=r"(\d+) MiB of memory needed, (\d+) MiB left") as info:
        Ring.create(too_many, 1 << 30)
    need, free, more = map(int, re.findall(r"(\d+) MiB", str(info.value))[1:4])
    assert need >= too_many << 10
    assert more == need - free  # the exact size to ask for


def test_without_memfd_a_ring_is_an_unlinked_dev_shm_segment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A kernel (or seccomp filter) without memfd_create: an unlinked POSIX segment, no
    name left; /dev/shm's size binds, and a refusal gives the size to enlarge it to."""
    monkeypatch.delattr(os, "memfd_create")
    with Ring.create(2, 100) as ring:
        assert os.readlink(f"/proc/self/fd/{ring.fileno()}").startswith("/dev/shm/")
        assert ring.name not in os.listdir("/dev/shm")
        assert os.fstat(ring.fileno()).st_nlink == 0
    st = os.statvfs("/dev/shm")
    too_many = st.f_bavail * st.f_frsize // (1 << 30) + 2
    with pytest.raises(ValueError, match=r"in /dev/shm, \d+ MiB free there.*at least (\d+) MiB"):
        Ring.create(too_many, 1 << 30)


def test_geometry_alignment_and_views(ring: Ring) -> None:
    assert (ring.n_slots, ring.slot_bytes) == (4, 10_000)
    assert ring.nbytes == 4096 + 4 * 12288
    for slot in range(4):
        view = ring.view(slot)
        assert (view.nbytes, view.format, view.readonly) == (10_000, "B", False)
        arr = ring.array(slot, 100)
        assert arr.dtype == np.dtype(np.uint8)
        assert arr.shape == (100,)
        assert arr.ctypes.data % 4096 == 0
        view[:3] = b"abc"  # zero-copy: the array sees it
        assert arr[:3].tobytes() == b"abc"
    assert ring.array(0, 0).shape == (0,)
    with pytest.raises(ValueError, match="nbytes must be between 0 and 10000"):
        ring.array(0, 10_001)


def test_names_are_unique_and_short() -> None:
    with Ring.create(1, 1) as a, Ring.create(1, 1) as b:
        assert a.name != b.name
        for r in (a, b):
            assert r.name.startswith(f"asyncstream-{os.getpid()}-")
            assert len(r.name) <= 30
    with Ring.create(1, 1, tag="t.x_1") as c:
        assert c.name.startswith("t.x_1-")


def test_segment_has_no_name_and_stays_in_this_process() -> None:
    with Ring.create(2, 100) as ring:
        st = os.fstat(ring.fileno())
        assert st.st_nlink == 0  # nothing in any folder names it
        assert ring.name not in os.listdir("/dev/shm")
        assert os.readlink(f"/proc/self/fd/{ring.fileno()}") == f"/memfd:{ring.name} (deleted)"
        assert not os.get_inheritable(ring.fileno())  # no child gets it unless handed it


def test_repr(ring: Ring) -> None:
    ring.acquire()
    assert repr(ring) == f"Ring(name={ring.name!r}, n_slots=4, slot_bytes=10000, free=3)"
    ring.close()
    assert repr(ring).endswith("slot_bytes=10000, closed)")


# --- attach -------------------------------------------------------------------------------


def test_attach_in_same_process_from_a_thread(ring: Ring) -> None:
    errors: list[BaseException] = []

    def engine() -> None:
        try:
            with Ring.attach(os.dup(ring.fileno())) as side:
                assert (side.n_slots, side.slot_bytes, side.nbytes) == (4, 10_000, ring.nbytes)
                slot = side.acquire()
                assert slot == 0
                side.view(slot)[:5] = b"hello"
                side.publish(slot)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=engine)
    thread.start()
    thread.join()
    assert not errors
    ring.take(0)
    assert bytes(ring.view(0)[:5]) == b"hello"
    assert ring.free_count() == 3  # the attached side's close left the owner's ring be


def test_attach_bad_descriptor_raises() -> None:
    fd = os.open(os.devnull, os.O_RDONLY)
    os.close(fd)
    with pytest.raises(RingError, match=f"no ring at 'fd {fd}'"):
        Ring.attach(fd)


@pytest.mark.parametrize(("size", "match"), [(8192, "magic"), (16, "magic"), (0, "magic")])
def test_attach_to_foreign_segment_raises_and_closes_it(size: int, match: str) -> None:
    fd = _memfd(size)
    with pytest.raises(RingError, match=f"'foreign' is not a valid ring: {match}"):
        Ring.attach(fd)
    assert not _held("foreign", {os.getpid()})  # the ring owned the descriptor: closed


def test_attach_rejects_bad_geometry_and_states(ring: Ring) -> None:
    raw = mmap.mmap(ring.fileno(), ring.nbytes)
    try:
        raw[64] = 9  # slot 0 state byte
        with pytest.raises(RingError, match="slot state table is corrupt"):
            Ring.attach(os.dup(ring.fileno()))
        raw[64] = 0
        raw[12:16] = (1000).to_bytes(4, "little")  # n_slots
        with pytest.raises(RingError, match="1000 slots of 10000 bytes do not fit"):
            Ring.attach(os.dup(ring.fileno()))
    finally:
        raw.close()


def _engine_child(conn: multiprocessing.connection.Connection) -> None:
    """Spawned engine: receive the ring's descriptor, check the READY slots, then publish
    their digests in a new slot."""
    ring = Ring.attach(reduction.recv_handle(conn))
    assert ring.states() == [S.READY, S.READY, S.READY, S.FREE]
    digests = b""
    for slot in range(3):
        data = ring.array(slot, ring.slot_bytes)
        assert np.array_equal(data, _pattern(slot, ring.slot_bytes))
        digests += hashlib.sha256(data.tobytes()).digest()
    assert ring.acquire() == 3
    ring.view(3)[: len(digests)] = digests
    ring.publish(3)
    ring.close()


def test_bytes_cross_to_a_spawned_process(ring: Ring) -> None:
    for slot in range(3):
        assert ring.acquire() == slot
        ring.array(slot, ring.slot_bytes)[:] = _pattern(slot, ring.slot_bytes)
        ring.publish(slot)
    ctx = multiprocessing.get_context("spawn")
    here, there = ctx.Pipe()
    child = ctx.Process(target=_engine_child, args=(there,))
    child.start()
    reduction.send_handle(here, ring.fileno(), child.pid)  # as an engine gets its ring
    child.join(timeout=60)
    assert child.exitcode == 0
    ring.take(3)
    expected = b"".join(
        hashlib.sha256(_pattern(s, ring.slot_bytes).tobytes()).digest() for s in range(3)
    )
    assert bytes(ring.view(3)[: len(expected)]) == expected
    ring.release(3)
    assert ring.states() == [S.READY, S.READY, S.READY, S.FREE]


# --- close -------------------------------------------------------------------------------------


USES: list[Callable[[Ring], object]] = [
    Ring.acquire,
    Ring.states,
    Ring.free_count,
    lambda r: r.publish(0),
    lambda r: r.abandon(0),
    lambda r: r.take(0),
    lambda r: r.release(0),
    lambda r: r.state(0),
    lambda r: r.view(0),
    lambda r: r.array(0, 1),
]


@pytest.mark.parametrize("use", USES)
def test_use_after_close_raises(use: Callable[[Ring], object]) -> None:
    ring = Ring.create(1, 16)
    ring.close()
    ring.close()  # idempotent
    try:
        with pytest.raises(RingError, match=f"ring '{ring.name}' is closed"):
            use(ring)
        assert (ring.n_slots, ring.slot_bytes) == (1, 16)
    finally:
        ring.close()


def test_close_lets_go_of_the_segment_and_its_descriptor() -> None:
    ring = Ring.create(1, 16)
    fd = ring.fileno()
    assert _held(ring.name, {os.getpid()})
    ring.close()
    assert not _held(ring.name, {os.getpid()})  # no descriptor, no mapping: it is gone
    assert not os.path.exists(f"/proc/self/fd/{fd}") or "memfd" not in os.readlink(
        f"/proc/self/fd/{fd}"
    )
    with pytest.raises(RingError, match="is closed"):
        ring.fileno()


def test_context_manager_closes_both_sides() -> None:
    with Ring.create(1, 16) as ring:
        name = ring.name
        with Ring.attach(os.dup(ring.fileno())) as other:
            other.acquire()
        with pytest.raises(RingError, match="is closed"):
            other.states()
        assert ring.state(0) is S.FILLING
    with pytest.raises(RingError, match="is closed"):
        ring.states()
    assert not _held(name, {os.getpid()})


def test_close_with_live_views_does_not_crash() -> None:
    ring = Ring.create(3, 4096)
    arr = ring.array(0, 16)
    from_view = np.asarray(ring.view(1))
    view = ring.view(2)
    sub = view[10:20]
    arr[:] = 5
    ring.close()
    ring.close()
    with pytest.raises(ValueError, match="released"):
        view[0]
    assert int(arr.sum()) == 80  # still mapped: the arrays keep the mapping alive
    arr[0] = 1
    from_view[:2] = 7
    sub[0] = 3
    assert arr[0] == 1
    assert _held(ring.name, {os.getpid()})  # mapped by the arrays alone
    del arr, from_view, sub, view
    gc.collect()
    assert not _held(ring.name, {os.getpid()})  # unmapped with the last of them


def test_dropping_a_ring_with_live_views_is_quiet() -> None:
    # filterwarnings=error turns an exception ignored in __del__ into a failure.
    ring = Ring.create(2, 64)
    name = ring.name
    arr = ring.array(0, 8)
    view = ring.view(1)
    del ring
    gc.collect()
    arr[:] = 1  # the caller's views stay usable
    view[0] = 2
    assert arr.tolist() == [1] * 8
    del arr, view
    gc.collect()
    assert not _held(name, {os.getpid()})


# --- nothing outlives its processes, in fresh interpreters (stderr captured) -------------

_SCRIPT = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from asyncstream.engine._ring import Ring

    ENGINE = (
        "import os, sys, time\\n"
        "from asyncstream.engine._ring import Ring\\n"
        "ring = Ring.attach(int(sys.argv[1]))\\n"
        "slot = ring.acquire()\\n"
        "ring.view(slot)[:5] = b'hello'\\n"
        "ring.publish(slot)\\n"
        "print('ready', flush=True)\\n"
        "time.sleep(float(sys.argv[2]))\\n"
    )

    ring = Ring.create(2, 4096, tag="tracker")
    engine = subprocess.Popen(
        [sys.executable, "-c", ENGINE, str(ring.fileno()), sys.argv[2]],
        pass_fds=[ring.fileno()], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True,
    )
    assert engine.stdout.readline() == "ready\\n"
    ring.take(0)
    assert bytes(ring.view(0)[:5]) == b"hello"
    print(ring.name, engine.pid, flush=True)
    if sys.argv[1] == "close":
        ring.close()
        engine.wait()
    else:
        time.sleep(60)
    """
)


def _run_script(tmp_path: Path, mode: str, engine_sleep: float) -> subprocess.Popen[str]:
    script = tmp_path / "owner.py"
    script.write_text(_SCRIPT)
    return subprocess.Popen(
        [sys.executable, str(script), mode, str(engine_sleep)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)},
    )


def test_a_ring_handed_to_a_process_is_gone_with_both_quietly(tmp_path: Path) -> None:
    proc = _run_script(tmp_path, "close", 0.5)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    name = out.split()[0]
    assert name.startswith("tracker-")
    assert _wait_gone(name), f"{name} is still held"
    for noise in ("leaked", "KeyError", "Traceback", "Warning"):
        assert noise not in err, err


def test_sigkilled_owner_s_ring_lives_while_its_engine_maps_it_then_is_gone(
    tmp_path: Path,
) -> None:
    proc = _run_script(tmp_path, "kill", 60)
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    assert line, proc.communicate(timeout=60)[1]
    assert line[0].startswith("tracker-")
    name, engine = line[0], int(line[1])
    try:
        assert _held(name, {proc.pid, engine})
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGKILL
        assert _held(name, {engine})  # the engine still maps it: its memory lives on
    finally:
        os.kill(engine, signal.SIGKILL)  # (a real engine sees its pipe close and exits)
    assert _wait_gone(name), f"{name} leaked"
