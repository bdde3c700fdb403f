"""Local reads: from the page cache on the event loop, else in a thread.

:class:`LocalStore` first asks for a range with ``RWF_NOWAIT``, which the kernel answers
only from the page cache; what it cannot answer at once is read in a thread. Files are
made cold for real, with ``posix_fadvise(DONTNEED)`` after ``fsync``, and a file system
without the flag is a real one (``/proc``).
"""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

from asyncstream import NotFoundError, ShardStream
from asyncstream.stores._localstore import LocalStore
from asyncstream.stores._store import ChunkRequest
from tests._foreign import write_foreign_shards
from tests._pagecache import evict
from tests.test_targroup import by_shard_and_key, webdataset_reads

MIB = 1 << 20


def _file(path: Path, size: int) -> bytes:
    data = random.Random(size).randbytes(size)
    path.write_bytes(data)
    return data


def _read(store: LocalStore, path: Path, sizes: list[int], offset: int = 0) -> list[bytes]:
    """One group read of consecutive chunks of ``sizes`` bytes at ``offset``; the chunks,
    each checked to have been handed over whole."""
    outs = [bytearray(n) for n in sizes]
    handed: list[int] = []
    request = ChunkRequest(path.as_uri(), offset, sum(sizes), None, True, size=path.stat().st_size)
    asyncio.run(store.read_group(request, [memoryview(b) for b in outs], handed.append))
    assert handed == list(range(len(sizes)))
    return [bytes(b) for b in outs]


def test_a_range_in_the_page_cache_is_read_on_the_loop(tmp_path: Path) -> None:
    data = _file(tmp_path / "warm.tar", 3 * MIB)
    store = LocalStore()
    chunks = _read(store, tmp_path / "warm.tar", [MIB, MIB, MIB // 2], offset=4096)
    assert b"".join(chunks) == data[4096 : 4096 + 5 * MIB // 2]
    assert store.stats() == {"transport": "local", "cached_reads": 1, "thread_reads": 0}


def test_a_cold_range_is_read_in_a_thread(tmp_path: Path) -> None:
    path = tmp_path / "cold.tar"
    data = _file(path, 2 * MIB)
    evict(path)
    store = LocalStore()
    assert b"".join(_read(store, path, [MIB, MIB])) == data
    assert (store.cached_reads, store.thread_reads) == (0, 1)
    assert store._inline  # the file system has the flag: later reads still try the cache


def test_a_range_cached_in_part_is_finished_in_a_thread(tmp_path: Path) -> None:
    """The page cache holds the group's first chunks, not its last: what it holds is read
    on the loop, the rest (from inside a chunk, wherever the cached part ends) in a
    thread, and every chunk is handed over whole."""
    path = tmp_path / "half.tar"
    data = _file(path, 8 * MIB)
    evict(path, warm=MIB)
    fd = os.open(path, os.O_RDONLY)
    try:  # what the page cache answers at once: the first MiB, inside the first chunk
        assert os.preadv(fd, [bytearray(8 * MIB)], 0, os.RWF_NOWAIT) == MIB
    finally:
        os.close(fd)
    store = LocalStore()
    chunks = _read(store, path, [1536 << 10, 1536 << 10, 5 * MIB])
    assert b"".join(chunks) == data
    assert (store.cached_reads, store.thread_reads) == (0, 1)


def test_a_file_system_without_the_flag_is_read_in_threads() -> None:
    """``/proc`` refuses ``RWF_NOWAIT``: the read goes to a thread, and the store stops
    asking for good."""
    path = Path("/proc/version")
    expected = path.read_bytes()[:16]
    store = LocalStore()
    outs = [bytearray(16)]
    request = ChunkRequest(path.as_uri(), 0, 16, None, True)
    asyncio.run(store.read_group(request, [memoryview(outs[0])], None))
    assert bytes(outs[0]) == expected
    assert not store._inline
    assert (store.cached_reads, store.thread_reads) == (0, 1)


def test_a_stream_over_local_files_reads_them_from_the_page_cache(tmp_path: Path) -> None:
    """Shards written by ``tarfile`` and ``webdataset.TarWriter``, read in small chunks
    (so most samples straddle one): every sample as webdataset's reader has it, and the
    engine's reads come from the page cache; after the files are evicted, an epoch reads
    them in threads, the same samples again."""
    shards = write_foreign_shards(tmp_path / "data", 4, seed=7, jpg_bytes=(2000, 30000))
    expected = webdataset_reads(shards.folder)
    with ShardStream(str(shards.folder), chunk_bytes=64 << 10, seed=3) as stream:
        assert by_shard_and_key(iter(stream)) == expected
        fetch = stream.stats()["fetch"]
        assert len(expected) == shards.total
        assert fetch["transport"] == "local"
        assert fetch["cached_reads"] >= 1
        assert fetch["thread_reads"] == 0
        for path in sorted(shards.folder.glob("*.tar")):
            evict(path)
        stream.set_epoch(1)
        assert by_shard_and_key(iter(stream)) == expected
        assert stream.stats()["fetch"]["thread_reads"] >= 1


def test_a_shard_deleted_after_the_listing_fails_at_once_naming_it(tmp_path: Path) -> None:
    """A local shard gone since the stream listed it is S3's 404: a NotFoundError naming
    it, raised at its first read, not retried through the retry budget as a failed
    connection."""
    shards = write_foreign_shards(tmp_path / "data", 3, seed=5)
    with ShardStream(str(shards.folder), seed=1, shuffle=False) as stream:
        gone = sorted(shards.folder.glob("*.tar"))[1]
        gone.unlink()
        with pytest.raises(NotFoundError, match=f"{gone.name}: not found") as caught:
            list(stream)
        assert gone.as_uri() in str(caught.value)
        assert "attempts" not in str(caught.value)  # not "giving up after N attempts"


def test_local_files_in_statefuldataloader_workers_read_as_webdataset_reads_them(
    tmp_path: Path,
) -> None:
    """Each DataLoader worker runs an engine of its own (in a thread of the worker): the
    same reads, cached or evicted first, give every sample once, as webdataset has it."""
    shards = write_foreign_shards(tmp_path / "data", 4, seed=8, jpg_bytes=(2000, 30000))
    expected = webdataset_reads(shards.folder)
    with ShardStream(str(shards.folder), chunk_bytes=64 << 10, seed=4) as stream:
        loader = StatefulDataLoader(stream, batch_size=None, num_workers=2)
        assert by_shard_and_key(iter(loader)) == expected
        for path in sorted(shards.folder.glob("*.tar")):
            evict(path)
        stream.set_epoch(1)
        assert by_shard_and_key(iter(loader)) == expected
