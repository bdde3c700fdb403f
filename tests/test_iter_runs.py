"""``iter(ShardStream)`` draws in runs (``EpochRun.__next__``: ``draw_many``, the dicts built
in one go, handed out one per call) and must be indistinguishable from drawing one sample
per call: the same samples in the same order, the same ``state_dict()`` and
``stats()["samples"]`` after any sample (the drawn samples not yet handed out put back),
errors raised at the same sample, ``iter_views``' views valid until the next call.

The reference reads one sample per call with ``take(1, sink)``, which serves the
shuffle's needs and draws exactly as the stream did before runs; with the Python draw
(``_shuffle.NATIVE`` off) that is one ``WindowShuffle.draw`` per sample. Local shards
(``tarfile`` and ``webdataset.TarWriter``), small chunks so that lanes refill often.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import get_worker_info
from torchdata.stateful_dataloader import StatefulDataLoader

from asyncstream import CorruptTarError, ShardStream
from asyncstream.stream._iteration import Iteration, SampleViews
from asyncstream.stream._run import RecordSink
from tests._foreign import ForeignShards, write_foreign_shards
from tests.test_native_draw import Kind, key, make, native, options, record_key, topology

pytestmark = pytest.mark.timeout(600)

KINDS = ["samples", "shards", "off", "mixed"]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ForeignShards]:
    root = tmp_path_factory.mktemp("iter-runs")
    return {
        "plain": write_foreign_shards(root / "plain", 7, seed=21),
        "a": write_foreign_shards(root / "a", 4, seed=22, prefix="a"),
        "b": write_foreign_shards(root / "b", 3, seed=23, prefix="b"),
    }


def one_at_a_time(stream: ShardStream, limit: int | None = None) -> list[str]:
    """The reference: one sample per call, up to ``limit``."""
    views = stream.iter_views()
    got: list[str] = []

    def sink(view: memoryview, url: str, record: tuple[Any, ...]) -> bool:
        got.append(record_key(view, url, record))
        return True

    while (limit is None or len(got) < limit) and views.take(1, sink):
        pass
    return got


def reference(data: dict[str, ForeignShards], kind: Kind, epoch: int = 1, **kw: Any) -> list[str]:
    with native(False), stream(data, kind, **kw) as s:
        s.set_epoch(epoch)
        return one_at_a_time(s)


def stream(data: dict[str, ForeignShards], kind: Kind, **kw: Any) -> ShardStream:
    return make(data, kind, **options(kind), **kw)


def saved(stream: ShardStream) -> dict[str, Any]:
    return json.loads(json.dumps(stream.state_dict()))


@pytest.mark.parametrize("kind", KINDS)
def test_iter_gives_the_one_at_a_time_order(data: dict[str, ForeignShards], kind: Kind) -> None:
    expected = reference(data, kind)
    assert len(expected) > 100
    for on in (True, False):
        with native(on), stream(data, kind) as s:
            s.set_epoch(1)
            samples = list(s)
            stats = s.stats()
        assert [key(sample) for sample in samples] == expected, on
        assert stats["samples"] == len(expected)
        if kind == "mixed":
            assert {sample["__source__"] for sample in samples} == {"a", "b"}
            assert all(sample["__key__"].startswith(sample["__source__"]) for sample in samples)
        assert all(isinstance(sample["jpg"], bytes) for sample in samples)


@pytest.mark.parametrize("kind", ["samples", "shards", "off"])
@pytest.mark.parametrize("where", [(1, 2, 0, 1), (0, 2, 1, 3), (2, 3, 1, 2)])
def test_ranks_and_workers_iterate_in_their_one_at_a_time_order(
    data: dict[str, ForeignShards], kind: Kind, where: tuple[int, int, int, int]
) -> None:
    rank, world = where[:2]
    with topology(*where):
        expected = reference(data, kind, rank=rank, world_size=world)
        with stream(data, kind, rank=rank, world_size=world) as s:
            s.set_epoch(1)
            assert [key(sample) for sample in s] == expected


@pytest.mark.parametrize("kind", KINDS)
def test_state_and_stats_after_any_sample_are_the_one_at_a_time_ones(
    data: dict[str, ForeignShards], kind: Kind
) -> None:
    """After k samples, k inside runs of every length: the state equals the reference's
    after k samples, resumes to exactly the rest, and the iterator read on after it is
    saved goes on with exactly the rest too."""
    expected = reference(data, kind)
    n = len(expected)
    for k in sorted({k for k in (0, 1, 2, 3, 6, 50, 77, 130, n - 1, n) if k <= n}):
        with native(False), stream(data, kind) as s:
            s.set_epoch(1)
            assert one_at_a_time(s, k) == expected[:k]
            wanted = saved(s)
        with stream(data, kind) as s:
            s.set_epoch(1)
            it = iter(s)
            head = [key(next(it)) for _ in range(k)]
            stats = s.stats()
            state = saved(s)
            rest = [key(sample) for sample in it]
            end = s.stats()
        assert head == expected[:k]
        assert stats["samples"] == k
        assert state == wanted, k
        assert rest == expected[k:], k
        assert end["samples"] == len(expected)
        with stream(data, kind) as s:
            s.load_state_dict(state)
            assert [key(sample) for sample in s] == expected[k:], k


def _shuffle_stats(stats: dict[str, Any]) -> tuple[Any, ...]:
    keys = ("samples", "shuffle_radius", "open_shards", "sources")
    return tuple(stats.get(key) for key in keys)


@pytest.mark.parametrize("kind", ["samples", "mixed"])
def test_stats_mid_run_count_only_what_was_handed_out(
    data: dict[str, ForeignShards], kind: Kind
) -> None:
    """``stats()`` (which may be read from another thread) does not put samples back; it
    counts them as not drawn: after every sample, the same samples, radius and draws of
    each source as the reference's."""
    wanted = []
    with native(False), stream(data, kind) as s:
        s.set_epoch(1)
        views = s.iter_views()
        while True:
            wanted.append(_shuffle_stats(s.stats()))
            if not views.take(1, lambda view, url, record: True):
                break
        wanted.append(_shuffle_stats(s.stats()))  # at the end
    got = []
    ahead = []
    with stream(data, kind) as s:
        s.set_epoch(1)
        it = iter(s)
        assert isinstance(it, Iteration)
        for _ in it:
            got.append(_shuffle_stats(s.stats()))
            ahead.append(len(it.run.ready))
        got.append(_shuffle_stats(s.stats()))
    assert got == wanted[1:]  # after each sample, then at the end
    assert any(ahead)  # the point: samples were drawn ahead of the consumer


