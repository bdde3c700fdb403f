"""The local disk cache tier (asyncstream/_cache.py, _cachedir.py), against the real S3
server behind a FaultProxy that counts the requests, on shards that pack did not write."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import random
import signal
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _cache_child import digest
from _procs import alive, engine_pids
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from asyncstream import LocalS3, ShardStream
from asyncstream.engine._cache import CachedStore, _waited
from asyncstream.engine._cachedir import _HEADER, HEADER_BYTES, CacheDir, chunk_key
from asyncstream.engine._engine import EngineConfig
from asyncstream.stores._localstore import LocalStore
from asyncstream.stores._store import ChunkRequest
from asyncstream.testing import FaultProxy
from tests._foreign import ForeignShards, write_foreign_shards
from tests._pagecache import evict
from tests.test_targroup import by_shard_and_key, webdataset_reads

HERE = Path(__file__).parent
CHILD = HERE / "_cache_child.py"
CHUNK = 8192  # small chunks: about a hundred of them, samples straddling their ends
# No hedges: a hedged chunk is requested twice, and these tests count requests exactly.
SETTINGS: dict[str, Any] = {
    "chunk_bytes": CHUNK,
    "window": 3,
    "inflight": 3,
    "seed": 7,
    "hedge": False,
}
UNIT = CHUNK + HEADER_BYTES  # one cached chunk file


def upload(s3: LocalS3, data: ForeignShards, bucket: str) -> str:
    client = s3.client()
    client.create_bucket(Bucket=bucket)
    for path in sorted(data.folder.glob("*.tar")):
        client.put_object(Bucket=bucket, Key=f"d/{path.name}", Body=path.read_bytes())
    return f"s3://{bucket}/d/"


@pytest.fixture(scope="module")
def data(s3_server: LocalS3, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Six foreign shards (about 100 chunks of 8 KiB) and their samples without a cache,
    epochs 0 and 1, read straight from the server."""
    shards = write_foreign_shards(tmp_path_factory.mktemp("cache"), 6, seed=5)
    url = upload(s3_server, shards, "cache-data")
    reference = {}
    with ShardStream(
        url, endpoint_url=s3_server.endpoint_url, samples_per_shard=shards.counts, **SETTINGS
    ) as stream:
        for epoch in (0, 1):
            stream.set_epoch(epoch)
            reference[epoch] = digests(stream)
    chunks = sum(-(-p.stat().st_size // CHUNK) for p in shards.folder.glob("*.tar"))
    return {"url": url, "shards": shards, "reference": reference, "chunks": chunks}


def digests(samples: Any) -> list[str]:
    return [digest(s) for s in samples]


def open_stream(
    data: dict[str, Any], proxy: FaultProxy, cache: Path | None, **kwargs: Any
) -> ShardStream:
    return ShardStream(
        data["url"],
        endpoint_url=proxy.endpoint_url,
        samples_per_shard=data["shards"].counts,
        cache_dir=cache,
        **{**SETTINGS, **kwargs},
    )


def gets(proxy: FaultProxy) -> int:
    return proxy.stats()["requests"]


def files(folder: Path, suffix: str) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name.endswith(suffix))


def folder_bytes(folder: Path) -> int:
    """Bytes of the cached chunks and of the chunks being written (a file removed or
    renamed after the listing counts nothing: it was counted, or is, under its new name)."""
    total = 0
    for name in os.listdir(folder):
        if name.endswith((".chunk", ".tmp")):
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(folder / name).st_size
    return total


# -- one process -------------------------------------------------------------------------


def test_second_epoch_zero_gets_identical_samples(
    data: dict[str, Any], proxy: FaultProxy, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    with open_stream(data, proxy, cache) as stream:
        stream.set_epoch(0)
        before = gets(proxy)
        assert digests(stream) == data["reference"][0]
        cold = stream.stats()["fetch"]["cache"]
        assert gets(proxy) - before == cold["misses"] == cold["writes"] == data["chunks"]
        assert cold["hits"] == 0
        stream.set_epoch(1)
        before = gets(proxy)
        assert digests(stream) == data["reference"][1]  # another order, the same bytes
        assert gets(proxy) == before  # not one request
        warm = stream.stats()["fetch"]["cache"]
        assert warm["hits"] == data["chunks"]
        assert warm["misses"] == cold["misses"]
        assert warm["checked"] == 0  # it wrote them itself, and they have not changed
        assert warm["loop_hits"] == data["chunks"]  # in the page cache: read on the loop
        total = sum(p.stat().st_size for p in data["shards"].folder.glob("*.tar"))
        assert warm["bytes_from_cache"] == total
    assert len(files(cache, ".chunk")) == data["chunks"]
    assert not files(cache, ".tmp")
    # A new stream (a new engine process) finds the same folder full, and checks it all,
    # in threads: a file is read on the loop only once this process has checked it.
    with open_stream(data, proxy, cache) as stream:
        stream.set_epoch(1)
        before = gets(proxy)
        assert digests(stream) == data["reference"][1]
        assert gets(proxy) == before
        fresh = stream.stats()["fetch"]["cache"]
        assert fresh["checked"] == data["chunks"]
        assert fresh["loop_hits"] == 0
        stream.set_epoch(0)  # now checked, and in the page cache: read on the loop
        assert digests(stream) == data["reference"][0]
        warm = stream.stats()["fetch"]["cache"]
        assert (warm["loop_hits"], warm["checked"]) == (data["chunks"], data["chunks"])
        assert gets(proxy) == before


def test_an_object_replaced_after_it_was_cached_is_read_anew(
    s3_server: LocalS3, proxy: FaultProxy, tmp_path: Path
) -> None:
    """A shard cached by one stream, then replaced in the bucket (other samples, another
    size and ETag): the next stream over the same cache folder reads the new version, from
    the server, and only that shard; the others still come from the cache."""
    shards = write_foreign_shards(tmp_path / "old", 3, seed=11)
    url = upload(s3_server, shards, "cache-replaced")
    names = sorted(p.name for p in shards.folder.glob("*.tar"))
    cache = tmp_path / "cache"
    # Counted once into an index cache of its own (keyed by size and ETag, as the chunk
    # cache): later streams make no counting GET but for a shard that changed.
    settings = {**SETTINGS, "index_cache": tmp_path / "index"}

    def read() -> tuple[list[str], dict[str, int]]:
        """One epoch with the cache on, and the GETs per object the server answered."""
        seen = len(proxy.requests())
        with ShardStream(url, endpoint_url=proxy.endpoint_url, cache_dir=cache, **settings) as st:
            got = digests(st)
        served: dict[str, int] = {}
        for method, path, _status in proxy.requests()[seen:]:
            if method == "GET" and path.endswith(".tar"):
                name = path.rsplit("/", 1)[1]
                served[name] = served.get(name, 0) + 1
        return got, served

    before, served = read()
    assert set(served) == set(names)  # the cold epoch fetched every shard
    assert read()[1] == {}  # ... and the warm one none
    new = write_foreign_shards(tmp_path / "new", 1, seed=12, prefix="other")
    (new_tar,) = new.folder.glob("*.tar")
    s3_server.client().put_object(
        Bucket="cache-replaced", Key=f"d/{names[1]}", Body=new_tar.read_bytes()
    )
    after, served = read()
    assert set(served) == {names[1]}  # the replaced shard from the server, the rest cached
    with ShardStream(url, endpoint_url=s3_server.endpoint_url, **settings) as stream:
        assert after == digests(stream)  # what the bucket holds now, without a cache
    assert after != before
    assert len(after) == shards.total - shards.counts[1] + new.total


def test_over_https_and_in_workers_cached_hits_read_as_webdataset_reads_them(
    data: dict[str, Any], s3_tls_server: LocalS3, tmp_path: Path
) -> None:
    """The cache in front of S3 over HTTPS, shards written by ``tarfile`` and
    ``webdataset.TarWriter``: the cold epoch fills it, the next is every chunk a hit read
    on the loop; ``StatefulDataLoader`` workers, each with its engine, read from the same
    folder; every epoch gives the samples webdataset's reader has."""
    expected = webdataset_reads(data["shards"].folder)
    settings = {**SETTINGS, "samples_per_shard": data["shards"].counts}
    cache = tmp_path / "cache"
    with ShardStream(data["url"], s3=s3_tls_server.options(), cache_dir=cache, **settings) as s:
        assert by_shard_and_key(iter(s)) == expected
        assert s.stats()["fetch"]["stores"][0]["tls"]
        s.set_epoch(1)
        assert by_shard_and_key(iter(s)) == expected
        warm = s.stats()["fetch"]["cache"]
        assert warm["hits"] == warm["loop_hits"] == data["chunks"]
        loader = StatefulDataLoader(s, batch_size=None, num_workers=2)
        s.set_epoch(2)
        assert by_shard_and_key(iter(loader)) == expected


def test_dataloader_workers_hit_on_every_epoch_whatever_the_split(
    data: dict[str, Any], proxy: FaultProxy, tmp_path: Path
) -> None:
    """DataLoader workers' shares begin mid-shard, at points that move with each epoch's
    shard permutation: their first chunks are not on the chunk grid. They are served from
    the grid chunk that holds them, so the next epoch still makes no request."""
    expected = {}
    with open_stream(data, proxy, None) as stream:
        loader = DataLoader(stream, batch_size=None, num_workers=2)
        for epoch in (0, 1):
            stream.set_epoch(epoch)
            expected[epoch] = digests(loader)
    with open_stream(data, proxy, tmp_path / "cache") as stream:
        loader = DataLoader(stream, batch_size=None, num_workers=2)
        stream.set_epoch(0)
        assert digests(loader) == expected[0]
        before = gets(proxy)
        stream.set_epoch(1)
        assert digests(loader) == expected[1]
        assert gets(proxy) == before


def test_eviction_keeps_the_folder_under_the_limit(
    data: dict[str, Any], proxy: FaultProxy, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    limit = 12 * UNIT  # an eighth of the dataset
    with open_stream(data, proxy, cache, cache_limit=limit) as stream:
        for epoch in (0, 1):
            stream.set_epoch(epoch)
            before = gets(proxy)
            samples = []
            for sample in stream:
                samples.append(digest(sample))
                assert folder_bytes(cache) <= limit
            assert samples == data["reference"][epoch]
            stats = stream.stats()["fetch"]["cache"]
            assert gets(proxy) - before > data["chunks"] // 2  # evicted chunks fetched again
        assert stats["evictions"] >= 2 * data["chunks"] - 12
        assert stats["hits"] + stats["misses"] == 2 * data["chunks"]
        assert stats["evicted_bytes"] <= stats["evictions"] * UNIT
    assert folder_bytes(cache) <= limit
    assert not files(cache, ".tmp")


def test_least_recently_used_chunks_go_first(tmp_path: Path) -> None:
    folder = CacheDir(str(tmp_path), 4 * (HEADER_BYTES + 100))
    folder.open()
    try:
        keys = [hashlib.sha256(bytes([i])).digest() for i in range(5)]
        for i, key in enumerate(keys[:4]):
            assert folder.write(key, memoryview(bytes([i]) * 100))
            os.utime(folder.file(key), ns=(i * 10**9, i * 10**9))  # written in this order
        out = bytearray(100)
        assert folder.read(keys[0], memoryview(out)) == "hit"  # keys[0] now most recent
        assert folder.write(keys[4], memoryview(b"x" * 100))
        assert [folder.read(k, memoryview(out)) for k in keys] == [
            "hit",
            "miss",
            "miss",
            "hit",
            "hit",
        ]
        assert folder.evictions == 2  # one for room, one for the twentieth of slack
    finally:
        folder.close()


def test_a_hit_is_read_on_the_loop_only_when_checked_and_in_the_page_cache(
    tmp_path: Path,
) -> None:
    """``CacheDir.read_now`` answers at once only for a file this process has checked (or
    written), as it is, whose bytes the page cache holds; every other case is left to
    ``read`` (in a thread), which checks, serves or drops as before."""
    key, other = hashlib.sha256(b"a").digest(), hashlib.sha256(b"b").digest()
    payload = bytes(range(256)) * 64  # 16 KiB
    out = memoryview(bytearray(len(payload)))
    writer = CacheDir(str(tmp_path), None)
    writer.open()
    try:
        assert writer.read_now(other, out) == "miss"  # no file: a miss, at once
        assert writer.write(key, memoryview(payload))
        assert writer.read_now(key, out) == "hit"  # written here: trusted, cached
        assert bytes(out) == payload
    finally:
        writer.close()
    reader = CacheDir(str(tmp_path), None)  # another process's view: nothing checked yet
    reader.open()
    try:
        assert reader.read_now(key, out) is None  # its CRC to check first: in a thread
        assert reader.checked == 0
        out[:] = bytes(len(payload))
        assert reader.read(key, out) == "hit"
        assert reader.checked == 1
        assert reader.read_now(key, out) == "hit"
        assert bytes(out) == payload
        evict(Path(reader.file(key)))
        assert reader.read_now(key, out) is None  # on the disk only: in a thread
        assert reader.read(key, out) == "hit"
        assert reader.checked == 1  # trusted still: not checked again
        assert reader.read_now(key, out) == "hit"  # read back into the page cache
        with open(reader.file(key), "r+b") as f:  # written to since: checked again
            f.seek(HEADER_BYTES + 10)
            f.write(b"\x00")
        os.utime(reader.file(key), ns=(0, 0))  # not within the clock's tick (see _cachedir)
        assert reader.read_now(key, out) is None
        assert reader.read(key, out) == "bad"  # and dropped by read, as before
        assert reader.read_now(key, out) == "miss"
        os.symlink(tmp_path / ".key", reader.file(other))
        assert reader.read_now(other, out) is None  # a symlink: read drops it
        assert reader.read(other, out) == "bad"
        assert not os.path.lexists(reader.file(other))
    finally:
        reader.close()


def corrupt(chunks: list[Path]) -> None:
    """Damage four chunk files four ways; move a fifth over a sixth."""
    flipped, truncated, header, swapped, other = chunks[:5]
    with open(flipped, "r+b") as f:  # one byte in the middle of the payload
        f.seek(HEADER_BYTES + 1000)
        byte = f.read(1)
        f.seek(HEADER_BYTES + 1000)
        f.write(bytes([byte[0] ^ 0x40]))
    os.truncate(truncated, truncated.stat().st_size // 2)
    with open(header, "r+b") as f:  # the stored length
        f.seek(8)
        f.write(b"\xff")
    os.replace(other, swapped)  # a valid file under another chunk's name


@pytest.mark.parametrize("reader", ["the same stream", "a new stream"])
def test_corrupted_and_truncated_files_are_dropped_and_fetched_again(
    data: dict[str, Any], proxy: FaultProxy, tmp_path: Path, reader: str
) -> None:
    """Whether the reader has checked the files before (it wrote them: the same stream's
    next epoch) or not (a new stream), a damaged file is never served."""
    cache = tmp_path / "cache"
    with contextlib.ExitStack() as stack:
        stream = stack.enter_context(open_stream(data, proxy, cache))
        stream.set_epoch(0)
        assert digests(stream) == data["reference"][0]
        if reader == "a new stream":
            stack.close()
            stream = stack.enter_context(open_stream(data, proxy, cache))
        else:
            time.sleep(0.05)  # past the kernel's file clock tick (see _cachedir.py)
        corrupt(files(cache, ".chunk"))
        stats0 = stream.stats().get("fetch", {}).get("cache", {})
        stream.set_epoch(1)
        before = gets(proxy)
        assert digests(stream) == data["reference"][1]  # never served
        stats = stream.stats()["fetch"]["cache"]
        assert stats["dropped"] == 4
        assert gets(proxy) - before == stats["misses"] - stats0.get("misses", 0) == 5
        stream.set_epoch(2)
        before = gets(proxy)
        digests(stream)
        assert gets(proxy) == before  # written again, whole
    assert len(files(cache, ".chunk")) == data["chunks"]


def test_resume_from_a_state_with_the_cache_on(
    data: dict[str, Any], proxy: FaultProxy, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    with open_stream(data, proxy, cache) as stream:
        stream.set_epoch(0)
        digests(stream)  # fills the cache
        stream.set_epoch(1)
        it = iter(stream)
        head = [digest(next(it)) for _ in range(40)]
        state = json.loads(json.dumps(stream.state_dict()))
    with open_stream(data, proxy, cache) as stream:
        before = gets(proxy)  # after the listing
        stream.load_state_dict(state)
        assert head + digests(stream) == data["reference"][1]
        # Samples here are smaller than a chunk: a carried one's earlier bytes lie in one
        # grid chunk, which is cached too.
        assert gets(proxy) == before


def test_no_descriptor_or_task_leaks_over_epochs(
    data: dict[str, Any], proxy: FaultProxy, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"

    def cache_files(pid: int) -> list[str]:
        """The files of the cache folder that the engine process holds open."""
        found = []
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):  # closed meanwhile
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith(str(cache)):
                    found.append(os.path.basename(target))
        return found

    with open_stream(data, proxy, cache, cache_limit=30 * UNIT) as stream:
        tasks = []
        for epoch in range(4):
            stream.set_epoch(epoch)
            digests(stream)
            (engine,) = engine_pids()
            fetch = stream.stats()["fetch"]
            # the ledger, and the folder itself (every name is resolved in it)
            assert sorted(cache_files(engine)) == [".ledger", "cache"]
            tasks.append(fetch["tasks"])
        assert fetch["cache"]["evictions"] > 0  # evictions, writes and hits all ran
        assert fetch["cache"]["hits"] > 0
        assert tasks == tasks[:1] * 4
    deadline = time.monotonic() + 15
    while alive(engine) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(engine)


# -- the store on its own, over local files ----------------------------------------------


@pytest.fixture
def shard_file(tmp_path: Path) -> tuple[str, bytes]:
    payload = random.Random(3).randbytes(10_000)
    path = tmp_path / "object.bin"
    path.write_bytes(payload)
    return path.as_uri(), payload


def request(url: str, payload: bytes, offset: int, length: int) -> ChunkRequest:
    return ChunkRequest(
        url, offset, length, "etag-1", offset + length >= len(payload), len(payload)
    )


async def test_a_request_off_the_grid_is_served_from_its_grid_chunk(
    shard_file: tuple[str, bytes], tmp_path: Path
) -> None:
    url, payload = shard_file
    store = await CachedStore(LocalStore(), str(tmp_path / "c"), grid=4096).open()
    try:
        slot = memoryview(bytearray(4096))
        for offset, length in ((5000, 3192), (4096, 4096), (8500, 1500), (8192, 1808)):
            await store.read_into(request(url, payload, offset, length), slot)
            assert bytes(slot[:length]) == payload[offset : offset + length]
        assert store.stats()["cache"]["misses"] == 2  # [4096, 8192) and [8192, 10000)
        assert store.stats()["cache"]["hits"] == 2
        assert len(files(tmp_path / "c", ".chunk")) == 2
        # Spanning two grid chunks (a resumed lane's first read): read through, not cached.
        await store.read_into(request(url, payload, 3000, 4096), slot)
        assert bytes(slot) == payload[3000:7096]
        assert len(files(tmp_path / "c", ".chunk")) == 2
        # No version known: never cached.
        await store.read_into(ChunkRequest(url, 0, 4096), slot)
        assert bytes(slot) == payload[:4096]
        assert len(files(tmp_path / "c", ".chunk")) == 2
    finally:
        await store.aclose()


def test_the_key_names_the_object_version_and_the_range() -> None:
    base = ChunkRequest("s3://b/k", 0, 100, "e1", True, 100)
    keys = {
        chunk_key(r)
        for r in (
            base,
            ChunkRequest("s3://b/k2", 0, 100, "e1", True, 100),
            ChunkRequest("s3://b/k", 0, 100, "e2", True, 100),
            ChunkRequest("s3://b/k", 1, 100, "e1", True, 100),
            ChunkRequest("s3://b/k", 0, 99, "e1", True, 100),
            ChunkRequest("s3://b/k", 0, 100, None, True, 100),
            ChunkRequest("s3://b/k", 0, 100, None, True, 101),
        )
    }
    assert len(keys) == 7
    assert chunk_key(ChunkRequest("s3://b/k", 0, 100, "e1", False, 100)) == chunk_key(base)
    assert chunk_key(ChunkRequest("s3://b/k", 0, 100)) is None


def test_a_chunk_larger_than_the_limit_is_not_cached(tmp_path: Path) -> None:
    folder = CacheDir(str(tmp_path), 1000)
    folder.open()
    try:
        assert not folder.write(b"k" * 32, memoryview(bytes(1000)))
        assert not files(tmp_path, ".chunk")
        assert folder.write(b"k" * 32, memoryview(bytes(1000 - HEADER_BYTES)))
    finally:
        folder.close()


def test_a_temporary_file_is_a_live_writer_until_it_is_stale(tmp_path: Path) -> None:
    folder = CacheDir(str(tmp_path), None)
    folder.open()
    try:
        key = b"k" * 32
        tmp = Path(folder.file(key, ".tmp"))
        tmp.write_bytes(b"half a chunk")
        assert not folder.write(key, memoryview(b"x" * 100))  # someone is writing it
        assert tmp.exists()
        old = time.time() - 120
        os.utime(tmp, (old, old))  # ... or was, a minute ago, and died
        assert folder.write(key, memoryview(b"x" * 100))
        assert not tmp.exists()
        assert folder.stale_removed == 1
        out = bytearray(100)
        assert folder.read(key, memoryview(out)) == "hit"
        assert out == b"x" * 100
    finally:
        folder.close()


def test_opening_the_folder_sweeps_it_at_most_once_a_minute(tmp_path: Path) -> None:
    """An orphaned temporary file (its writer died, nobody reads its chunk again) goes at
    the next opening a minute on; engines start often, and a sweep stats every file."""
    old = time.time() - 120

    def orphan(name: str) -> Path:
        path = tmp_path / f"{name}.tmp"
        path.write_bytes(b"x" * 100)
        os.utime(path, (old, old))
        return path

    def opened() -> CacheDir:
        folder = CacheDir(str(tmp_path), None)
        folder.open()
        folder.close()
        return folder

    first = orphan("a")
    assert opened().stale_removed == 1  # no ledger yet: swept
    assert not first.exists()
    second = orphan("b")
    assert opened().stale_removed == 0  # swept a moment ago
    assert second.exists()
    ledger = tmp_path / ".ledger"
    with open(ledger, "r+b") as f:  # the last sweep, a minute ago
        f.seek(8)
        f.write(struct.pack("<d", old))
    assert opened().stale_removed == 1
    assert not second.exists()


async def test_a_cancelled_read_waits_for_its_thread() -> None:
    """The thread reads or writes a ring slot: the slot may be refilled only after it ends."""
    finished = threading.Event()
    started = threading.Event()

    def work() -> None:
        started.set()
        time.sleep(0.3)
        finished.set()

    task = asyncio.ensure_future(_waited(work))
    await asyncio.get_running_loop().run_in_executor(None, started.wait)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert finished.is_set()


async def test_the_store_leaks_no_descriptor(shard_file: tuple[str, bytes], tmp_path: Path) -> None:
    url, payload = shard_file

    def descriptors() -> int:
        return len(os.listdir("/proc/self/fd"))

    async def session(limit: int | None) -> None:
        store = await CachedStore(LocalStore(), str(tmp_path / "c"), grid=1000, limit=limit).open()
        try:
            slot = memoryview(bytearray(1000))
            for offset in range(0, len(payload), 1000):
                await store.read_into(request(url, payload, offset, 1000), slot)
        finally:
            await store.aclose()

    await session(None)
    before = descriptors()
    for limit in (None, 3000):  # hits, then evictions
        await session(limit)
    assert descriptors() == before


def test_arguments_are_validated(data: dict[str, Any], tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_bytes(b"")
    cases: list[tuple[dict[str, Any], str]] = [
        ({"cache_limit": 10}, "cache_limit"),
        ({"cache_dir": tmp_path, "cache_limit": 0}, "cache_limit"),
        ({"cache_dir": tmp_path, "cache_limit": True}, "cache_limit"),
        ({"cache_dir": tmp_path, "cache_limit": "1GB"}, "cache_limit"),
        ({"cache_dir": 3}, "cache_dir"),
        ({"cache_dir": ""}, "cache_dir"),
        ({"cache_dir": a_file}, "cache_dir"),
        ({"cache_dir": a_file / "sub"}, "cache_dir"),
    ]
    for kwargs, name in cases:
        with pytest.raises(ValueError, match=name):
            ShardStream(str(data["shards"].folder), **kwargs)
    with pytest.raises(ValueError, match="cache_limit"):
        EngineConfig(cache_limit=10)
    with ShardStream(str(data["shards"].folder), cache_dir=tmp_path / "new" / "cache"):
        assert (tmp_path / "new" / "cache").is_dir()


# -- several processes -------------------------------------------------------------------


def child(settings: dict[str, Any], **popen: Any) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    return subprocess.Popen(
        [sys.executable, str(CHILD), json.dumps(settings)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        **popen,
    )


def events(proc: subprocess.Popen[str]) -> Iterator[dict[str, Any]]:
    assert proc.stdout is not None
    for line in proc.stdout:
        yield json.loads(line)


def read_settings(
    data: dict[str, Any], proxy: FaultProxy, cache: Path, **extra: Any
) -> dict[str, Any]:
    return {
        "role": "read",
        "url": data["url"],
        "endpoint_url": proxy.endpoint_url,
        "counts": data["shards"].counts,
        "cache_dir": str(cache),
        "stream": SETTINGS,
        "epochs": [1],
        **extra,
    }


def finish(proc: subprocess.Popen[str]) -> list[dict[str, Any]]:
    """The rest of a child's reports, once it has exited cleanly."""
    reports = list(events(proc))
    assert proc.wait(60) == 0
    assert reports[-1]["event"] == "done"
    return reports


@pytest.mark.timeout(180)
def test_two_processes_share_one_cache(
    data: dict[str, Any], proxy: FaultProxy, tmp_path: Path
) -> None:
    """A reads three quarters of the epoch and waits; B starts then, and both go on at
    once. Everything A had read is on disk for B; what neither had is fetched by one or
    both (never more than twice), and both read exactly the uncached stream's samples."""
    cache = tmp_path / "cache"
    pause = len(data["reference"][1]) * 3 // 4
    before = gets(proxy)
    with child(read_settings(data, proxy, cache, pause_after=pause)) as a:
        assert next(events(a))["event"] == "paused"
        with child(read_settings(data, proxy, cache)) as b:
            assert a.stdin is not None
            a.stdin.write("go\n")
            a.stdin.flush()
            (epoch_b, *_), (epoch_a, *_) = finish(b), finish(a)
    for report in (epoch_a, epoch_b):
        assert report["samples"] == data["reference"][1]
    hits_b, misses_a, misses_b = (
        epoch_b["cache"]["hits"],
        epoch_a["cache"]["misses"],
        epoch_b["cache"]["misses"],
    )
    assert gets(proxy) - before == misses_a + misses_b + 2  # and a listing each
    assert hits_b > data["chunks"] // 2  # the second mostly hits
    assert hits_b + misses_b == data["chunks"]
    assert epoch_a["cache"]["hits"] + misses_a == data["chunks"]
    assert not files(cache, ".tmp")
    assert len(files(cache, ".chunk")) == data["chunks"]


@pytest.mark.timeout(180)
def test_two_processes_evicting_in_one_small_cache(
    data: dict[str, Any], proxy: FaultProxy, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    limit = 20 * UNIT
    settings = read_settings(data, proxy, cache, cache_limit=limit, epochs=[0, 1])
    with child(settings) as a, child(settings) as b:
        reports = [finish(a), finish(b)]
    for report in reports:
        assert [e["samples"] for e in report[:2]] == [data["reference"][0], data["reference"][1]]
    assert sum(report[1]["cache"]["evictions"] for report in reports) > 0
    assert folder_bytes(cache) <= limit
    assert not files(cache, ".tmp")
    with open_stream(data, proxy, cache, cache_limit=limit) as stream:  # all still valid
        stream.set_epoch(1)
        assert digests(stream) == data["reference"][1]
        assert stream.stats()["fetch"]["cache"]["dropped"] == 0


@pytest.mark.timeout(120)
def test_a_failing_disk_never_fails_the_read(
    data: dict[str, Any], proxy: FaultProxy, tmp_path: Path
) -> None:
    """The engine may write no file over 64 bytes (RLIMIT_FSIZE, as a full disk): every write
    fails, is counted and logged once, and every sample is still exact."""
    cache = tmp_path / "cache"
    settings = read_settings(data, proxy, cache, fsize_limit=HEADER_BYTES, epochs=[1])
    with child(settings, stderr=subprocess.PIPE) as proc:
        stdout, stderr = proc.communicate(timeout=100)
    assert proc.returncode == 0, stderr
    report, done = (json.loads(line) for line in stdout.splitlines())
    assert done["event"] == "done"
    assert report["samples"] == data["reference"][1]
    assert report["cache"]["write_failures"] == report["cache"]["misses"] == data["chunks"]
    assert report["cache"]["writes"] == 0
    assert stderr.count("writing failed") == 1, stderr
    assert not files(cache, ".tmp")
    assert not files(cache, ".chunk")


@pytest.fixture(scope="module")
def big(s3_server: LocalS3, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two shards of about 7 MB, read in 4 MiB chunks: writes long enough to be killed in."""
    shards = write_foreign_shards(
        tmp_path_factory.mktemp("big"), 0, counts=[14, 14], jpg_bytes=(400_000, 600_000)
    )
    url = upload(s3_server, shards, "cache-big")
    chunk = 4 << 20
    settings = {"chunk_bytes": chunk, "window": 2, "inflight": 2, "seed": 0, "hedge": False}
    with ShardStream(
        url, endpoint_url=s3_server.endpoint_url, samples_per_shard=shards.counts, **settings
    ) as stream:
        reference = digests(stream)
    chunks = sum(-(-p.stat().st_size // chunk) for p in shards.folder.glob("*.tar"))
    return {
        "url": url,
        "shards": shards,
        "settings": settings,
        "reference": reference,
        "chunks": chunks,
    }


def open_big(big: dict[str, Any], proxy: FaultProxy, cache: Path) -> ShardStream:
    return open_stream(big, proxy, cache, **big["settings"])


def complete(path: Path) -> bool:
    """Whether a chunk file holds its whole payload (its CRC checks)."""
    data = path.read_bytes()
    if len(data) < HEADER_BYTES:  # killed before it was extended to its size
        return False
    _, length, crc, _ = _HEADER.unpack(data[:HEADER_BYTES])
    return len(data) == HEADER_BYTES + length and zlib.crc32(data[HEADER_BYTES:]) == crc


def kill_mid_write(big: dict[str, Any], endpoint: str, cache: Path) -> Path:
    """SIGKILL a process writing chunks into ``cache`` until one dies mid-write; returns
    the temporary file it left, cut short."""
    rng = random.Random(0)
    settings = {
        "role": "write",
        "url": big["url"],
        "endpoint_url": endpoint,
        "folder": str(big["shards"].folder),
        "cache_dir": str(cache),
        "grid": big["settings"]["chunk_bytes"],
    }
    for _ in range(60):  # each kill lands mid-write about one time in three
        with child(settings) as proc:
            assert next(events(proc))["event"] == "writing"
            time.sleep(rng.uniform(0.01, 0.05))
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(10) == -signal.SIGKILL
        for final in files(cache, ".chunk"):
            final.unlink()  # killed between the rename and the loop's unlink
        for left in files(cache, ".tmp"):
            if not complete(left):
                return left
            left.unlink()  # killed after its write, before its rename: not what we want
    pytest.fail("no SIGKILL in 60 landed in the middle of a write")


@pytest.mark.timeout(180)
def test_a_crash_mid_write_is_never_served_and_is_cleaned_up(
    big: dict[str, Any], proxy: FaultProxy, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    partial = kill_mid_write(big, proxy.endpoint_url, cache)
    chunks = big["chunks"]

    def read(expect_gets: int) -> dict[str, Any]:
        with open_big(big, proxy, cache) as stream:
            before = gets(proxy)
            assert digests(stream) == big["reference"]
            assert gets(proxy) - before == expect_gets
            stats: dict[str, Any] = stream.stats()["fetch"]["cache"]
            return stats

    # Young, it may be a live writer's: left alone, and its chunk is fetched, not served.
    stats = read(expect_gets=chunks)
    assert partial.exists()
    assert stats["writes"] == chunks - 1
    # A minute on, it is a dead writer's: the next reader's sweep removes it.
    old = time.time() - 120
    os.utime(partial, (old, old))
    stats = read(expect_gets=1)
    assert stats["stale_removed"] == 1
    assert not files(cache, ".tmp")
    assert read(expect_gets=0)["hits"] == chunks


@pytest.mark.timeout(120)
def test_a_partial_file_in_place_is_dropped(
    big: dict[str, Any], proxy: FaultProxy, tmp_path: Path
) -> None:
    """What a non-atomic writer would leave: a killed write's file under the final name."""
    cache = tmp_path / "cache"
    partial = kill_mid_write(big, proxy.endpoint_url, cache)
    os.replace(partial, partial.with_suffix(".chunk"))
    with open_big(big, proxy, cache) as stream:
        assert digests(stream) == big["reference"]
        assert stream.stats()["fetch"]["cache"]["dropped"] == 1
