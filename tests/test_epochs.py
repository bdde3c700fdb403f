"""Epochs: they advance by themselves, set_epoch chooses one, and a loaded state is kept.

In the order users write: the README's loop (``set_epoch`` before each epoch) after its
resume line, and a framework's loop that never calls ``set_epoch`` (Lightning), with and
without StatefulDataLoader workers (persistent or not), and under DALIImageLoader.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

from asyncstream import ShardStream, StateError
from dali_ops import DALIImageLoader, PipelineSettings
from tests._foreign import ForeignShards, write_foreign_shards
from tests._resume_child import keys

STREAM: dict[str, Any] = {"window": 3, "inflight": 2, "chunk_bytes": 16 << 10, "seed": 5}
LOADERS = [
    pytest.param({"num_workers": 0}, id="0-workers"),
    pytest.param({"num_workers": 2}, id="2-workers"),
    pytest.param({"num_workers": 2, "persistent_workers": True}, id="2-persistent"),
]


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> ForeignShards:
    return write_foreign_shards(tmp_path_factory.mktemp("epochs"), 5, seed=4)


def open_stream(data: ForeignShards) -> ShardStream:
    return ShardStream(str(data.folder), samples_per_shard=data.counts, **STREAM)


def loader_of(stream: ShardStream, kwargs: dict[str, Any]) -> StatefulDataLoader:
    return StatefulDataLoader(stream, batch_size=4, collate_fn=keys, **kwargs)


def flat(batches: list[list[str]]) -> list[str]:
    return [k for b in batches for k in b]


@pytest.fixture(scope="module")
def chosen(shards: ForeignShards) -> dict[tuple[str, int], list[list[str]]]:
    """Epochs 0 to 2 read with set_epoch, by each loader: the reference orders."""
    out = {}
    for param in LOADERS:
        kwargs = param.values[0]
        with open_stream(shards) as stream:
            loader = loader_of(stream, kwargs)
            for epoch in range(3):
                stream.set_epoch(epoch)
                out[str(param.id), epoch] = list(loader)
            del loader
    return out


@pytest.mark.parametrize("kwargs", LOADERS)
def test_each_iteration_reads_the_next_epoch_without_set_epoch(
    shards: ForeignShards,
    chosen: dict[tuple[str, int], list[list[str]]],
    kwargs: dict[str, Any],
    request: pytest.FixtureRequest,
) -> None:
    name = request.node.callspec.id
    with open_stream(shards) as stream:
        loader = loader_of(stream, kwargs)
        epochs = [list(loader) for _ in range(3)]  # as Lightning's loop does: no set_epoch
        assert stream.epoch == 3
        del loader
    for epoch, batches in enumerate(epochs):
        assert sorted(flat(batches)) == sorted(shards.keys)  # each epoch exactly once
        assert batches == chosen[name, epoch]  # the epoch set_epoch would have chosen
    assert flat(epochs[0]) != flat(epochs[1]) != flat(epochs[2])


@pytest.mark.parametrize("kwargs", LOADERS)
def test_set_epoch_reads_an_epoch_again_on_purpose(
    shards: ForeignShards, kwargs: dict[str, Any]
) -> None:
    with open_stream(shards) as stream:
        loader = loader_of(stream, kwargs)
        first = list(loader)
        stream.set_epoch(0)
        again = list(loader)
        after = list(loader)  # and on from there
        del loader
    assert again == first
    assert sorted(flat(after)) == sorted(flat(first))
    assert after != first


def test_a_stream_read_in_the_main_process_then_by_workers_goes_on(
    shards: ForeignShards, chosen: dict[tuple[str, int], list[list[str]]]
) -> None:
    with open_stream(shards) as stream:
        sum(1 for _ in stream)  # epoch 0, read by the stream itself
        loader = loader_of(stream, {"num_workers": 2})
        assert list(loader) == chosen["2-workers", 1]
        assert list(loader) == chosen["2-workers", 2]
        del loader


def test_an_iterator_made_and_dropped_unread_is_no_epoch(shards: ForeignShards) -> None:
    with open_stream(shards) as stream:
        iter(stream)
        iter(stream)  # replaces it, unread
        first = [s["__key__"] for s in stream]
        stream.set_epoch(0)
        assert [s["__key__"] for s in stream] == first


# -- a loaded state and set_epoch ------------------------------------------------------------


def saved(data: ForeignShards, kwargs: dict[str, Any], epoch: int, batches: int) -> Any:
    """A StatefulDataLoader's state after ``batches`` batches of ``epoch`` (as JSON)."""
    with open_stream(data) as stream:
        loader = loader_of(stream, kwargs)
        stream.set_epoch(epoch)
        it = iter(loader)
        for _ in range(batches):
            next(it)
        state = json.loads(json.dumps(loader.state_dict()))
        del it, loader
    return state


