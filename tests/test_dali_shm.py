"""The workers' batch buffers (``dali_ops._shm``): reused once the training process lets go
of a batch, never while it holds one; checked in one process, then through real
``StatefulDataLoader`` workers with batches held as DALI holds them."""

from __future__ import annotations

import gc
import os
from collections import deque
from pathlib import Path
from typing import Any

import pytest
from _procs import segments

from asyncstream import LocalS3, S3Options, ShardStream
from asyncstream.testing import generate_imagefolder
from dali_ops._batch import BatchBuilder, EncodedBatch
from dali_ops._feeds import WorkerFeed
from dali_ops._shm import SLOTS, BatchBuffer, BufferPool, BufferViews, _Segment
from dali_ops._workers import make_worker_loader
from tests._foreign import write_foreign_shards

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


def wire(pool: BufferPool, *payloads: bytes) -> dict[str, Any]:
    buffer = BatchBuffer(pool)
    spans = [buffer.put(p) for p in payloads]
    assert spans == [
        (sum(map(len, payloads[:i])), sum(map(len, payloads[: i + 1])))
        for i in range(len(payloads))
    ]
    sent = buffer.wire()
    assert sent is not None
    return sent


def test_a_buffer_is_reused_only_after_its_batch_is_dropped() -> None:
    pool, views = BufferPool(), BufferViews()
    first = wire(pool, b"a" * 1000)
    held, lease = views.open(first, worker=0)
    second = wire(pool, b"b" * 1000)  # the first is held: another buffer
    assert second["slot"] != first["slot"]
    assert bytes(held[:1000]) == b"a" * 1000  # not overwritten
    other, _other_lease = views.open(second, worker=0)
    del held, lease
    gc.collect()
    third = wire(pool, b"c" * 1000)  # the first is free again: reused, mapped already
    assert third["slot"] == first["slot"]
    assert third["handle"] == first["handle"]
    again, _ = views.open(third, worker=0)
    assert bytes(again[:1000]) == b"c" * 1000
    assert bytes(other[:1000]) == b"b" * 1000
    assert pool.made == 2


def test_a_free_buffer_too_small_is_replaced_and_mapped_anew() -> None:
    pool, views = BufferPool(), BufferViews()
    small = wire(pool, b"x" * 10)
    views.open(small, worker=0)  # dropped at once: free
    gc.collect()
    big = wire(pool, b"y" * (3 << 20))
    assert big["slot"] == small["slot"]
    assert big["handle"] != small["handle"]
    data, _ = views.open(big, worker=0)
    assert len(data) >= 3 << 20
    assert bytes(data[: 3 << 20]) == b"y" * (3 << 20)


def test_a_batch_that_outgrows_its_buffer_moves_and_frees_the_first() -> None:
    pool, views = BufferPool(), BufferViews()
    pool.hint = 1 << 20  # a new batch asks for 1 MiB first
    buffer = BatchBuffer(pool)
    first = buffer.put(b"a" * 1000)
    slot = buffer.slot
    second = buffer.put(memoryview(b"b" * (2 << 20)))  # a view, as a stream's iter_views
    assert buffer.slot != slot
    assert pool.flags[slot] == 0  # the first buffer is free again
    data, _ = views.open(buffer.wire() or {}, worker=0)
    assert bytes(data[slice(*first)]) == b"a" * 1000
    assert bytes(data[slice(*second)]) == b"b" * (2 << 20)


def test_a_buffer_not_sent_is_given_back() -> None:
    pool = BufferPool()
    buffer = BatchBuffer(pool)
    buffer.put(b"x" * 10)
    slot = buffer.slot
    assert pool.flags[slot] == 1
    buffer.free()
    assert pool.flags[slot] == 0
    assert BatchBuffer(pool).wire() is None  # nothing written: nothing to send


def test_more_batches_in_flight_than_slots_get_buffers_of_their_own() -> None:
    pool, views = BufferPool(), BufferViews()
    held = [views.open(wire(pool, bytes([i % 256]) * 64), worker=0) for i in range(SLOTS)]
    extra = wire(pool, b"z" * 64)
    assert extra["slot"] == -1
    data, lease = views.open(extra, worker=0)
    assert bytes(data[:64]) == b"z" * 64
    del data, lease
    gc.collect()
    assert pool.flags[:SLOTS].all()  # the held ones stay in use
    assert all(bytes(d[:64]) == bytes([i % 256]) * 64 for i, (d, _) in enumerate(held))


def shm_names(pids: set[int] | None) -> set[str]:
    """The batch buffers made by these processes that a live process (any) still holds,
    or named in /dev/shm: a buffer has no name, so one nobody holds is gone."""
    labels = segments(("asyncstream-batch-",))
    return {n for n in labels if pids is None or int(n.split("-")[2]) in pids}


