"""Tests of the shared-memory slot ring: lifecycle, cross-process bytes, cleanup."""

from __future__ import annotations

import gc
import hashlib
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path

import numpy as np
import pytest

from asyncstream._exceptions import AsyncStreamError
from asyncstream.engine._ring import Ring, RingError, SlotState

S = SlotState
HAS_DEV_SHM = os.path.isdir("/dev/shm")
needs_dev_shm = pytest.mark.skipif(not HAS_DEV_SHM, reason="needs /dev/shm (Linux)")


@pytest.fixture
def ring() -> Iterator[Ring]:
    with Ring.create(4, 10_000) as r:
        yield r


def _shm_path(name: str) -> Path:
    return Path("/dev/shm") / name


def _wait_gone(path: Path, timeout: float = 10.0) -> bool:
    """Poll until ``path`` does not exist; False if it still does after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


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


@needs_dev_shm
def test_create_refuses_more_than_dev_shm_holds() -> None:
    st = os.statvfs("/dev/shm")
    too_many = st.f_bavail * st.f_frsize // (1 << 30) + 2
    with pytest.raises(ValueError, match="free in /dev/shm"):
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


@needs_dev_shm
def test_segment_is_owner_only() -> None:
    with Ring.create(2, 100) as ring:
        st = os.stat(_shm_path(ring.name))
        assert st.st_mode & 0o777 == 0o600
        assert st.st_uid == os.getuid()


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
            with Ring.attach(ring.name) as side:
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
    if HAS_DEV_SHM:
        assert _shm_path(ring.name).exists()  # the attached side's __exit__ did not unlink


def test_attach_missing_name_raises() -> None:
    name = "asyncstream-nope-00000000"
    with pytest.raises(RingError, match=f"no ring named '{name}'"):
        Ring.attach(name)


@pytest.mark.parametrize(("size", "match"), [(8192, "magic"), (16, "magic")])
def test_attach_to_foreign_segment_raises(size: int, match: str) -> None:
    foreign = SharedMemory(create=True, size=size)
    try:
        with pytest.raises(RingError, match=f"'{foreign.name}' is not a valid ring: {match}"):
            Ring.attach(foreign.name)
    finally:
        foreign.close()
        foreign.unlink()


def test_attach_rejects_bad_geometry_and_states(ring: Ring) -> None:
    raw = SharedMemory(name=ring.name)
    try:
        assert raw.buf is not None
        raw.buf[64] = 9  # slot 0 state byte
        with pytest.raises(RingError, match="slot state table is corrupt"):
            Ring.attach(ring.name)
        raw.buf[64] = 0
        raw.buf[12:16] = (1000).to_bytes(4, "little")  # n_slots
        with pytest.raises(RingError, match="1000 slots of 10000 bytes do not fit"):
            Ring.attach(ring.name)
    finally:
        raw.close()


def _engine_child(name: str) -> None:
    """Spawned engine: check the READY slots, then publish their digests in a new slot."""
    ring = Ring.attach(name)
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
    child = multiprocessing.get_context("spawn").Process(target=_engine_child, args=(ring.name,))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0
    ring.take(3)
    expected = b"".join(
        hashlib.sha256(_pattern(s, ring.slot_bytes).tobytes()).digest() for s in range(3)
    )
    assert bytes(ring.view(3)[: len(expected)]) == expected
    ring.release(3)
    assert ring.states() == [S.READY, S.READY, S.READY, S.FREE]


# --- close and unlink ---------------------------------------------------------------------


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
        ring.unlink()


@needs_dev_shm
def test_unlink_removes_segment_idempotently() -> None:
    ring = Ring.create(1, 16)
    path = _shm_path(ring.name)
    assert path.exists()
    ring.unlink()
    assert not path.exists()
    ring.unlink()
    with pytest.raises(RingError, match="no ring named"):
        Ring.attach(ring.name)
    ring.close()


def test_context_manager_closes_and_unlinks() -> None:
    with Ring.create(1, 16) as ring:
        name = ring.name
        with Ring.attach(name) as other:
            other.acquire()
        with pytest.raises(RingError, match="is closed"):
            other.states()
        assert ring.state(0) is S.FILLING
    with pytest.raises(RingError, match="is closed"):
        ring.states()
    with pytest.raises(RingError, match="no ring named"):
        Ring.attach(name)


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
    ring.unlink()
    if HAS_DEV_SHM:
        assert not _shm_path(ring.name).exists()
    assert arr[0] == 1
    del arr, from_view, sub, view
    gc.collect()


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
    del arr, view
    gc.collect()
    with Ring.attach(name) as again:
        assert again.array(0, 8).tolist() == [1] * 8
        again.unlink()


# --- resource tracker, in fresh interpreters (their own tracker, stderr captured) ---------

_SCRIPT = textwrap.dedent(
    """
    import multiprocessing, os, signal, sys, time
    from asyncstream.engine._ring import Ring

    def engine(name):
        ring = Ring.attach(name)
        slot = ring.acquire()
        ring.view(slot)[:5] = b"hello"
        ring.publish(slot)
        ring.close()

    def owner(conn):
        ring = Ring.create(1, 4096, tag="orphan")
        conn.send(ring.name)
        time.sleep(60)

    if __name__ == "__main__":
        ctx = multiprocessing.get_context("spawn")
        if sys.argv[1] == "child-owner":
            here, there = ctx.Pipe()
            child = ctx.Process(target=owner, args=(there,))
            child.start()
            name = here.recv()
            os.kill(child.pid, signal.SIGKILL)
            child.join()
            print(name, os.path.exists("/dev/shm/" + name), flush=True)
            sys.exit(0)
        ring = Ring.create(2, 4096, tag="tracker")
        child = ctx.Process(target=engine, args=(ring.name,))
        child.start()
        child.join()
        assert child.exitcode == 0
        ring.take(0)
        assert bytes(ring.view(0)[:5]) == b"hello"
        print(ring.name, flush=True)
        if sys.argv[1] == "unlink":
            ring.close()
            ring.unlink()
        else:
            time.sleep(60)
    """
)


def _run_script(tmp_path: Path, mode: str) -> subprocess.Popen[str]:
    script = tmp_path / "owner.py"
    script.write_text(_SCRIPT)
    return subprocess.Popen(
        [sys.executable, str(script), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@needs_dev_shm
def test_attach_in_spawned_child_then_unlink_is_quiet(tmp_path: Path) -> None:
    proc = _run_script(tmp_path, "unlink")
    out, err = proc.communicate(timeout=60)  # EOF only once the tracker has exited too
    assert proc.returncode == 0, err
    assert not _shm_path(out.strip()).exists()
    for noise in ("leaked", "KeyError", "Traceback", "Warning"):
        assert noise not in err, err


@needs_dev_shm
def test_sigkilled_owner_segment_is_removed_by_tracker(tmp_path: Path) -> None:
    # A spawned engine attached and exited first: had it unregistered, this would leak.
    proc = _run_script(tmp_path, "kill")
    assert proc.stdout is not None
    name = proc.stdout.readline().strip()
    assert name.startswith("tracker-"), proc.communicate(timeout=60)[1]
    assert _shm_path(name).exists()
    proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert _wait_gone(_shm_path(name), timeout=10.0), f"{name} leaked; tracker said: {err}"
    assert "leaked shared_memory" in err  # it was the tracker that removed it
    assert "KeyError" not in err


@needs_dev_shm
def test_sigkilled_spawned_child_owner_is_removed_when_tree_exits(tmp_path: Path) -> None:
    # A spawned child shares its parent's tracker: its segment outlives its SIGKILL and is
    # removed once the parent (the last process holding the tracker) exits.
    proc = _run_script(tmp_path, "child-owner")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    name, existed_after_kill = out.split()
    assert name.startswith("orphan-")
    assert existed_after_kill == "True"
    assert _wait_gone(_shm_path(name), timeout=10.0), f"{name} leaked; tracker said: {err}"
    assert "leaked shared_memory" in err
