"""The iterator a stream hands out (:mod:`asyncstream.stream._iteration`).

The loop webdataset users write, ``for sample in ShardStream(url):`` and
``list(ShardStream(url))``, with the stream bound to no name, reads the whole epoch while
the garbage collector runs; the stream is closed once the iterator ends or is dropped. A
bound stream still serves one iterator at a time.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest
from _foreign import ForeignShards, write_foreign_shards

from asyncstream import ShardStream, StateError


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> ForeignShards:
    return write_foreign_shards(tmp_path_factory.mktemp("iteration"), 4, seed=5)


def url_of(data: ForeignShards) -> str:
    return str(data.folder) + "/"


def streams_alive() -> int:
    gc.collect()
    return sum(type(o) is ShardStream for o in gc.get_objects())


@pytest.fixture
def collecting() -> Iterator[None]:
    """The collector runs after every allocation or so while the test runs."""
    threshold = gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    try:
        yield
    finally:
        gc.set_threshold(*threshold)


def test_a_stream_used_in_place_reads_its_epoch_with_gc_in_the_loop(
    shards: ForeignShards,
) -> None:
    before = streams_alive()
    keys = []
    for sample in ShardStream(url_of(shards), chunk_bytes=4096, window=3):
        if len(keys) % 10 == 0:  # a full collection costs ~30 ms with torch loaded
            gc.collect()
        keys.append(sample["__key__"])
    assert sorted(keys) == sorted(shards.keys)
    assert streams_alive() == before  # the epoch over, the stream went (and its engine)


def test_list_of_a_stream_reads_its_epoch_with_the_collector_running(
    shards: ForeignShards, collecting: None
) -> None:
    before = streams_alive()
    samples = list(ShardStream(url_of(shards), chunk_bytes=4096, window=3, seed=2))
    assert sorted(s["__key__"] for s in samples) == sorted(shards.keys)
    assert streams_alive() == before


def test_leaving_an_in_place_loop_early_closes_the_stream(shards: ForeignShards) -> None:
    before = streams_alive()
    for n, _ in enumerate(ShardStream(url_of(shards), chunk_bytes=4096)):
        gc.collect()
        if n == 5:
            break
    assert streams_alive() == before


def test_a_bound_stream_still_serves_one_iterator_at_a_time(shards: ForeignShards) -> None:
    with ShardStream(url_of(shards), chunk_bytes=4096) as stream:
        first = iter(stream)
        next(first)
        second = iter(stream)
        gc.collect()
        with pytest.raises(StateError, match="ended by a newer iter"):
            next(first)
        assert len(list(second)) == shards.total


def test_close_ends_an_iterator_and_frees_its_stream_for_another(
    shards: ForeignShards, tmp_path: Path
) -> None:
    with ShardStream(url_of(shards), chunk_bytes=4096) as stream:
        it = iter(stream)
        next(it)
        it.close()  # type: ignore[attr-defined]
        with pytest.raises(StopIteration):
            next(it)
        assert len(list(stream)) == shards.total
