"""``ShardStream.iter_views``: the samples of ``iter`` in the same order, each member a
view of the ring instead of a copy, with the same state; on shards ``pack`` did not write
(``tarfile`` and ``webdataset.TarWriter``), some samples straddling chunks."""

from __future__ import annotations

from typing import Any

import pytest

from asyncstream import ShardStream
from tests._foreign import ForeignShards, write_foreign_shards

CHUNK = 16 << 10  # members up to 20 kB: samples straddle chunks, some carried as bytes


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> ForeignShards:
    return write_foreign_shards(
        tmp_path_factory.mktemp("views"), 5, seed=3, jpg_bytes=(200, 20_000)
    )


def stream(shards: ForeignShards) -> ShardStream:
    return ShardStream(
        str(shards.folder), window=3, inflight=2, chunk_bytes=CHUNK, seed=5, index_cache=False
    )


def copied(sample: dict[str, Any]) -> dict[str, Any]:
    """A sample with every view copied out at once, as a consumer of views must."""
    kinds = {type(v) for k, v in sample.items() if not k.startswith("__")}
    assert kinds <= {memoryview, bytes}
    return {k: bytes(v) if isinstance(v, memoryview) else v for k, v in sample.items()}


def test_views_give_iter_s_samples_in_iter_s_order(shards: ForeignShards) -> None:
    with stream(shards) as s:
        plain = list(s)
    with stream(shards) as s:
        views = [copied(sample) for sample in s.iter_views()]
        stats = s.stats()
    assert views == plain
    assert sorted(sample["__key__"] for sample in views) == sorted(shards.keys)
    assert stats["samples"] == shards.total


def test_members_are_views_unless_carried_across_chunks(shards: ForeignShards) -> None:
    with stream(shards) as s:
        kinds = {type(sample["jpg"]) for sample in s.iter_views()}
    assert memoryview in kinds  # not copied: the point
    assert bytes in kinds  # a sample straddling two chunks is carried in bytes


def test_a_views_state_resumes_a_plain_iteration_exactly(shards: ForeignShards) -> None:
    with stream(shards) as s:
        everything = [sample["__key__"] for sample in s]
    with stream(shards) as s:
        views = s.iter_views()
        head = [next(views)["__key__"] for _ in range(shards.total // 3)]
        state = s.state_dict()
    with stream(shards) as s:
        s.load_state_dict(state)
        tail = [sample["__key__"] for sample in s]
    assert head + tail == everything