def test_a_state_saved_every_few_samples_puts_nothing_back(
    data: dict[str, ForeignShards],
) -> None:
    """Saved every 5 samples (as a loader saves every batch), the runs stop where the next
    save is due: after the first save none drawn ahead is put back."""
    expected = reference(data, "samples")
    got: list[str] = []
    ahead: list[int] = []
    with stream(data, "samples") as s:
        s.set_epoch(1)
        it = iter(s)
        assert isinstance(it, Iteration)
        while len(got) + 5 <= len(expected):
            got += [key(next(it)) for _ in range(5)]
            ahead.append(len(it.run.ready))
            assert saved(s)["position"]["emitted"] == len(got)
        got += [key(sample) for sample in it]
    assert got == expected
    assert ahead[0] > 0  # runs of 1, 2, 4: two samples drawn ahead at the first save
    assert not any(ahead[1:])


@pytest.mark.parametrize("kind", KINDS)
def test_next_and_take_mixed_keep_the_order(data: dict[str, ForeignShards], kind: Kind) -> None:
    """``take`` after ``next()`` inside a run puts the run's rest back and draws it again."""
    expected = reference(data, kind)
    rng = random.Random(kind)
    got: list[str] = []

    def sink(view: memoryview, url: str, record: tuple[Any, ...]) -> bool:
        got.append(record_key(view, url, record))
        return True

    with stream(data, kind) as s:
        s.set_epoch(1)
        views = s.iter_views()
        while True:
            if rng.random() < 0.5:
                if not views.take(rng.randint(1, 9), sink):
                    break
            else:
                for _ in range(rng.randint(1, 9)):
                    try:
                        got.append(key(next(views)))
                    except StopIteration:
                        break
                else:
                    continue
                break
        assert s.stats()["samples"] == len(expected)
    assert got == expected


def test_views_drawn_in_runs_hold_the_samples_bytes(data: dict[str, ForeignShards]) -> None:
    """Each run's views are built before they are handed out: they must still be the
    sample's bytes when handed out (no chunk is released while a run is being handed
    out: the shuffle's needs are served only once the run is spent)."""
    with stream(data, "samples") as s:
        s.set_epoch(1)
        copies = list(s)
    with stream(data, "samples") as s:
        s.set_epoch(1)
        views = s.iter_views()
        assert isinstance(views, Iteration)
        ahead = 0
        for sample, copy in zip(views, copies, strict=True):
            assert type(sample["jpg"]) in (memoryview, bytes)
            assert {k: bytes(v) if isinstance(v, memoryview) else v for k, v in sample.items()} == (
                copy
            )
            ahead = max(ahead, len(views.run.ready))
        assert ahead > 1  # drawn in runs
        assert s.stats()["samples"] == len(copies)


