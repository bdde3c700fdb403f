"""ShardStream against the real S3 server: exactly once, determinism, exact resume."""

from __future__ import annotations

import contextlib
import copy as copy_module
import functools
import gc
import json
import multiprocessing
import os
import pickle
import random
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _jpegs import jpeg_of
from _procs import alive, segments
from torch.utils.data import DataLoader

from asyncstream import (
    CorruptTarError,
    DataError,
    EngineError,
    LocalS3,
    S3Options,
    ShardStream,
    StateError,
    pack,
)
from asyncstream.engine._segment import room
from asyncstream.testing import FaultPlan, FaultProxy
from tests._foreign import write_foreign_shards

CHUNK = 4096  # small chunks: many per shard, samples straddling their ends


def make_tree(root: Path, n: int, classes: int, seed: int) -> None:
    rng = random.Random(seed)
    for i in range(n):
        folder = root / f"c{i % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        size = rng.choice([60, 300, 900, 2500, 5000, 9000])  # some bigger than a chunk
        (folder / f"img{i:04d}.jpg").write_bytes(jpeg_of(rng, size))


@pytest.fixture(scope="module")
def dataset(s3_server: LocalS3, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """120 samples (divisible by 1, 2, 3, 4, 6) in 11 shards of uneven sample counts."""
    root = tmp_path_factory.mktemp("stream")
    make_tree(root / "src", 120, 5, seed=1)
    client = s3_server.client()
    client.create_bucket(Bucket="stream-data")
    options = s3_server.options()
    result = pack(
        root / "src",
        "s3://stream-data/train/",
        shard_bytes=40_000,
        shuffle_seed=3,
        options=options,
    )
    assert len(result.shards) >= 8
    assert len({s.samples for s in result.shards}) > 1  # uneven
    keys = {f"{i:06d}" for i in range(120)}
    return {"url": "s3://stream-data/train/", "options": options, "keys": keys, "root": root}


def stream(dataset: dict[str, Any], **kwargs: Any) -> ShardStream:
    base: dict[str, Any] = {
        "s3": dataset["options"],
        "chunk_bytes": CHUNK,
        "window": 4,
        "inflight": 3,
    }
    base.update(kwargs)
    return ShardStream(dataset["url"], **base)


def keys_of(samples: Any) -> list[str]:
    return [s["__key__"] for s in samples]


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_exactly_once_over_three_epochs(
    dataset: dict[str, Any], world_size: int, num_workers: int
) -> None:
    orders = []
    for epoch in range(3):
        seen: list[str] = []
        per_rank = []
        for rank in range(world_size):
            with stream(dataset, rank=rank, world_size=world_size) as s:
                s.set_epoch(epoch)
                loader = DataLoader(s, batch_size=None, num_workers=num_workers)
                got = keys_of(loader)
            per_rank.append(len(got))
            seen.extend(got)
        assert Counter(seen) == Counter(dataset["keys"])  # the union, no duplicates
        assert per_rank == [120 // world_size] * world_size  # equal steps on every rank
        orders.append(seen)
    assert orders[0] != orders[1] != orders[2]


def test_samples_carry_their_bytes_and_shard(dataset: dict[str, Any]) -> None:
    src = dataset["root"] / "src"
    files = sorted(p for p in src.rglob("*.jpg"))
    by_bytes = {p.read_bytes(): p for p in files}
    with stream(dataset) as s:
        samples = list(s)
    assert len(samples) == 120
    for sample in samples:
        assert set(sample) == {"__key__", "__url__", "jpg", "cls", "json"}
        assert sample["__url__"].startswith("s3://stream-data/train/shard-")
        source = by_bytes[sample["jpg"]]
        assert int(sample["cls"]) == int(source.parent.name[1:])
        assert json.loads(sample["json"])["source"] == source.relative_to(src).as_posix()


def test_no_shuffle_is_plan_and_shard_order(dataset: dict[str, Any]) -> None:
    with stream(dataset, shuffle=False) as s:
        keys = keys_of(s)
    assert keys == sorted(dataset["keys"])


def test_same_order_whatever_the_network_timing(
    s3_server: LocalS3, dataset: dict[str, Any]
) -> None:
    orders = []
    for proxy_seed in (1, 2):
        plan = FaultPlan(latency=0.3, latency_seconds=0.02, match=".tar")
        with FaultProxy(s3_server.endpoint_url, faults=plan, seed=proxy_seed) as proxy:
            options = S3Options(
                endpoint_url=proxy.endpoint_url, credentials=dataset["options"].credentials
            )
            with stream(dataset, s3=options, seed=7, inflight=6) as s:
                orders.append(keys_of(s))
            assert proxy.stats()["latency"] > 0
    assert orders[0] == orders[1]
    with stream(dataset, seed=7, inflight=1) as s:
        assert keys_of(s) == orders[0]
    # Neither how far ahead it fetches nor hedging and adaptive concurrency change the order.
    with stream(dataset, s3=dataset["options"], seed=7, inflight=2, prefetch=9, hedge=False) as s:
        assert keys_of(s) == orders[0]
        assert s.ring_bytes == (4 + 9) * CHUNK
    with stream(dataset, s3=dataset["options"], seed=7, prefetch=1, adaptive=False) as s:
        assert keys_of(s) == orders[0]
        assert s.ring_bytes == (4 + 1 + 1) * CHUNK  # window, prefetch, the hedge slot


def _resume_in_fresh_process(
    args: tuple[dict[str, Any], dict[str, Any], dict[str, Any]],
) -> list[str]:
    kwargs, options, state = args
    from asyncstream import S3Credentials, S3Options, ShardStream

    creds = S3Credentials(**options.pop("credentials"))
    s3 = S3Options(credentials=creds, **options)
    with ShardStream(kwargs.pop("url"), s3=s3, **kwargs) as s:
        s.load_state_dict(json.loads(json.dumps(state)))
        return [sample["__key__"] for sample in s]


@pytest.mark.parametrize("shuffle", [True, False])
def test_resume_in_a_fresh_process(dataset: dict[str, Any], shuffle: bool) -> None:
    kwargs = {
        "url": dataset["url"],
        "chunk_bytes": CHUNK,
        "window": 4,
        "inflight": 3,
        "shuffle": shuffle,
        "seed": 5,
    }
    s3 = dataset["options"]
    plain_options = {
        "endpoint_url": s3.endpoint_url,
        "credentials": {
            "access_key_id": s3.credentials.access_key_id,
            "secret_access_key": s3.credentials.secret_access_key,
        },
    }
    with stream(dataset, shuffle=shuffle, seed=5) as s:
        s.set_epoch(2)
        reference = keys_of(s)
    points = [0, 1, 13, 57, 119, 120]
    states = {}
    with stream(dataset, shuffle=shuffle, seed=5) as s:
        s.set_epoch(2)
        it = iter(s)
        if 0 in points:
            states[0] = s.state_dict()
        for n in range(1, 121):
            next(it)
            if n in points:
                states[n] = s.state_dict()
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        jobs = [(dict(kwargs), json.loads(json.dumps(plain_options)), states[n]) for n in points]
        results = pool.map(_resume_in_fresh_process, jobs)
    for n, rest in zip(points, results, strict=True):
        assert rest == reference[n:], f"resume after {n} samples"


def test_resume_at_shard_boundaries_in_order(dataset: dict[str, Any]) -> None:
    with stream(dataset, shuffle=False) as s:
        samples = list(s)
    urls = [x["__url__"] for x in samples]
    boundaries = [i for i in range(1, len(urls)) if urls[i] != urls[i - 1]][:3]
    assert boundaries
    for n in boundaries:
        with stream(dataset, shuffle=False) as s:
            it = iter(s)
            for _ in range(n):
                next(it)
            state = s.state_dict()
        with stream(dataset, shuffle=False) as s:
            s.load_state_dict(state)
            assert keys_of(s) == keys_of(samples[n:])


@pytest.fixture
def saved_state(dataset: dict[str, Any]) -> Iterator[dict[str, Any]]:
    with stream(dataset, seed=5) as s:
        it = iter(s)
        for _ in range(10):
            next(it)
        yield s.state_dict()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"seed": 6}, "seed"),
        ({"window": 5}, "window"),
        ({"shuffle": False}, "shuffle"),
        ({"block_bytes": 8192}, "block_bytes=4096"),
    ],
)
def test_state_of_another_configuration_is_refused(
    dataset: dict[str, Any], saved_state: dict[str, Any], change: dict[str, Any], message: str
) -> None:
    kwargs = {"seed": 5, **change}
    with stream(dataset, **kwargs) as s, pytest.raises(StateError, match=message):
        s.load_state_dict(saved_state)


