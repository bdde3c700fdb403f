"""A dataset's identity in a state (``stream/_dataset_id.py``): the same shards moved from a
real S3 server (moto) to a local folder, or back, resume exactly; another dataset is
refused with what differs and both datasets named; a state of an older asyncstream (the
fingerprint over full URLs) still loads; a loader refuses another kind's state, and a
ShardLoader with workers refuses another dataset's at ``load_state_dict``."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from asyncstream import ShardLoader, ShardStream, StateError
from asyncstream.testing._local import LocalS3
from tests._foreign import ForeignShards, write_foreign_shards
from tests._resume_child import keys

STREAM: dict[str, Any] = {"window": 3, "inflight": 2, "chunk_bytes": 16 << 10, "seed": 5}
AFTER = 41


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> ForeignShards:
    return write_foreign_shards(tmp_path_factory.mktemp("moved") / "train", 0, counts=[23, 31, 17])


@pytest.fixture(scope="module")
def on_s3(shards: ForeignShards, s3_server: LocalS3) -> str:
    """The same shards on moto, under another bucket's prefix."""
    client = s3_server.client()
    client.create_bucket(Bucket="moved")
    for path in sorted(shards.folder.glob("*.tar")):
        client.put_object(Bucket="moved", Key=f"staging/train/{path.name}", Body=path.read_bytes())
    return "s3://moved/staging/train/"


def where(place: str, shards: ForeignShards, s3_url: str, s3_server: LocalS3) -> ShardStream:
    if place == "s3":
        return ShardStream(s3_url, s3=s3_server.options(), **STREAM)
    return ShardStream(str(shards.folder), **STREAM)


def key(sample: dict[str, Any]) -> str:
    return f"{sample['__key__']}|{sample['__url__'].rsplit('/', 1)[-1]}"


def read_and_save(stream: ShardStream) -> tuple[list[str], dict[str, Any]]:
    """Epoch 1's keys, and the state saved after its first ``AFTER`` samples."""
    stream.set_epoch(1)
    whole = [key(s) for s in stream]
    stream.set_epoch(1)
    samples = iter(stream)
    for _ in range(AFTER):
        next(samples)
    state = stream.state_dict()
    del samples
    return whole, state


@pytest.mark.parametrize(("saved_on", "resumed_on"), [("s3", "local"), ("local", "s3")])
def test_a_state_resumes_exactly_on_the_same_shards_moved(
    shards: ForeignShards, on_s3: str, s3_server: LocalS3, saved_on: str, resumed_on: str
) -> None:
    with where(saved_on, shards, on_s3, s3_server) as stream:
        whole, state = read_and_save(stream)
    assert state["dataset_shards"]["where"][0].startswith(
        "s3://" if saved_on == "s3" else "file://"
    )
    with where(resumed_on, shards, on_s3, s3_server) as moved:
        assert moved.state_dict()["dataset"] == state["dataset"]
        moved.load_state_dict(state)
        rest = [key(s) for s in moved]
    assert rest == whole[AFTER:]
    assert len(whole) == shards.total


def _state_of(folder: Path, **options: Any) -> dict[str, Any]:
    with ShardStream(str(folder), **{**STREAM, **options}) as stream:
        return stream.state_dict()


def test_another_dataset_is_refused_naming_what_differs_and_both(
    shards: ForeignShards, on_s3: str, s3_server: LocalS3, tmp_path: Path
) -> None:
    with where("s3", shards, on_s3, s3_server) as stream:
        state = stream.state_dict()
    fewer = tmp_path / "fewer"
    fewer.mkdir()
    for path in sorted(shards.folder.glob("*.tar"))[:2]:
        shutil.copy(path, fewer / path.name)
    with ShardStream(str(fewer), **STREAM) as s, pytest.raises(StateError) as info:
        s.load_state_dict(state)
    message = str(info.value)
    assert "3 shards in the state, 2 here" in message
    assert "s3://moved/staging/train/" in message
    assert str(fewer) in message
    # One shard with other samples (its count and size differ): named by its number.
    other = write_foreign_shards(tmp_path / "other", 0, counts=[23, 30, 17])
    with ShardStream(str(other.folder), **STREAM) as s, pytest.raises(StateError) as info:
        s.load_state_dict(state)
    message = str(info.value)
    assert "sample counts and shard sizes differ, at shard 1 ('part-00001.tar' here)" in message
    assert "71 samples" in message
    assert "70 samples" in message