def test_set_epoch_load_and_close_mid_run_forget_the_samples_drawn_ahead(
    data: dict[str, ForeignShards],
) -> None:
    expected = reference(data, "samples")
    with stream(data, "samples") as s:
        s.set_epoch(1)
        it = iter(s)
        for _ in range(20):
            next(it)
        state = saved(s)
        for _ in range(7):
            next(it)
        s.set_epoch(1)  # the run is dropped: the epoch is read again from its start
        assert s.stats()["samples"] == 0
        assert [key(sample) for sample in s] == expected
        it = iter(s)
        for _ in range(31):
            next(it)
        s.load_state_dict(state)
        assert [key(sample) for sample in s] == expected[20:]
        s.set_epoch(1)
        it = iter(s)
        head = [key(next(it)) for _ in range(9)]
        assert isinstance(it, Iteration)
        it.close()
        with pytest.raises(StopIteration):
            next(it)
    assert head == expected[:9]


def _worker_keys(batch: list[dict[str, Any]]) -> tuple[int, list[str]]:
    info = get_worker_info()
    assert info is not None
    return info.id, [key(sample) for sample in batch]


def test_a_stateful_dataloader_s_workers_read_their_one_at_a_time_order(
    data: dict[str, ForeignShards],
) -> None:
    """Two ranks' worth of one rank, two workers, the state saved every batch (which puts
    back each batch's run): each worker's batches are its reference order; a loader
    resumed from a mid-epoch state reads exactly the rest."""
    workers = 2
    expected = {}
    for worker in range(workers):
        with topology(1, 2, worker, workers):
            expected[worker] = reference(data, "samples", rank=1, world_size=2)

    def loader(s: ShardStream) -> StatefulDataLoader:
        return StatefulDataLoader(s, batch_size=5, num_workers=workers, collate_fn=_worker_keys)

    got: dict[int, list[str]] = {w: [] for w in range(workers)}
    with stream(data, "samples", rank=1, world_size=2) as s:
        s.set_epoch(1)
        dl = loader(s)
        batches = list(dl)
        states = []
        dl = loader(s)
        s.set_epoch(1)
        for i, (_worker, _keys) in enumerate(dl):
            if i == 7:
                states.append(dl.state_dict())
                break
    for worker, keys in batches:
        got[worker] += keys
    assert got == expected
    with stream(data, "samples", rank=1, world_size=2) as s:
        dl = loader(s)
        dl.load_state_dict(states[0])
        rest = list(dl)
    assert rest == batches[8:]


def _take_all(views: SampleViews, sink: RecordSink) -> None:
    while views.take(1, sink):
        pass


def _corrupt_mid_shard(folder: Path) -> str:
    """Corrupt the header of a member half-way through the second shard (in a later
    chunk than its first); returns the shard's name."""
    shard = sorted(folder.glob("*.tar"))[1]
    data = bytearray(shard.read_bytes())
    offset = 0
    while offset < len(data) // 2:
        size = int(data[offset + 124 : offset + 136].strip(b"\0 ") or b"0", 8)
        offset += 512 + -(-size // 512) * 512
    data[offset + 10] ^= 0xFF
    shard.write_bytes(bytes(data))
    return shard.name


@pytest.mark.parametrize("kind", ["samples", "off"])
def test_a_shard_corrupted_mid_way_fails_at_the_one_at_a_time_sample(
    tmp_path: Path, kind: Kind
) -> None:
    shards = write_foreign_shards(tmp_path / "bad", 4, seed=31, samples=(60, 80))
    name = _corrupt_mid_shard(shards.folder)

    wanted: list[str] = []
    with native(False), stream({"plain": shards}, kind) as s:
        s.set_epoch(1)
        views = s.iter_views()

        def sink(view: memoryview, url: str, record: tuple[Any, ...]) -> bool:
            wanted.append(record_key(view, url, record))
            return True

        with pytest.raises(CorruptTarError) as expected_error:
            _take_all(views, sink)
        wanted_state, wanted_samples = saved(s), s.stats()["samples"]
    assert any(k.endswith(name) for k in wanted)  # samples of the shard before its corruption
    with stream({"plain": shards}, kind) as s:
        s.set_epoch(1)
        got: list[str] = []
        with pytest.raises(CorruptTarError) as error:
            got.extend(key(sample) for sample in s)
        assert got == wanted
        assert str(error.value) == str(expected_error.value)
        assert (saved(s), s.stats()["samples"]) == (wanted_state, wanted_samples)
