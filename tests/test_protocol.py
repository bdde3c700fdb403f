"""The engine's wire protocol (asyncstream/engine/_protocol.py), its engine side
(_server.py) driven message by message over a real connection, and the typed statistics
(_stats.py) on an injected clock."""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import pickle
import threading
from multiprocessing.connection import Connection
from pathlib import Path

import pytest

from asyncstream._exceptions import PermanentFetchError
from asyncstream.engine._config import EngineConfig
from asyncstream.engine._protocol import (
    AskStats,
    ChunkFailed,
    ChunkReady,
    ChunksReady,
    Fatal,
    Fetch,
    Hello,
    Release,
    Started,
    Stats,
    Stop,
    with_remote_cause,
)
from asyncstream.engine._ring import Ring, RingError
from asyncstream.engine._server import run_engine
from asyncstream.engine._stats import EngineStats
from asyncstream.stores._retry import RetryPolicy
from asyncstream.stores._store import ChunkRequest

TIMEOUT = 30.0


@pytest.mark.parametrize(
    "message",
    [
        Hello("ring-name", EngineConfig(inflight=3, hedge=False)),
        Fetch([(0, ChunkRequest("file:///a.tar", 0, 10)), (1, ChunkRequest("s3://b/k", 5, 7))]),
        Release(4),
        AskStats(),
        Stop(),
        Started(),
        ChunkReady(7, 2, 1000),
        ChunksReady(((7, 2, 1000), (8, 0, 12)), 32),
        Stats({"chunks": 3, "retries": {"stall": 1}}),
    ],
)
def test_messages_survive_the_pipe(message: object) -> None:
    ours, theirs = multiprocessing.Pipe()
    with ours, theirs:
        ours.send(message)
        got = theirs.recv()
    assert type(got) is type(message)
    assert got == message


def test_errors_travel_with_their_traceback() -> None:
    error = PermanentFetchError("s3://b/k: 404", url="s3://b/k")
    for message in (ChunkFailed(3, error, "Traceback: here"), Fatal(error, "Traceback: here")):
        got = pickle.loads(pickle.dumps(message))
        assert isinstance(got.error, PermanentFetchError)
        assert str(got.error) == str(error)
        raised = with_remote_cause(got.error, got.trace)
        assert "Traceback: here" in str(raised.__cause__)


def _descriptors(name: str) -> int:
    """This process's descriptors of the segment labelled ``name``."""
    found = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # listdir's own descriptor is gone already
            found += os.readlink(f"/proc/self/fd/{fd}") == f"/memfd:{name} (deleted)"
    return found


def _serve(ring: Ring, config: EngineConfig) -> tuple[Connection, threading.Thread]:
    ours, theirs = multiprocessing.Pipe()
    fd = os.dup(ring.fileno())  # the engine's own, as Engine hands it over
    thread = threading.Thread(target=run_engine, args=(theirs, fd, ring.name, config))
    thread.start()
    return ours, thread


def _recv(conn: Connection) -> object:
    assert conn.poll(TIMEOUT), "the engine sent nothing"
    return conn.recv()


def test_the_engine_side_speaks_the_protocol(tmp_path: Path) -> None:
    data = bytes(range(256)) * 40
    shard = tmp_path / "a.tar"
    shard.write_bytes(data)
    url = shard.as_uri()
    ring = Ring.create(2, 4096)
    own = _descriptors(ring.name)  # the ring's, and its mapping's (mmap keeps a duplicate)
    config = EngineConfig(inflight=2, hedge=False, retry=RetryPolicy(max_attempts=2, base_delay=0))
    conn, thread = _serve(ring, config)
    try:
        assert _recv(conn) == Started()
        chunks = [ChunkRequest(url, i * 4096, min(4096, len(data) - i * 4096)) for i in range(3)]
        conn.send(Fetch([(10 + i, c) for i, c in enumerate(chunks)]))
        got: dict[int, ChunkReady] = {}
        while len(got) < 3:
            message = _recv(conn)
            assert isinstance(message, ChunksReady)  # those of one turn of its loop
            assert message.limit == 2
            for rid, slot, nbytes in message.chunks:
                got[rid] = ChunkReady(rid, slot, nbytes)
                ring.take(slot)
                assert bytes(ring.view(slot)[:nbytes]) == data[(rid - 10) * 4096 :][:nbytes]
                ring.release(slot)  # two slots for three chunks: the release is needed
                conn.send(Release(slot))
        assert [got[i].nbytes for i in (10, 11, 12)] == [4096, 4096, len(data) - 8192]
        missing = ChunkRequest((tmp_path / "missing.tar").as_uri(), 0, 10)
        conn.send(Fetch([(13, missing)]))
        failed = _recv(conn)
        assert isinstance(failed, ChunkFailed)
        assert failed.id == 13
        assert "missing.tar" in str(failed.error)
        conn.send(AskStats())
        stats = _recv(conn)
        assert isinstance(stats, Stats)
        assert (stats.stats["chunks"], stats.stats["failed_chunks"]) == (3, 1)
        assert stats.stats["bytes"] == len(data)
        conn.send(Stop())
        thread.join(TIMEOUT)
        assert not thread.is_alive()
        gc.collect()  # (its last views: a mapping holds a descriptor until unmapped)
        assert _descriptors(ring.name) == own  # stopped: the engine let go of its own
        assert ring.free_count() == 2  # the consumer's is its to close
    finally:
        conn.close()
        thread.join(TIMEOUT)
        ring.close()