def test_state_of_another_dataset_is_refused(
    dataset: dict[str, Any], saved_state: dict[str, Any], tmp_path: Path
) -> None:
    make_tree(tmp_path / "src", 30, 3, seed=9)
    pack(tmp_path / "src", str(tmp_path / "shards"), shard_samples=10, shard_bytes=None)
    with (
        ShardStream(str(tmp_path / "shards"), chunk_bytes=CHUNK, window=4, inflight=3, seed=5) as s,
        pytest.raises(StateError, match="another dataset"),
    ):
        s.load_state_dict(saved_state)


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda st: st.pop("dataset"),
        lambda st: st.update(version=99),
        lambda st: st["position"].update(draws=-1),
        lambda st: st["position"]["lanes"].append({"piece": "x"}),
        lambda st: st["position"].update(lanes="nope"),
        lambda st: st["position"]["lanes"][0].update(remaining=[10_000]),
        lambda st: st.update(topology=[0, 1]),
    ],
)
def test_corrupted_state_is_refused(
    dataset: dict[str, Any], saved_state: dict[str, Any], corrupt: Any
) -> None:
    state = json.loads(json.dumps(saved_state))
    corrupt(state)

    def load_and_read(s: ShardStream) -> list[dict[str, Any]]:
        s.load_state_dict(state)  # most corruptions are caught here, some on reading
        return list(s)

    with stream(dataset, seed=5) as s, pytest.raises(StateError):
        load_and_read(s)