@pytest.mark.parametrize("kwargs", LOADERS)
def test_the_readme_loop_after_its_resume_line_continues_exactly(
    shards: ForeignShards,
    chosen: dict[tuple[str, int], list[list[str]]],
    kwargs: dict[str, Any],
    request: pytest.FixtureRequest,
) -> None:
    name = request.node.callspec.id
    state = saved(shards, kwargs, 1, 5)
    with open_stream(shards) as stream:
        loader = loader_of(stream, kwargs)
        loader.load_state_dict(state)
        read = []
        for epoch in range(1, 3):  # the README: set_epoch before each epoch
            stream.set_epoch(epoch)
            read.append(list(loader))
        del loader
    assert read == [chosen[name, 1][5:], chosen[name, 2]]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_loaded_into_the_stream_is_kept_by_set_epoch_of_its_epoch(
    shards: ForeignShards, chosen: dict[tuple[str, int], list[list[str]]], workers: int
) -> None:
    """``stream.load_state_dict(state)``, then the README's loop: the state is the rest
    of its epoch, with the main process reading or with workers started after the load."""
    kwargs = {"num_workers": workers}
    name = f"{workers}-workers"
    state = saved(shards, kwargs, 0, 3)
    with open_stream(shards) as stream:
        stream.load_state_dict(state)
        loader = loader_of(stream, kwargs)
        read = []
        for epoch in range(2):
            stream.set_epoch(epoch)
            read.append(list(loader))
        read.append(list(loader))  # and on without set_epoch: epoch 2
        del loader
    # A fresh loader's round robin over the workers starts at worker 0, the saved one's
    # where it was: the same samples, batches in another order.
    assert sorted(flat(read[0])) == sorted(flat(chosen[name, 0][3:]))
    assert read[1:] == [chosen[name, 1], chosen[name, 2]]


@pytest.mark.parametrize("kwargs", LOADERS)
def test_set_epoch_of_another_epoch_after_a_load_is_refused_naming_both(
    shards: ForeignShards, kwargs: dict[str, Any]
) -> None:
    state = saved(shards, kwargs, 0, 3)
    with open_stream(shards) as stream:
        loader = loader_of(stream, kwargs)
        loader.load_state_dict(state)
        stream.set_epoch(1)
        with pytest.raises(StateError, match=r"epoch 0 was loaded .* set_epoch\(1\)"):
            list(loader)
        del loader
    with open_stream(shards) as stream:  # loaded into the stream: the same
        stream.load_state_dict(state)
        stream.set_epoch(2)
        with pytest.raises(StateError, match=r"epoch 0 was loaded .* set_epoch\(2\)"):
            next(iter(stream))


@pytest.mark.parametrize("kwargs", LOADERS)
def test_a_state_saved_at_the_end_of_its_epoch_counts_that_epoch_read(
    shards: ForeignShards,
    chosen: dict[tuple[str, int], list[list[str]]],
    kwargs: dict[str, Any],
    request: pytest.FixtureRequest,
) -> None:
    name = request.node.callspec.id
    end = saved(shards, kwargs, 0, len(chosen[name, 0]))
    # An empty pass (the end that was saved), then the next epoch; set_epoch(0) keeps the
    # end, set_epoch(1) starts epoch 1. Without workers torchdata restores its fetcher as
    # ended, so its first pass is empty whatever the stream would read (README, limits).
    ended = kwargs["num_workers"] == 0
    for asked, expected in (
        (None, [None, 1]),
        (1, [None, 1] if ended else [1, 2]),
        (0, [None, None]),
    ):
        with open_stream(shards) as stream:
            loader = loader_of(stream, kwargs)
            loader.load_state_dict(end)
            if asked is not None:
                stream.set_epoch(asked)
            read = [list(loader), list(loader)]
            del loader
        want = [[] if e is None else chosen[name, e] for e in expected]
        assert read == want, f"set_epoch({asked})"


# -- DALIImageLoader -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def jpeg_shards(tmp_path_factory: pytest.TempPathFactory) -> ForeignShards:
    from asyncstream.testing import generate_imagefolder

    root = tmp_path_factory.mktemp("jpegs")
    paths = generate_imagefolder(root / "images", 16, 2, seed=0, workers=1)
    jpgs = [path.read_bytes() for path in paths]
    return write_foreign_shards(root / "shards", 0, counts=[10] * 5, jpgs=jpgs)


def dali(data: ForeignShards) -> DALIImageLoader:
    settings = PipelineSettings(image_size=32, num_threads=1, seed=3)
    return DALIImageLoader(open_stream(data), 8, device="cpu", settings=settings, train=False)


def dali_keys(loader: DALIImageLoader) -> list[list[str]]:
    out = []
    for _ in loader:
        out.append([key for _, key in loader.last_keys])
    return out


def test_dali_loader_epochs_advance_and_a_loaded_state_is_kept(jpeg_shards: ForeignShards) -> None:
    with dali(jpeg_shards) as loader:
        epochs = [dali_keys(loader) for _ in range(2)]  # no set_epoch
        assert len(loader) == len(epochs[0]) == 7  # 50 images in batches of 8
        loader.set_epoch(0)
        assert dali_keys(loader) == epochs[0]
        loader.set_epoch(0)
        it = iter(loader)
        for _ in range(2):
            next(it)
        state = json.loads(json.dumps(loader.state_dict()))
    assert epochs[0] != epochs[1]
    with dali(jpeg_shards) as loader:
        loader.load_state_dict(state)
        read = []
        for epoch in range(2):  # the README's loop
            loader.set_epoch(epoch)
            read.append(dali_keys(loader))
        assert loader.state_dict()["batches"] == 7
    assert read == [epochs[0][2:], epochs[1]]
    with dali(jpeg_shards) as loader:
        loader.load_state_dict(state)
        loader.set_epoch(1)
        with pytest.raises(StateError, match=r"epoch 0 was loaded .* set_epoch\(1\)"):
            dali_keys(loader)