def test_chunks_read_together_arrive_in_one_message_before_a_failure(tmp_path: Path) -> None:
    """Consecutive chunks of a local file are read as one group, in one turn of the
    engine's loop: their ChunkReady go as one ChunksReady, in order. A failure submitted
    with them comes after them (any other message sends the turn's ready chunks first)."""
    data = bytes(range(256)) * 64
    shard = tmp_path / "a.tar"
    shard.write_bytes(data)
    ring = Ring.create(5, 4096)  # a slot each
    config = EngineConfig(inflight=4, hedge=False, retry=RetryPolicy(max_attempts=1))
    conn, thread = _serve(ring, config)
    try:
        assert _recv(conn) == Started()
        chunks = [ChunkRequest(shard.as_uri(), i * 4096, 4096) for i in range(4)]
        missing = ChunkRequest((tmp_path / "missing.tar").as_uri(), 0, 10)
        conn.send(Fetch([*((i, c) for i, c in enumerate(chunks)), (4, missing)]))
        messages = [_recv(conn), _recv(conn)]
        ready, failed = messages
        assert isinstance(ready, ChunksReady), messages
        assert [(rid, nbytes) for rid, _, nbytes in ready.chunks] == [(i, 4096) for i in range(4)]
        assert len({slot for _, slot, _ in ready.chunks}) == 4
        for rid, slot, nbytes in ready.chunks:
            assert bytes(ring.view(slot)[:nbytes]) == data[rid * 4096 :][:nbytes]
        assert isinstance(failed, ChunkFailed)
        assert failed.id == 4
        conn.send(Stop())
        thread.join(TIMEOUT)
    finally:
        conn.close()
        thread.join(TIMEOUT)
        ring.close()


def test_end_of_file_stops_the_engine_and_frees_the_ring() -> None:
    ring = Ring.create(1, 1024)
    own = _descriptors(ring.name)
    conn, thread = _serve(ring, EngineConfig(inflight=1))
    try:
        assert _recv(conn) == Started()
        assert _descriptors(ring.name) == own + 2  # the engine's, and its mapping's
        conn.close()  # the consumer is gone
        thread.join(TIMEOUT)
        assert not thread.is_alive()
        gc.collect()
        assert _descriptors(ring.name) == own  # the engine's are closed: only ours are left
    finally:
        ring.close()


def test_a_fatal_error_is_sent_before_the_engine_ends() -> None:
    ours, theirs = multiprocessing.Pipe()
    not_a_ring = os.memfd_create("no-such-ring")  # an empty segment: no ring in it
    with ours:
        run_engine(theirs, not_a_ring, "no-such-ring", EngineConfig())
        message = _recv(ours)
    assert isinstance(message, Fatal)
    assert isinstance(message.error, RingError)
    assert "no-such-ring" in str(message.error)
    assert _descriptors("no-such-ring") == 0  # the engine closed the descriptor it was given
    assert "RingError" in message.trace


# -- statistics ----------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def test_statistics_are_built_in_one_place_on_the_injected_clock() -> None:
    clock = Clock()
    stats = EngineStats(limit=8, clock=clock)
    stats.add_inflight(2)  # two downloads for 3 s
    clock.now += 3.0
    stats.add_inflight(-2)  # none for 1 s
    clock.now += 1.0
    stats.handed_over(100, final=False)
    stats.handed_over(50, final=True)
    stats.timed(0.01, 0.5)
    stats.retries.update(["stall", "stall", "slowdown"])
    stats.throttle_cuts += 1
    stats.concurrency_limit_min = 4
    out = stats.as_dict(concurrency_limit=6, store={"transport": "direct"}, endpoints=[], tasks=5)
    assert out["seconds"] == 4.0
    assert out["inflight_mean"] == pytest.approx(1.5)  # 2 x 3 s over 4 s
    assert (out["inflight"], out["inflight_peak"]) == (0, 2)
    assert (out["bytes"], out["chunks"], out["shards"]) == (150, 2, 1)
    assert out["retries"] == {"stall": 2, "slowdown": 1}
    assert out["retries_total"] == 3
    assert (out["throttle_cuts"], out["concurrency_limit_min"], out["concurrency_limit"]) == (
        1,
        4,
        6,
    )
    assert out["first_byte_s"]["p50"] == 0.01
    assert out["chunk_s"]["max"] == 0.5
    assert (out["transport"], out["tasks"]) == ("direct", 5)
    assert "endpoints" not in out  # only with more S3 endpoints
    with_more = stats.as_dict(
        concurrency_limit=6, store={}, endpoints=[{"transport": "aiohttp"}], tasks=5
    )
    assert with_more["endpoints"] == [{"transport": "aiohttp"}]


def test_the_statistics_keep_the_keys_the_stream_and_bench_read() -> None:
    out = EngineStats(limit=8, clock=Clock()).as_dict(
        concurrency_limit=8, store={}, endpoints=[], tasks=1
    )
    assert out["concurrency_limit_min"] == 8
    assert {
        "bytes",
        "chunks",
        "shards",
        "retries",
        "retries_total",
        "failed_chunks",
        "inflight",
        "inflight_peak",
        "inflight_mean",
        "concurrency_limit",
        "concurrency_limit_min",
        "throttle_cuts",
        "hedged",
        "hedge_wins",
        "requests",
        "coalesced_chunks",
        "first_byte_s",
        "chunk_s",
        "seconds",
        "cpu_s",
        "max_rss_bytes",
        "tasks",
    } <= set(out)