def test_one_state_of_several_readers_cannot_resume_onto_another_topology(
    dataset: dict[str, Any],
) -> None:
    with stream(dataset, seed=5, rank=0, world_size=2) as s:
        it = iter(s)
        for _ in range(10):
            next(it)
        state = s.state_dict()
    # Rank 0's state alone says nothing of what rank 1 read: a new topology needs both.
    with stream(dataset, seed=5, rank=0, world_size=3) as s:
        s.load_state_dict(state)
        with pytest.raises(StateError, match="missing: rank 1 worker 0"):
            iter(s)
    with stream(dataset, seed=5, rank=1, world_size=2) as s:  # another reader's own state
        s.load_state_dict(state)
        with pytest.raises(StateError, match="no state of this reader"):
            iter(s)


def test_remainder_is_dropped_and_reported(dataset: dict[str, Any]) -> None:
    seen: list[str] = []
    dropped = 0
    for rank in range(7):
        with stream(dataset, rank=rank, world_size=7) as s:
            got = keys_of(s)
            assert len(got) == 120 // 7
            stats = s.stats()
            assert stats["remainder_policy"] == "drop"
            dropped += stats["remainder_samples"]
        seen.extend(got)
    assert dropped == 120 % 7
    assert len(set(seen)) == len(seen) == 120 - dropped


def test_stats_report_the_shuffle_radius(dataset: dict[str, Any]) -> None:
    with stream(dataset, window=4, inflight=3) as s:
        it = iter(s)
        for _ in range(30):
            next(it)
        stats = s.stats()
    assert stats["samples"] == 30
    assert stats["open_shards"] == 4
    assert 0 < stats["shuffle_radius"] <= 120
    assert stats["fetch"]["chunks"] > 0


