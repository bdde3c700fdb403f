"""The fetch engine's process started ahead of its settings (``asyncstream.engine._launch``):
a stream starts it before it opens its dataset and its first engine adopts it; nobody
else keeps it alive, whatever fails."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest
from _procs import alive, engine_pids, segments

from asyncstream import NotFoundError, ShardStream
from asyncstream.engine._engine import Engine, EngineConfig
from asyncstream.engine._launch import EngineProcess, store_modules
from asyncstream.stores._store import ChunkRequest
from asyncstream.stream import _open

SAMPLES = 6


def write_tar(path: Path, shard: int) -> None:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(SAMPLES):
            data = f"shard {shard} sample {i} ".encode() * (40 + 13 * i)
            info = tarfile.TarInfo(f"{shard:02d}{i:04d}.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    folder = tmp_path_factory.mktemp("launch")
    paths = []
    for shard in range(3):
        path = folder / f"shard-{shard}.tar"
        write_tar(path, shard)
        paths.append(str(path))
    return paths


def our_segments() -> set[str]:
    """The rings this process made that a process still holds (or named in /dev/shm)."""
    return segments((f"asyncstream-{os.getpid()}-",))


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch) -> list[EngineProcess]:
    """The engine processes streams start ahead in this test (real processes, recorded)."""
    started: list[EngineProcess] = []

    class Recorded(EngineProcess):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            started.append(self)

    monkeypatch.setattr(_open, "EngineProcess", Recorded)
    return started


def read_all(engine: Engine, path: str) -> bytes:
    size = os.path.getsize(path)
    (rid,) = engine.submit([ChunkRequest(path, 0, size, None, True, size)])
    ready = engine.wait(rid)
    data = bytes(engine.view(ready))
    engine.release(ready.slot)
    return data


def test_the_first_engine_adopts_the_process_started_at_construction(
    shards: list[str], launched: list[EngineProcess]
) -> None:
    counts = [SAMPLES] * len(shards)
    with ShardStream(shards, samples_per_shard=counts, seed=3) as stream:
        (launch,) = launched
        assert alive(launch.pid)  # started before the first iteration
        samples = iter(stream)
        keys = [next(samples)["__key__"]]
        assert stream._run is not None
        assert stream._run.engine is not None
        assert stream._run.engine.pid == launch.pid  # adopted, not a second process
        assert launch.adopt() is None  # adopted once
        keys += [s["__key__"] for s in samples]
    # The order is the seed's, as with an engine started at the first iteration.
    launched.clear()
    with ShardStream(shards, samples_per_shard=counts, seed=3) as stream:
        launched[0].close()
        assert [s["__key__"] for s in stream] == keys
    assert sorted(keys) == sorted(f"{s:02d}{i:04d}" for s in range(3) for i in range(SAMPLES))


def test_a_failed_open_leaves_no_engine_process_and_no_ring(
    shards: list[str], launched: list[EngineProcess], tmp_path: Path
) -> None:
    before, segments = set(engine_pids()), our_segments()
    missing = str(tmp_path / "missing.tar")
    with pytest.raises(NotFoundError, match=r"missing\.tar"):
        ShardStream([*shards, missing], samples_per_shard=[SAMPLES] * 4)
    (launch,) = launched  # the process was started, before the open failed
    assert not alive(launch.pid)
    assert set(engine_pids()) <= before
    assert our_segments() <= segments


def test_rings_too_large_for_memory_leave_no_engine_process(
    shards: list[str], launched: list[EngineProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Refused after the open, by the check of the node's rings: the process goes too.
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(10**12))
    with pytest.raises(ValueError, match=r"this node's rings .* \d+ MiB of memory needed"):
        ShardStream(shards)
    (launch,) = launched
    assert not alive(launch.pid)


def test_a_stream_closed_unread_kills_its_process(
    shards: list[str], launched: list[EngineProcess]
) -> None:
    stream = ShardStream(shards)
    (launch,) = launched
    assert alive(launch.pid)
    stream.close()
    assert not alive(launch.pid)


def test_a_process_nobody_adopts_exits_after_its_idle_limit(shards: list[str]) -> None:
    launch = EngineProcess(idle_limit=0.01)
    assert launch._proc is not None
    assert launch._proc.wait(timeout=60) == 0  # by itself: nothing stops it
    assert launch.adopt() is None
    # An engine given it starts a process of its own.
    with Engine(EngineConfig(inflight=2), n_slots=2, slot_bytes=1 << 16, process=launch) as e:
        assert e.pid != launch.pid
        assert read_all(e, shards[0]) == Path(shards[0]).read_bytes()


def test_a_process_near_its_idle_limit_is_not_adopted(shards: list[str]) -> None:
    # Its limit is the engine's own; one so close to it that a Hello might meet it on its
    # way out is killed, and the engine starts another.
    launch = EngineProcess(idle_limit=0.0)
    pid = launch.pid
    with Engine(EngineConfig(inflight=2), n_slots=2, slot_bytes=1 << 16, process=launch) as e:
        assert not alive(pid)
        assert e.pid != pid
        assert read_all(e, shards[0]) == Path(shards[0]).read_bytes()


def test_a_preload_that_fails_to_import_is_skipped(shards: list[str]) -> None:
    launch = EngineProcess(["asyncstream_no_such_module", *store_modules(shards)])
    with Engine(EngineConfig(inflight=2), n_slots=2, slot_bytes=1 << 16, process=launch) as e:
        assert e.pid == launch.pid
        assert read_all(e, shards[1]) == Path(shards[1]).read_bytes()


def test_a_thread_engine_closes_the_process_it_does_not_need(shards: list[str]) -> None:
    launch = EngineProcess()
    with Engine(EngineConfig(), n_slots=1, slot_bytes=1 << 16, mode="thread", process=launch) as e:
        assert not alive(launch.pid)
        assert read_all(e, shards[2]) == Path(shards[2]).read_bytes()


def test_store_modules_names_each_schemes_store_and_client_once() -> None:
    assert store_modules(["s3://b/a.tar", "/data/x.tar", "s3://c/", "nope://x", ""]) == (
        "asyncstream.stores._s3store",
        "botocore.session",
        "asyncstream.stores._localstore",
    )
