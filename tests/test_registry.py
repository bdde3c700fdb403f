"""The store registry (asyncstream/stores/_registry.py): the one place a URL's scheme is
read, and adding a store as one module and one registration."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncstream import EngineError, NotFoundError, ShardStream, ShardURLError, resolve_shards
from asyncstream.dataset._index import join_url
from asyncstream.engine._engine import Engine, EngineConfig
from asyncstream.stores._registry import (
    StoreKey,
    canonical_url,
    configure_store,
    is_served,
    register_store,
    registered_stores,
    scheme_of,
    unregister_store,
)
from asyncstream.stores._store import ChunkRequest

SHARDS, PER_SHARD = 4, 25


def _write_shards(folder: Path) -> dict[str, bytes]:
    """Plain tar shards of ``PER_SHARD`` samples each; returns every sample's bytes by key."""
    folder.mkdir()
    samples: dict[str, bytes] = {}
    for i in range(SHARDS):
        with tarfile.open(folder / f"shard-{i}.tar", "w") as tar:
            for j in range(PER_SHARD):
                key, data = f"{i:02d}{j:03d}", f"sample {i} {j} ".encode() * (j + 1)
                info = tarfile.TarInfo(f"{key}.txt")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                samples[key] = data
    return samples


@pytest.fixture
def tiny() -> Iterator[str]:
    """The tiny store of tests/_tinystore.py, registered for ``tiny://`` (the only line
    adding it takes), and unregistered after."""
    register_store("tiny", "tests._tinystore:TinyStore")
    yield "tiny"
    unregister_store("tiny")


def test_a_store_added_by_one_registration_is_read_end_to_end(tiny: str, tmp_path: Path) -> None:
    """A stream over ``tiny://`` URLs: resolved (listed) through the tiny store in this
    process, fetched through it in the engine's own process, every sample exactly once
    with exactly its bytes."""
    samples = _write_shards(tmp_path / "data")
    folder = f"tiny://{tmp_path / 'data'}/"
    shards = resolve_shards(folder)
    assert [s.url for s in shards] == [f"{folder}shard-{i}.tar" for i in range(SHARDS)]
    with ShardStream(
        folder, samples_per_shard=PER_SHARD, window=2, inflight=2, chunk_bytes=4 << 10, seed=3
    ) as stream:
        got = {x["__key__"]: bytes(x["txt"]) for x in stream}
        fetch = stream.stats()["fetch"]
    assert got == samples
    assert fetch["chunks"] > SHARDS  # read in several ranges, not whole


def test_a_stores_settings_reach_it_in_both_processes(tiny: str, tmp_path: Path) -> None:
    """``configure_store`` gives the tiny store the folder that its relative URLs are
    under: listed with it here, read with it in the engine's process (whose working folder
    is not ``tmp_path``); ``configure_store`` with no settings forgets them."""
    samples = _write_shards(tmp_path / "data")
    configure_store("tiny", root=str(tmp_path))
    try:
        shards = resolve_shards("tiny://data/")
        assert [s.url for s in shards] == [f"tiny://data/shard-{i}.tar" for i in range(SHARDS)]
        with ShardStream(
            "tiny://data/", samples_per_shard=PER_SHARD, window=2, inflight=2, seed=1
        ) as stream:
            got = {x["__key__"]: bytes(x["txt"]) for x in stream}
        assert got == samples
    finally:
        configure_store("tiny")
    with pytest.raises(NotFoundError, match="no such folder"):
        resolve_shards("tiny://data/")
    with pytest.raises(ShardURLError, match="no store is registered for the scheme 'nope'"):
        configure_store("nope", root="/")


def test_a_named_shard_of_a_registered_store_is_sized_by_it(tiny: str, tmp_path: Path) -> None:
    _write_shards(tmp_path / "data")
    url = f"tiny://{tmp_path / 'data' / 'shard-1.tar'}"
    [shard] = resolve_shards(url)
    assert (shard.url, shard.size) == (url, (tmp_path / "data" / "shard-1.tar").stat().st_size)
    assert canonical_url(url) == url


def test_an_unregistered_scheme_is_refused_naming_the_ones_there_are(tmp_path: Path) -> None:
    with pytest.raises(ShardURLError, match=r"unsupported scheme 'tiny'.*s3://"):
        resolve_shards(f"tiny://{tmp_path}/")
    register_store("tiny", "tests._tinystore:TinyStore")
    try:
        assert scheme_of(f"tiny://{tmp_path}/") == "tiny"
        assert ("tiny", "tests._tinystore:TinyStore") in registered_stores()
    finally:
        unregister_store("tiny")
    with pytest.raises(ShardURLError, match="unsupported scheme 'tiny'"):
        scheme_of(f"tiny://{tmp_path}/")


def test_schemes_paths_and_bad_registrations() -> None:
    assert scheme_of("s3://bucket/a.tar") == "s3"
    assert scheme_of("/abs/a.tar") == scheme_of("rel/a.tar") == scheme_of("file:///a") == "file"
    assert scheme_of("C:\\data\\a.tar") == "file"  # a Windows drive, not a scheme
    with pytest.raises(ShardURLError, match="empty"):
        scheme_of("")
    with pytest.raises(ValueError, match="file scheme"):
        register_store("file", "tests._tinystore:TinyStore")
    with pytest.raises(ValueError, match="module:Class"):
        register_store("tiny", "tests._tinystore.TinyStore")
    with pytest.raises(TypeError, match="Store subclass"):
        register_store("tiny", dict)  # type: ignore[arg-type]
    assert str(StoreKey("s3", "web")) == "s3:// at endpoint 'web'"
    assert StoreKey("s3") == StoreKey("s3", "")


def test_a_request_for_an_endpoint_the_engine_was_not_given_fails_naming_it(
    tmp_path: Path,
) -> None:
    """A store is opened on its first request; one that cannot be is that request's
    error, at the consumer (the engine goes on serving the others)."""
    data = tmp_path / "a.bin"
    data.write_bytes(b"x" * 100)
    engine = Engine(EngineConfig(), n_slots=1, slot_bytes=100, mode="thread")
    try:
        engine.submit([ChunkRequest(data.as_uri(), 0, 100, size=100, endpoint="nowhere")])
        with pytest.raises(EngineError, match="no endpoint named 'nowhere'"):
            engine.next()
        engine.submit([ChunkRequest(data.as_uri(), 0, 100, size=100)])
        ready = engine.next()
        assert bytes(engine.view(ready)) == b"x" * 100
        engine.release(ready.slot)
    finally:
        engine.close(wait=True)


def test_an_index_reference_is_joined_by_the_folder_s_store(tiny: str, tmp_path: Path) -> None:
    """Relative shard references of an index resolve against its folder as its store joins
    URLs; an absolute URL of a registered scheme is kept, any other is not served."""
    assert join_url("s3://bucket/a/b", "../c.tar") == "s3://bucket/a/c.tar"
    assert join_url(str(tmp_path / "a"), "../c.tar") == (tmp_path / "c.tar").as_uri()
    assert join_url("tiny:///data/a", "./b/../c.tar") == "tiny:///data/a/c.tar"
    assert join_url("s3://bucket/a", "tiny:///elsewhere/x.tar") == "tiny:///elsewhere/x.tar"
    assert is_served("tiny:///x.tar")
    assert not is_served("unregistered://bucket/x.tar")