def test_local_shards(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", 40, 4, seed=2)
    pack(tmp_path / "src", str(tmp_path / "shards"), shard_samples=7, shard_bytes=None)
    with ShardStream(str(tmp_path / "shards"), chunk_bytes=CHUNK, window=3, inflight=2) as s:
        assert sorted(keys_of(s)) == [f"{i:06d}" for i in range(40)]


def test_corrupt_shard_names_shard_and_offset(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", 20, 2, seed=4)
    pack(tmp_path / "src", str(tmp_path / "shards"), shard_samples=10, shard_bytes=None)
    shard = tmp_path / "shards" / "shard-000001.tar"
    data = bytearray(shard.read_bytes())
    offset = 0  # walk to the third member's header and corrupt it
    for _ in range(2):
        size = int(data[offset + 124 : offset + 136].strip(b"\0 ") or b"0", 8)
        offset += 512 + -(-size // 512) * 512
    data[offset + 10] ^= 0xFF
    shard.write_bytes(bytes(data))
    with (
        ShardStream(
            str(tmp_path / "shards"), chunk_bytes=CHUNK, window=2, inflight=2, shuffle=False
        ) as s,
        pytest.raises(CorruptTarError) as info,
    ):
        list(s)
    assert shard.as_uri() in str(info.value)
    assert info.value.offset == offset


def test_wrong_sample_count_is_a_data_error(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", 20, 2, seed=4)
    pack(tmp_path / "src", str(tmp_path / "shards"), shard_samples=10, shard_bytes=None)
    with (
        ShardStream(
            str(tmp_path / "shards"),
            samples_per_shard=[10, 9],
            chunk_bytes=CHUNK,
            window=2,
            inflight=2,
        ) as s,
        pytest.raises(DataError, match="holds 10 samples, but 9"),
    ):
        list(s)


def test_arguments_are_checked(dataset: dict[str, Any]) -> None:
    for kwargs, message in (
        ({"window": 0}, "window"),
        ({"inflight": -1}, "inflight"),
        ({"chunk_bytes": 0}, "chunk_bytes"),
        ({"prefetch": 0}, "prefetch"),
        ({"shuffle_mode": "random"}, "shuffle_mode"),
        ({"remainder": "repeat"}, "remainder"),
        ({"rank": 2, "world_size": 2}, "rank"),
    ):
        with pytest.raises(ValueError, match=message):
            stream(dataset, **kwargs)


def test_engine_is_kept_between_clean_epochs(dataset: dict[str, Any]) -> None:
    with stream(dataset) as s:
        first = keys_of(s)
        run = s._run
        assert run is not None
        engine = run.engine
        assert engine is not None
        assert engine.idle  # every chunk taken, every slot free
        s.set_epoch(1)
        assert s._engine is engine  # handed back to the stream
        second = keys_of(s)
        assert s._run is not None
        assert s._run.engine is engine  # the same process served the second epoch
        assert sorted(first) == sorted(second)
        assert first != second
        s.set_epoch(2)
        it = iter(s)  # abandoned mid-epoch: chunks in flight, slots held
        for _ in range(5):
            next(it)
        s.set_epoch(3)
        assert s._engine is None
        assert engine._closed  # not idle, so it was stopped rather than reused
        assert len(keys_of(s)) == 120
        last = s._run.engine if s._run is not None else None
    assert last is not None
    assert last._closed  # closed with the stream


def worker_orders(dataset: dict[str, Any], epochs: int, **kwargs: Any) -> list[list[str]]:
    """Each epoch's order through 2 fresh (non-persistent) DataLoader workers."""
    orders = []
    for epoch in range(epochs):
        with stream(dataset, **kwargs) as s:
            s.set_epoch(epoch)
            orders.append(keys_of(DataLoader(s, batch_size=None, num_workers=2)))
    return orders


def note_start(starts: Any, worker_id: int) -> None:
    """A worker_init_fn: count this worker's starts and note its pid."""
    starts[2 * worker_id] += 1
    starts[2 * worker_id + 1] = os.getpid()


@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver"])
def test_persistent_workers_follow_set_epoch(dataset: dict[str, Any], context: str) -> None:
    reference = worker_orders(dataset, 2)
    assert reference[0] != reference[1]
    starts = multiprocessing.RawArray("q", 4)
    orders = []
    with stream(dataset) as s:
        loader = DataLoader(
            s,
            batch_size=None,
            num_workers=2,
            persistent_workers=True,
            multiprocessing_context=context,
            worker_init_fn=functools.partial(note_start, starts),
        )
        for epoch in range(2):
            s.set_epoch(epoch)
            orders.append(keys_of(loader))
        del loader  # stops the workers, which close their engines
        gc.collect()
    for order in orders:
        assert Counter(order) == Counter(dataset["keys"])
    assert orders == reference
    assert starts[0] == starts[2] == 1  # the same two workers served both epochs
    workers = [starts[1], starts[3]]
    assert not [pid for pid in workers if alive(pid)]
    prefixes = tuple(f"asyncstream-{pid}-" for pid in workers)
    assert not segments(prefixes)  # their rings: held by no process, named nowhere


def test_state_loaded_before_persistent_workers_start(dataset: dict[str, Any]) -> None:
    with stream(dataset) as s:
        it = iter(s)
        for _ in range(10):
            next(it)
        state = s.state_dict()  # one reader: valid for one DataLoader worker
    with stream(dataset) as s:
        reference = keys_of(s)
        s.set_epoch(1)
        second = keys_of(s)
    for persistent in (False, True):
        with stream(dataset) as s:
            s.load_state_dict(state)
            loader = DataLoader(s, batch_size=None, num_workers=1, persistent_workers=persistent)
            assert keys_of(loader) == reference[10:]
            assert keys_of(loader) == second  # the next epoch: the state was used
            s.set_epoch(1)
            assert keys_of(loader) == second


def test_state_loaded_after_persistent_workers_start_is_refused(dataset: dict[str, Any]) -> None:
    with stream(dataset) as s:
        reference = keys_of(s)
        s.set_epoch(0)
        it = iter(s)
        for _ in range(10):
            next(it)
        state = s.state_dict()
    with stream(dataset) as s:
        loader = DataLoader(s, batch_size=None, num_workers=1, persistent_workers=True)
        assert keys_of(loader) == reference
        s.load_state_dict(state)  # the worker cannot receive it: no silent fresh epoch
        for _ in range(2):
            with pytest.raises(StateError, match="persistent workers"):
                keys_of(loader)
        s.set_epoch(0)  # the state's epoch: kept, so still refused, never a silent epoch
        with pytest.raises(StateError, match="persistent workers"):
            keys_of(loader)
        # A DataLoader started afterwards receives it
        fresh = DataLoader(s, batch_size=None, num_workers=1, persistent_workers=True)
        assert keys_of(fresh) == reference[10:]


def test_copies_are_independent_streams(dataset: dict[str, Any]) -> None:
    with stream(dataset) as s:
        s.set_epoch(3)
        reference = keys_of(s)
        s.set_epoch(2)
        for copy in (pickle.loads(pickle.dumps(s)), copy_module.deepcopy(s)):
            with copy:
                assert copy.epoch == 2
                copy.set_epoch(3)
                assert s.epoch == 2  # a copy's epoch is its own
                assert keys_of(copy) == reference
        assert s.epoch == 2
        it = iter(s)
        for _ in range(7):
            next(it)
        state = s.state_dict()
        s.load_state_dict(state)
        with copy_module.deepcopy(s) as copy:
            assert keys_of(copy) == keys_of(s)  # both resume from the pending state


def heap_descriptors() -> list[str]:
    """This process's descriptors of multiprocessing's shared heap (unlinked files)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile (listdir's own, for one)
            target = os.readlink(f"/proc/self/fd/{fd}")
            if "/pym-" in target:
                found.append(target)
    return found


def test_copies_leak_no_descriptor(dataset: dict[str, Any]) -> None:
    def copies(n: int) -> None:
        for _ in range(n):
            with pickle.loads(pickle.dumps(s)), copy_module.deepcopy(s):
                pass

    with stream(dataset) as s:
        copies(10)
        gc.collect()
        heap = heap_descriptors()
        assert heap  # the shared epoch lives there
        copies(300)
        gc.collect()
        assert heap_descriptors() == heap
    assert all(target.endswith("(deleted)") for target in heap)  # nothing left in /dev/shm
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"pym-{os.getpid()}-")]


def test_a_stream_read_in_this_process_then_by_forked_workers(dataset: dict[str, Any]) -> None:
    """Forked DataLoader workers inherit this process's run and engine (fork copies
    everything): they must leave them alone and start their own."""
    with stream(dataset) as s:
        it = iter(s)
        first = [next(it)["__key__"] for _ in range(5)]  # a look at the data, mid-epoch
        engine = s._run.engine if s._run is not None else None
        assert engine is not None
        assert engine.owned
        by_workers = keys_of(DataLoader(s, batch_size=None, num_workers=2))
        assert Counter(by_workers) == Counter(dataset["keys"])
        rest = keys_of(it)  # this process's run, and its engine, carry on
        assert Counter(first + rest) == Counter(dataset["keys"])
        assert s.stats()["fetch"]["transport"] == "direct"
    assert engine._closed


def test_a_forked_copy_of_an_engine_cannot_be_used_and_closes_harmlessly(
    dataset: dict[str, Any],
) -> None:
    with stream(dataset) as s:
        it = iter(s)
        next(it)
        engine = s._run.engine if s._run is not None else None
        assert engine is not None
        pid = os.fork()
        if pid == 0:  # the child: its copy refuses work, and closing it stops nothing
            code = 1
            try:
                try:
                    engine.stats()
                except EngineError as exc:
                    code = 0 if "forked process" in str(exc) else 2
                engine.close()
                s.close()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        rest = keys_of(it)  # the parent's engine and ring are intact
        assert len(rest) == 119
        assert engine.ring.name in segments((engine.ring.name,), {os.getpid()})


def test_the_ring_is_sized_to_what_the_dataset_can_use(tmp_path: Path) -> None:
    data = write_foreign_shards(tmp_path / "one", 0, counts=[40])
    size = next(data.folder.glob("*.tar")).stat().st_size
    with ShardStream(str(data.folder), samples_per_shard=data.counts, window=64) as s:
        # One shard: at most 3 lanes (not 64), and only as many prefetch slots as chunks.
        assert s.ring_bytes == (3 + 1 + 1) * size
        assert sorted(keys_of(s)) == sorted(data.keys)  # and the epoch is whole


def test_a_ring_that_cannot_fit_memory_is_refused_at_construction(tmp_path: Path) -> None:
    """A ring is a memfd (/dev/shm's size does not bind): refused where the memory its
    segment can take (the machine's, or the container's limit) cannot hold it, with the
    size to ask for."""
    found = room()
    if found is None:
        pytest.skip("the memory free here cannot be read")
    free = found.free
    shard = tmp_path / "huge.tar"
    with shard.open("wb") as f:  # sparse: no disk used, nothing is read at construction
        f.truncate(free + (1 << 30))
    with pytest.raises(
        ValueError, match=r"rings .* \d+ MiB of memory needed, .* at least \d+ MiB more memory"
    ):
        ShardStream(str(shard), samples_per_shard=1, chunk_bytes=free + (1 << 30))


def test_a_node_whose_ranks_rings_cannot_fit_is_refused_up_front(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each rank of the node (torchrun's LOCAL_WORLD_SIZE) runs its own ring: the stream is
    refused when all of them together would not fit, with the total, before any starts."""
    found = room()
    if found is None:
        pytest.skip("the memory free here cannot be read")
    free = found.free
    shard = tmp_path / "shard.tar"
    with shard.open("wb") as f:
        f.truncate(64 << 20)
    options = {"samples_per_shard": 1, "chunk_bytes": 64 << 20, "window": 1, "prefetch": 1}
    with ShardStream(str(shard), **options) as stream:
        ring = stream.ring_bytes  # a few slots of 64 MiB
    ranks = free // ring + 2  # one ring fits; this many do not
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(ranks))
    with pytest.raises(ValueError, match=rf"{ranks} rank\(s\) x 1 reader\(s\) x {ring >> 20} MiB"):
        ShardStream(str(shard), **options)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    with ShardStream(str(shard), **options) as stream:
        assert stream.node_ring_bytes(3, check=False) == 3 * stream.ring_bytes


CLEAN_EXIT = """
import os, sys
from torch.utils.data import DataLoader
from asyncstream import ShardStream
def note(worker):
    os.write(2, f"pid {os.getpid()}\\n".encode())  # one write: lines of processes never mix
if __name__ == "__main__":
    note(None)
    stream = ShardStream(sys.argv[1], samples_per_shard=int(sys.argv[2]), window=2, inflight=2)
    loader = DataLoader(
        stream, batch_size=None, num_workers=2, persistent_workers=True, worker_init_fn=note
    )
    for epoch in range(2):
        stream.set_epoch(epoch)
        n = sum(1 for _ in loader)
    print(n)
"""


def test_a_clean_exit_with_persistent_workers_warns_of_no_leak(tmp_path: Path) -> None:
    """Persistent workers are SIGTERMed by multiprocessing at exit; they close their rings
    first, so the resource tracker has nothing to clean up and says nothing."""
    data = write_foreign_shards(tmp_path / "shards", 0, counts=[30, 30, 30])
    script = tmp_path / "train.py"
    script.write_text(CLEAN_EXIT)
    result = subprocess.run(
        [sys.executable, str(script), str(data.folder), "30"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["90"]
    assert "leaked" not in result.stderr
    assert "Traceback" not in result.stderr
    pids = {line.split()[1] for line in result.stderr.splitlines() if line.startswith("pid ")}
    assert len(pids) == 3  # the script and its two workers, each named in its segments
    assert not segments(tuple(f"asyncstream-{pid}-" for pid in pids))  # held nowhere


def test_the_default_ring_holds_at_most_128_mib_a_reader(tmp_path: Path) -> None:
    """The default ``prefetch`` fills what the window's lanes and the hedge slot leave of
    128 MiB, up to twice the most GETs (a fixed ``inflight``, or auto's ceiling, twice
    where it starts), where that keeps the starting GETs busy; blocks too large for that
    (set by the user, or a loaded state's) get twice the most GETs' worth, as before."""
    for i in range(100):  # sparse: nothing is read at construction
        with (tmp_path / f"s{i:03d}.tar").open("wb") as f:
            f.truncate(8 << 20)
    url, mib = str(tmp_path), 1 << 20

    def ring(**settings: Any) -> tuple[int, int]:
        with ShardStream(url, samples_per_shard=1, **settings) as s:
            return s.ring_bytes // mib, s._settings.prefetch_slots

    # the default, inflight="auto": 64 lanes + 63 ahead + the hedge slot, of 1 MiB; its
    # ceiling (64 GETs) cut to the 63 slots ahead
    assert ring() == ring(inflight="auto", prefetch="auto") == (128, 63)
    with ShardStream(url, samples_per_shard=1) as s:
        engine = s._settings.engine_config(0)
        assert (engine.auto, engine.inflight_start, engine.inflight) == (True, 32, 63)
    assert ring(hedge=False) == (128, 64)
    assert ring(window=16) == (128, 111)  # twice auto's ceiling would not fit: the budget
    assert ring(window=16, inflight=32) == (16 + 64 + 1, 64)  # 2 x inflight fits: no more
    assert ring(inflight=16) == (64 + 32 + 1, 32)
    assert ring(prefetch=10) == (64 + 10 + 1, 10)  # set: as set
    # 8 MiB blocks (the shards' size) of one GET each: 2 x inflight, the budget out of reach
    assert ring(chunk_bytes=16 << 20, inflight=8) == ((64 + 16 + 1) * 8, 16)
    # 8 MiB blocks read as 8 GETs of 1 MiB: 4 blocks keep 32 GETs busy, twice that ahead;
    # under auto, twice its ceiling of 64 GETs
    assert ring(block_bytes=8 << 20, inflight=32) == ((64 + 8 + 1) * 8, 8)
    assert ring(block_bytes=8 << 20) == ((64 + 16 + 1) * 8, 16)
    # a small dataset: fewer lanes leave room for all of 2 x inflight, or the budget
    small = sorted(str(p) for p in tmp_path.glob("s00*.tar"))
    with ShardStream(small, samples_per_shard=1, inflight=32) as s:
        assert (s.ring_bytes // mib, s._settings.prefetch_slots) == (12 + 64 + 1, 64)
    with ShardStream(small, samples_per_shard=1) as s:  # the epoch's 80 chunks, at most
        assert (s.ring_bytes // mib, s._settings.prefetch_slots) == (12 + 80 + 1, 80)
    # 4 MiB GETs: auto from 8 to 16; the budget out of reach, 2 x 16 blocks ahead as before
    assert ring(inflight="auto", chunk_bytes=4 << 20) == ((64 + 32 + 1) * 4, 32)