def test_a_state_without_a_description_is_refused_with_this_dataset_named(
    shards: ForeignShards, tmp_path: Path
) -> None:
    other = write_foreign_shards(tmp_path / "other", 0, counts=[5, 6])
    state = _state_of(shards.folder)
    del state["dataset_shards"]
    with ShardStream(str(other.folder), **STREAM) as s, pytest.raises(StateError) as info:
        s.load_state_dict(state)
    assert "another dataset" in str(info.value)
    assert "2 shards under" in str(info.value)
    state["dataset_shards"] = {"shards": "hostile", "where": [1]}  # malformed: ignored
    with ShardStream(str(other.folder), **STREAM) as s, pytest.raises(StateError, match="older"):
        s.load_state_dict(state)


def test_a_state_of_an_older_asyncstream_still_loads(shards: ForeignShards) -> None:
    """Older states name the dataset by a fingerprint over full URLs, sizes, ETags and
    counts, and have no ``dataset_shards``: accepted where the shards still are."""
    with ShardStream(str(shards.folder), **STREAM) as stream:
        whole, state = read_and_save(stream)
        legacy = stream._settings.dataset_id.legacy
    old = {k: v for k, v in state.items() if k != "dataset_shards"}
    old["dataset"] = legacy
    assert legacy != state["dataset"]
    with ShardStream(str(shards.folder), **STREAM) as stream:
        stream.load_state_dict(old)
        assert [key(s) for s in stream] == whole[AFTER:]


def test_a_shard_loader_with_workers_refuses_another_dataset_at_load(
    shards: ForeignShards, tmp_path: Path
) -> None:
    other = write_foreign_shards(tmp_path / "other", 0, counts=[23, 31, 18])
    with ShardStream(str(shards.folder), **STREAM) as stream:
        loader = ShardLoader(stream, batch_size=4, num_workers=2, collate_fn=keys)
        batches = iter(loader)
        next(batches)
        state = loader.state_dict()
        del batches, loader
    with ShardStream(str(other.folder), **STREAM) as stream:
        loader = ShardLoader(stream, batch_size=4, num_workers=2, collate_fn=keys)
        with pytest.raises(StateError, match="at shard 2"):
            loader.load_state_dict(state)
        del loader


def test_a_loader_state_of_another_kind_is_a_state_error(shards: ForeignShards) -> None:
    from dali_ops import DALIImageLoader, PipelineSettings

    settings = PipelineSettings(image_size=32, num_threads=1)
    stream = ShardStream(str(shards.folder), **STREAM)
    with DALIImageLoader(stream, 4, device="cpu", settings=settings) as dali:
        dali_state = dali.state_dict()
    assert dali_state["kind"] == "asyncstream.DALIImageLoader"
    with ShardStream(str(shards.folder), **STREAM) as stream:
        loader = ShardLoader(stream, batch_size=4, collate_fn=keys)
        with pytest.raises(StateError, match=r"ShardLoader.*DALIImageLoader state_dict"):
            loader.load_state_dict(dali_state)
        with pytest.raises(StateError, match="a ShardStream state_dict"):
            loader.load_state_dict(stream.state_dict())
        loader_state = loader.state_dict()
        del loader
    stream = ShardStream(str(shards.folder), **STREAM)
    with (
        DALIImageLoader(stream, 4, device="cpu", settings=settings) as dali,
        pytest.raises(StateError, match=r"DALIImageLoader.*ShardLoader"),
    ):
        dali.load_state_dict(loader_state)