def _label(handle: tuple[int, int, int, int]) -> str:
    """A buffer's label, read from its descriptor in the process that made it."""
    target = os.readlink(f"/proc/{handle[0]}/fd/{handle[1]}")
    return target.removeprefix("/memfd:").removesuffix(" (deleted)")


def test_buffers_have_no_name_and_go_with_their_last_holder() -> None:
    """A worker keeps each buffer's descriptor while the buffer is in its pool; the
    training process maps it through /proc (keeping only its mapping); a buffer that neither
    side holds any more is gone: nothing to unlink, at an exit or a kill."""
    me = {os.getpid()}
    pool, views = BufferPool(), BufferViews()
    sent = wire(pool, b"n" * 100)
    name, flags = _label(sent["handle"]), _label(pool.flags_handle)
    assert name.startswith(f"asyncstream-batch-{os.getpid()}-")
    assert not [n for n in os.listdir("/dev/shm") if n.startswith("asyncstream-batch-")]
    descriptors = len(os.listdir("/proc/self/fd"))
    data, _lease = views.open(sent, worker=0)
    # The flags and the buffer mapped: each mapping's own (mmap keeps a duplicate), and
    # nothing more (the descriptor opened through /proc is closed).
    assert len(os.listdir("/proc/self/fd")) == descriptors + 2
    assert bytes(data[:100]) == b"n" * 100
    unsent = BatchBuffer(pool)
    unsent.put(b"u")
    assert isinstance(unsent.segment, _Segment)
    never = _label(unsent.segment.handle)
    unsent.free()
    assert {name, flags, never} <= shm_names(me)
    del pool, unsent
    gc.collect()  # the pool's end (a worker's exit): what nobody maps is gone
    assert never not in shm_names(me)
    assert {name, flags} <= shm_names(me)  # still mapped here (the batch, its lease)
    assert bytes(data[:100]) == b"n" * 100
    del data, _lease, views
    gc.collect()
    assert not {name, flags, never} & shm_names(me)


def test_a_replaced_worker_s_buffers_are_let_go() -> None:
    views = BufferViews()
    old, new = BufferPool(), BufferPool()
    views.open(wire(old, b"o" * 10), worker=0)
    views.open(wire(new, b"n" * 10), worker=0)  # the same worker id, a new process
    assert list(views._workers) == [0]
    assert views._workers[0][0] == new.flags_handle


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real JPEGs in shards ``pack`` did not write (``tarfile`` and ``webdataset``), some
    samples straddling the stream's blocks."""
    root = tmp_path_factory.mktemp("dali-shm")
    generate_imagefolder(root / "images", 24, 3, seed=2, workers=1)
    jpgs = [p.read_bytes() for p in sorted((root / "images").rglob("*.jpg"))]
    return write_foreign_shards(root / "shards", 0, counts=[12] * 8, jpgs=jpgs).folder


@pytest.fixture(params=["local", "https"])
def source(
    request: pytest.FixtureRequest, shards: Path, s3_server: LocalS3
) -> tuple[str, S3Options | None]:
    """The shards as local files, or on moto over HTTPS (its backend is shared with the
    plain server the objects are put through)."""
    if request.param == "local":
        return str(shards), None
    client = s3_server.client()
    client.create_bucket(Bucket="dali-shm")
    for path in sorted(shards.glob("*.tar")):
        client.put_object(Bucket="dali-shm", Key=f"s/{path.name}", Body=path.read_bytes())
    tls: LocalS3 = request.getfixturevalue("s3_tls_server")
    return "s3://dali-shm/s/", tls.options()


