"""Exact resume with DataLoader workers (StatefulDataLoader), onto other topologies, and misuse.

The data are shards that ``pack`` did not write (``tarfile`` and ``webdataset.TarWriter``,
see ``tests/_foreign.py``), with members larger than a chunk, so samples straddle chunks.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader, get_worker_info
from torchdata.stateful_dataloader import StatefulDataLoader

from asyncstream import ShardStream, StateError
from asyncstream.stores._s3 import S3Options
from asyncstream.testing import Fault, FaultProxy, LocalS3, generate_imagefolder
from dali_ops import DALIImageLoader, PipelineSettings
from tests._foreign import ForeignShards, write_foreign_shards
from tests._resume_child import keys, record_epochs
from tests._torchrun import torchrun

# Four DataLoader workers on a 2-core machine: torch warns, the test means it.
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

STREAM: dict[str, Any] = {"window": 3, "inflight": 2, "chunk_bytes": 16 << 10, "seed": 11}
HERE = Path(__file__).parent
# 208 samples: every split below divides them; see the elastic tests' save points.
ELASTIC_COUNTS = [21, 17, 25, 19, 23, 18, 26, 20, 22, 17]


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> ForeignShards:
    return write_foreign_shards(tmp_path_factory.mktemp("foreign"), 10, seed=1)


@pytest.fixture(scope="module")
def elastic(tmp_path_factory: pytest.TempPathFactory) -> ForeignShards:
    return write_foreign_shards(tmp_path_factory.mktemp("elastic"), 0, counts=ELASTIC_COUNTS)


def open_stream(data: ForeignShards, **kwargs: Any) -> ShardStream:
    return ShardStream(str(data.folder), samples_per_shard=data.counts, **{**STREAM, **kwargs})


# -- StatefulDataLoader: same topology, fresh process ---------------------------------------


def run_child(tmp_path: Path, spec: dict[str, Any]) -> Any:
    spec_path, out_path = tmp_path / "spec.json", tmp_path / "out.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    result = subprocess.run(
        [sys.executable, str(HERE / "_resume_child.py"), str(spec_path), str(out_path)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out_path.read_text())


@pytest.mark.parametrize(
    ("num_workers", "persistent"), [(0, False), (2, False), (4, False), (2, True)]
)
def test_stateful_dataloader_resumes_batch_identical_in_a_fresh_process(
    shards: ForeignShards, tmp_path: Path, num_workers: int, persistent: bool
) -> None:
    loader_kwargs: dict[str, Any] = {"batch_size": 5, "num_workers": num_workers}
    if persistent:
        loader_kwargs["persistent_workers"] = True
    with open_stream(shards) as stream:
        loader = StatefulDataLoader(stream, collate_fn=keys, **loader_kwargs)
        epochs, states = record_epochs(stream, loader)  # states: after each batch, as JSON
        del loader
    assert sorted(k for b in epochs[0] for k in b) == sorted(shards.keys)
    assert epochs[0] != epochs[1]
    n0 = len(epochs[0])
    # After batch j of epoch e: the first batch, mid-epoch, the last (the epoch boundary),
    # and early in the next epoch.
    points = [(0, 1), (0, n0 // 2), (0, n0), (1, 3)]
    spec = {
        "folder": str(shards.folder),
        "stream": {**STREAM, "samples_per_shard": shards.counts},
        "loader": loader_kwargs,
        "epochs": 2,
        "saves": [{"epoch": e, "state": json.loads(states[e][j - 1])} for e, j in points],
    }
    resumed = run_child(tmp_path, spec)
    for (e, j), got in zip(points, resumed, strict=True):
        expected = epochs[e][j:] + [b for later in epochs[e + 1 :] for b in later]
        assert got == expected, f"resumed after batch {j} of epoch {e}"


def test_plain_dataloader_state_dict_is_refused_and_says_what_works(
    shards: ForeignShards,
) -> None:
    with open_stream(shards) as stream:
        assert stream.state_dict()["position"]["draws"] == 0  # nothing read: still true
        loader = DataLoader(stream, batch_size=5, num_workers=2, collate_fn=keys)
        it = iter(loader)
        next(it)
        with pytest.raises(StateError, match="StatefulDataLoader"):
            stream.state_dict()
        del it
        stream.set_epoch(1)  # between epochs the stream's own state is true again
        state = stream.state_dict()
        assert (state["epoch"], state["position"]["draws"]) == (1, 0)


# -- Elastic: (2 ranks x 2 workers) onto other topologies -----------------------------------


def read_before(data: ForeignShards, batches: dict[int, int]) -> tuple[list[str], list[Any]]:
    """Two ranks with two StatefulDataLoader workers each read some batches and save."""
    read: list[str] = []
    states = []
    for rank, n in batches.items():
        with open_stream(data, rank=rank, world_size=2) as stream:
            loader = StatefulDataLoader(stream, batch_size=4, num_workers=2, collate_fn=keys)
            it = iter(loader)
            for _ in range(n):
                read.extend(next(it))
            states.append(json.loads(json.dumps(loader.state_dict())))
            del it, loader
    return read, states


@pytest.mark.parametrize(("world", "workers"), [(3, 1), (1, 4), (4, 2)])
def test_elastic_resume_with_stateful_dataloader_reads_the_rest_exactly_once(
    elastic: ForeignShards, world: int, workers: int
) -> None:
    # 6 + 7 batches of 4 (mid-epoch on every worker) leave 208 - 52 = 156 samples, which
    # 3, 1 and 4 ranks split equally: nothing is dropped, so before + after is the epoch.
    before, states = read_before(elastic, {0: 6, 1: 7})
    after: list[str] = []
    steps = []
    for rank in range(world):
        with open_stream(elastic, rank=rank, world_size=world) as stream:
            stream.load_state_dict(states)  # every old rank's loader state
            loader = StatefulDataLoader(stream, batch_size=4, num_workers=workers, collate_fn=keys)
            batches = list(loader)
            steps.append(len(batches))
            after.extend(k for b in batches for k in b)
            del loader
    everything = before + after
    assert len(everything) == len(set(everything))  # none repeated
    assert set(everything) == set(elastic.keys)  # none missed
    assert len(set(steps)) == 1  # equal steps per new rank


def test_elastic_resume_drops_what_does_not_divide_and_says_so(elastic: ForeignShards) -> None:
    before, states = read_before(elastic, {0: 6, 1: 6})  # leaves 160: 160 % 3 == 1
    after: list[str] = []
    dropped = 0
    for rank in range(3):
        with open_stream(elastic, rank=rank, world_size=3) as stream:
            stream.load_state_dict(states)
            after.extend(s["__key__"] for s in stream)
            dropped += stream.stats()["remainder_samples"]
    assert dropped == 1
    assert len(before) + len(after) == len(set(before + after)) == elastic.total - 1


def test_elastic_resume_needs_every_old_reader(elastic: ForeignShards) -> None:
    _, states = read_before(elastic, {0: 2, 1: 2})
    with open_stream(elastic, rank=0, world_size=3) as stream:
        stream.load_state_dict(states[:1])
        with pytest.raises(StateError, match="missing: rank 1 worker 0, rank 1 worker 1"):
            next(iter(stream))


def test_elastic_resume_of_a_resume(elastic: ForeignShards) -> None:
    """(2 x 2) -> (3 x 1), saved again mid-way -> (2 x 1): still exactly once."""
    before, states = read_before(elastic, {0: 6, 1: 7})
    second: list[Any] = []
    for rank in range(3):
        with open_stream(elastic, rank=rank, world_size=3) as stream:
            stream.load_state_dict(states)
            it = iter(stream)
            before.extend(next(it)["__key__"] for _ in range(10 + 4 * rank))
            second.append(stream.state_dict())
    after = []
    for rank in range(2):
        with open_stream(elastic, rank=rank, world_size=2) as stream:
            stream.load_state_dict(second)
            after.extend(s["__key__"] for s in stream)
    everything = before + after
    assert len(everything) == len(set(everything))
    assert len(set(everything)) >= elastic.total - 1  # 156 - 42 = 114 split by 2: none lost
    assert set(everything) == set(elastic.keys)


TORCHRUN_SAVE = """
import json, sys
import torch.distributed as dist
from torchdata.stateful_dataloader import StatefulDataLoader
from asyncstream import ShardStream
from tests._resume_child import keys
from tests._torchrun import torchrun

spec, out = json.load(open(sys.argv[1])), sys.argv[2]
dist.init_process_group("gloo")
rank = dist.get_rank()
stream = ShardStream(spec["folder"], **spec["stream"])  # rank and world from torch.distributed
if spec["phase"] == "save":
    loader = StatefulDataLoader(stream, batch_size=4, num_workers=2, collate_fn=keys)
    it = iter(loader)
    read = [k for _ in range(spec["batches"][rank]) for k in next(it)]
    json.dump({"keys": read, "state": loader.state_dict()}, open(f"{out}/old{rank}.json", "w"))
else:
    # What a checkpoint library does: every new rank reads every old rank's state.
    old = [json.load(open(f"{out}/old{r}.json")) for r in range(spec["old_world"])]
    stream.load_state_dict([o["state"] for o in old])
    loader = StatefulDataLoader(stream, batch_size=4, num_workers=1, collate_fn=keys)
    batches = list(loader)
    steps = [None] * dist.get_world_size()
    dist.all_gather_object(steps, len(batches))
    read = [k for b in batches for k in b]
    json.dump({"keys": read, "steps": steps}, open(f"{out}/new{rank}.json", "w"))
dist.barrier()
dist.destroy_process_group()
"""


def run_phase(script: Path, spec: dict[str, Any], nproc: int, out: Path) -> None:
    spec_path = out / f"spec-{spec['phase']}.json"
    spec_path.write_text(json.dumps(spec))
    result = torchrun(script, str(spec_path), str(out), nproc=nproc)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.slow
def test_elastic_resume_under_torchrun_from_2x2_to_3x1(
    elastic: ForeignShards, tmp_path: Path
) -> None:
    script = tmp_path / "train.py"
    script.write_text(TORCHRUN_SAVE)
    stream_kwargs = {**STREAM, "samples_per_shard": elastic.counts}
    base = {"folder": str(elastic.folder), "stream": stream_kwargs}
    run_phase(script, {**base, "phase": "save", "batches": [6, 7]}, 2, tmp_path)
    run_phase(script, {**base, "phase": "resume", "old_world": 2}, 3, tmp_path)
    before = [
        k for r in range(2) for k in json.loads((tmp_path / f"old{r}.json").read_text())["keys"]
    ]
    new = [json.loads((tmp_path / f"new{r}.json").read_text()) for r in range(3)]
    everything = before + [k for n in new for k in n["keys"]]
    assert len(everything) == len(set(everything)) == elastic.total
    assert set(everything) == set(elastic.keys)
    assert new[0]["steps"] == [13, 13, 13]  # 156 left, 52 per rank: 13 batches of 4 each


# -- Misuse ---------------------------------------------------------------------------------


def test_a_replaced_iterator_raises_instead_of_stopping(shards: ForeignShards) -> None:
    with open_stream(shards) as stream:
        first = iter(stream)
        next(first)
        second = iter(stream)  # same thread: replaces the first (as DataLoader does)
        assert next(second)["__key__"]
        with pytest.raises(StateError, match="ended by a newer iter"):
            next(first)
        stream.set_epoch(1)
        with pytest.raises(StateError, match="set_epoch"):
            next(second)


def test_another_thread_cannot_iterate_a_stream_being_read(shards: ForeignShards) -> None:
    with open_stream(shards) as stream:
        it = iter(stream)
        next(it)
        errors: list[BaseException] = []

        def other() -> None:
            try:
                iter(stream)
            except StateError as exc:
                errors.append(exc)

        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        assert len(errors) == 1
        assert "another thread" in str(errors[0])
        next(it)  # the first iterator is unharmed


def test_two_threads_reading_one_iterator_at_once_are_refused(
    s3_server: LocalS3, bucket: str, s3_client: Any, tmp_path: Path
) -> None:
    data = write_foreign_shards(tmp_path / "s3", 2, seed=3)
    for path in sorted(data.folder.glob("*.tar")):
        s3_client.put_object(Bucket=bucket, Key=f"t/{path.name}", Body=path.read_bytes())
    with FaultProxy(s3_server.endpoint_url) as proxy:
        options = S3Options(endpoint_url=proxy.endpoint_url)
        with ShardStream(
            f"s3://{bucket}/t/", s3=options, samples_per_shard=data.counts, **STREAM
        ) as stream:
            proxy.inject(Fault.LATENCY, seconds=2.0, count=10, match=".tar")
            it = iter(stream)
            errors: list[BaseException] = []

            def first() -> None:
                next(it)  # waits about 2 s for its first chunk

            thread = threading.Thread(target=first)
            thread.start()
            time.sleep(0.5)
            try:
                next(it)
            except StateError as exc:
                errors.append(exc)
            thread.join()
            assert len(errors) == 1
            assert "two threads" in str(errors[0])


def test_len_is_this_readers_samples(shards: ForeignShards) -> None:
    with open_stream(shards, rank=1, world_size=3) as stream:
        per_rank = shards.total // 3
        assert len(stream) == per_rank
        assert len(DataLoader(stream, batch_size=5, collate_fn=keys)) == math.ceil(per_rank / 5)
        assert len(list(stream)) == per_rank
    with open_stream(shards, remainder="pad") as stream:
        assert len(stream) == shards.total
        loader = DataLoader(stream, batch_size=None, num_workers=2, collate_fn=worker_len)
        shares = dict(loader)  # in each worker, len() is that worker's share
    assert sorted(shares) == [0, 1]
    assert sum(shares.values()) == shards.total
    assert abs(shares[0] - shares[1]) <= 1


def worker_len(sample: dict[str, Any]) -> tuple[int, int]:
    info = get_worker_info()
    assert info is not None
    return info.id, len(info.dataset)  # type: ignore[arg-type]


# -- The state object -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved(shards: ForeignShards) -> Iterator[dict[str, Any]]:
    with open_stream(shards, rank=0, world_size=2) as stream:
        it = iter(stream)
        for _ in range(17):
            next(it)
        yield stream.state_dict()


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (lambda st: st.update(version=99), "version 99"),
        (lambda st: st.pop("version"), "no 'version'"),
        (lambda st: st.pop("assignment"), "assignment"),
        (lambda st: st["assignment"].append(["span", 5]), "not a segment"),
        (
            lambda st: st.update(lineage="0" * 24, assignment=[["span", 0, 10**9]]),
            "passes the end",
        ),
        (lambda st: st.update(lineage=""), "lineage"),
        (lambda st: st["position"]["lanes"][0].pop("chunk"), "chunk"),
        (lambda st: st["position"]["lanes"][0].update(reader_start=100), "header boundary"),
        (lambda st: st.update(topology=[3, 2, 0, 1]), "rank"),
        (lambda st: st.pop("position"), "position"),
        (lambda st: st.update(epoch=-1), "epoch"),
    ],
)
def test_a_corrupted_truncated_or_unknown_state_is_refused_naming_why(
    shards: ForeignShards, saved: dict[str, Any], corrupt: Any, message: str
) -> None:
    state = json.loads(json.dumps(saved))
    corrupt(state)
    with (
        open_stream(shards, rank=0, world_size=2) as stream,
        pytest.raises(StateError, match=message),
    ):
        stream.load_state_dict(state)


def test_a_base_assignment_that_is_not_the_plan_is_refused(
    shards: ForeignShards, saved: dict[str, Any]
) -> None:
    state = json.loads(json.dumps(saved))
    state["assignment"] = [["span", 0, 3]]
    with (
        open_stream(shards, rank=0, world_size=2) as stream,
        pytest.raises(StateError, match="not this epoch's plan"),
    ):
        stream.load_state_dict(state)


def version_1(state: dict[str, Any]) -> dict[str, Any]:
    """The layout asyncstream 0.1 saved."""
    old = json.loads(json.dumps(state))
    for name in ("kind", "lineage", "assignment"):
        old.pop(name)
    old["version"] = 1
    for lane in old["position"]["lanes"]:
        lane.pop("returned")
    return old


def test_a_version_2_state_saved_before_mixing_resumes_exactly(
    shards: ForeignShards, saved: dict[str, Any]
) -> None:
    assert saved["version"] == 3
    assert saved["sources"] == []  # a stream of plain URLs
    old = json.loads(json.dumps(saved))
    old.pop("sources")
    old["version"] = 2
    with open_stream(shards, rank=0, world_size=2) as stream:
        stream.load_state_dict(saved)
        expected = [s["__key__"] for s in stream]
    with open_stream(shards, rank=0, world_size=2) as stream:
        stream.load_state_dict(old)
        assert [s["__key__"] for s in stream] == expected
    with (
        open_stream(shards, rank=0, world_size=2) as stream,
        pytest.raises(StateError, match="version 4"),
    ):
        stream.load_state_dict({**saved, "version": 4})


def test_a_version_1_state_resumes_on_the_same_topology_only(
    shards: ForeignShards, saved: dict[str, Any]
) -> None:
    with open_stream(shards, rank=0, world_size=2) as stream:
        stream.load_state_dict(saved)
        expected = [s["__key__"] for s in stream]
    with open_stream(shards, rank=0, world_size=2) as stream:
        stream.load_state_dict(version_1(saved))
        assert [s["__key__"] for s in stream] == expected
    with open_stream(shards, rank=0, world_size=3) as stream:
        other = {**version_1(saved), "topology": [1, 2, 0, 1]}
        stream.load_state_dict([version_1(saved), other])
        with pytest.raises(StateError, match="version 1"):
            next(iter(stream))


# -- DALIImageLoader onto another number of ranks -------------------------------------------


@pytest.fixture(scope="module")
def jpeg_shards(tmp_path_factory: pytest.TempPathFactory) -> ForeignShards:
    root = tmp_path_factory.mktemp("jpegs")
    paths = generate_imagefolder(root / "images", 24, 3, seed=0, workers=1)
    jpgs = [path.read_bytes() for path in paths]
    return write_foreign_shards(root / "shards", 0, counts=[12] * 8, jpgs=jpgs)


@pytest.mark.parametrize("world", [3, 1, 4])
def test_dali_loader_resumes_onto_another_number_of_ranks(
    jpeg_shards: ForeignShards, world: int
) -> None:
    settings = PipelineSettings(image_size=32, num_threads=1, seed=3)

    def loader(rank: int, ranks: int) -> DALIImageLoader:
        stream = open_stream(jpeg_shards, rank=rank, world_size=ranks, window=2)
        return DALIImageLoader(stream, 8, device="cpu", settings=settings)

    before: list[str] = []
    states = []
    for rank, batches in ((0, 1), (1, 2)):  # 96 - 3 x 8 = 72 left: 3, 1 and 4 ranks divide it
        with loader(rank, 2) as old:
            it = iter(old)
            for _ in range(batches):
                next(it)
                before.extend(key for _, key in old.last_keys)
            states.append(old.state_dict())
    after: list[str] = []
    steps = []
    for rank in range(world):
        with loader(rank, world) as new:
            new.load_state_dict(states)  # every old rank's state
            n = 0
            for _ in new:
                after.extend(key for _, key in new.last_keys)
                n += 1
            steps.append(n)
    everything = before + after
    assert len(everything) == len(set(everything))
    assert set(everything) == set(jpeg_shards.keys)
    assert len(set(steps)) == 1