def test_workers_batches_stay_intact_while_held_and_buffers_are_reused(
    source: tuple[str, S3Options | None],
) -> None:
    """Batches held as DALI and the loader hold them (in flight, then retired) keep their
    bytes while the workers go on building; over three epochs the workers reuse a few
    buffers instead of one per batch."""
    url, s3 = source
    with ShardStream(url, s3=s3, shuffle=False) as plain:
        expected = {(s["__url__"], s["__key__"]): s["jpg"] for s in plain}
    builder = BatchBuilder(
        8, on_error="raise", precheck="markers", image_keys=("jpg",), label_key="cls"
    )
    stream = ShardStream(url, s3=s3, window=4, inflight=2, chunk_bytes=256 << 10, seed=0)
    views = BufferViews()
    loader = make_worker_loader(stream, builder, workers=2, drop_last=False, prefetch=2)
    held: deque[EncodedBatch] = deque(maxlen=5)
    seen, batches, largest, mapped = 0, 0, 0, set()
    try:
        for epoch in range(3):
            stream.set_epoch(epoch)
            feed = WorkerFeed(loader, views)
            while (batch := feed.get()) is not None:
                assert batch.error is None
                batches += bool(batch.keys)
                held.append(batch)
                for old in held:  # every batch still held is as it was sent
                    for url, key, image in zip(old.urls, old.keys, old.images, strict=True):
                        assert bytes(image) == expected[(url, key)]
                seen += len(batch)
                largest = max(largest, sum(len(a) for a in batch.images))
                for worker, (_, _, buffers) in feed.views._workers.items():
                    mapped |= {(worker, handle) for handle, _ in buffers.values()}
            held.clear()
        # Each buffer holds a batch and a quarter, rounded up to whole MiB.
        assert largest <= views.nbytes() <= len(mapped) * (largest * 5 // 4 + (1 << 20))
        views.forget()
    finally:
        loader._iterator._shutdown_workers()  # joins them: their buffers go with them
        loader._iterator = None
        stream.close()
    assert seen == 3 * len(expected)
    workers = {handle[0] for _, handle in mapped}
    assert len(workers) == 2
    # The loops' last values: a batch, its bytes, a worker's flags and mapped buffers.
    old = image = _ = buffers = None
    gc.collect()
    assert not shm_names(workers)  # every buffer gone (the workers exited, forget)
    assert len(mapped) <= 2 * 8 < batches  # a few buffers a worker, not one per batch
    assert views.nbytes() == 0  # let go with the workers (forget)


class _OneBatch:
    """Stands in for the DataLoader: one batch whose buffer a worker made, then let go
    of at its exit before the training process mapped it."""

    def __init__(self, wire: dict[str, Any]) -> None:
        self.wire = wire

    def state_dict(self) -> dict[str, Any]:
        return {}

    def __iter__(self) -> Any:
        return iter([self.wire])


def test_a_batch_whose_buffer_is_gone_is_a_clear_error_in_its_turn() -> None:
    pool = BufferPool()
    buffer = BatchBuffer(pool)
    span = buffer.put(b"\xff\xd8\xff" + b"x" * 10)
    sent = buffer.wire()
    assert sent is not None
    del pool, buffer  # the worker's exit: its descriptors close, nobody maps the buffer
    gc.collect()
    wire = {
        "buffer": sent,
        "spans": [span],
        "keys": ["k"],
        "urls": ["u"],
        "labels": [0],
        "metas": [None],
        "skipped": [],
        "error": None,
        "trace": None,
        "dropped": 0,
        "worker": 3,
        "stats": None,
    }
    feed = WorkerFeed(_OneBatch(wire), BufferViews())  # type: ignore[arg-type]
    batch = feed.get()
    assert batch is not None
    assert isinstance(batch.error, RuntimeError)
    assert "worker 3" in str(batch.error)
    assert "gone" in str(batch.error)
    assert feed.get() is None  # nothing after it


def test_a_wire_naming_anything_but_a_worker_s_buffer_is_refused(tmp_path: Path) -> None:
    """The training process opens a worker's descriptor through /proc: only a batch buffer
    of that very process, with the inode the wire names, is mapped."""
    secret = tmp_path / "secret"
    secret.write_bytes(b"s" * 4096)
    views = BufferViews()
    with secret.open("r+b") as f:
        st = os.fstat(f.fileno())
        other = (os.getpid(), f.fileno(), st.st_ino, 4096)
        with pytest.raises(FileNotFoundError, match="no batch buffer"):
            views.open({"slot": 0, "handle": other, "flags": other}, worker=0)
    pool = BufferPool()
    sent = wire(pool, b"x" * 10)
    pid, fd, inode, size = sent["handle"]
    with pytest.raises(FileNotFoundError, match="gone"):  # another buffer's inode
        views.open({**sent, "handle": (pid, fd, inode + 1, size)}, worker=1)


_KILLED = """
import os, signal, sys
from asyncstream import ShardStream
from dali_ops import DALIImageLoader

stream = ShardStream(sys.argv[1], window=2)
loader = DALIImageLoader(stream, 8, 64, device="cpu", workers=int(sys.argv[2]))
batches = iter(loader)
next(batches)
next(batches)
print("read", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_a_sigkilled_training_process_leaves_no_resource_tracker_noise(
    tmp_path: Path, workers: int
) -> None:
    """Killed mid-epoch, nothing is left for multiprocessing's resource tracker to clean
    up or complain of (``leaked shared_memory``, a ``KeyError`` traceback): rings and batch
    buffers are memfd segments, registered with no tracker, gone with their last holder."""
    import signal
    import subprocess
    import sys

    from asyncstream import pack

    generate_imagefolder(tmp_path / "images", 32, 4, seed=0, workers=1)
    pack(tmp_path / "images", tmp_path / "shards", shard_samples=8, workers=1)
    script = tmp_path / "train.py"
    script.write_text(_KILLED)
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "shards"), str(workers)],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": str(root)},
        check=False,
    )
    assert done.stdout.split() == ["read"], done.stderr
    assert done.returncode == -signal.SIGKILL
    for noise in ("leaked", "resource_tracker", "KeyError", "Traceback"):
        assert noise not in done.stderr, done.stderr
