"""Trust boundaries of the local caches (issue 28, item 2, and item 4's index cache key):
what another user who can write into a cache folder, or plant files in it, can make the
reader do. Real folders and files; "another user" is uid 65534 (``nobody``), which the
tests, run as root, can chown to."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import random
import sqlite3
import stat
import struct
import threading
import zlib
from pathlib import Path

import pytest

from asyncstream.dataset._index_cache import CACHE_FILE, IndexCache
from asyncstream.engine import _cachedir
from asyncstream.engine._cache import CachedStore, cache_options
from asyncstream.engine._cachedir import HEADER_BYTES, CacheDir, chunk_key
from asyncstream.shards._urls import Shard
from asyncstream.stores._localstore import LocalStore
from asyncstream.stores._store import ChunkRequest

NOBODY = 65534
GRID = 4096
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


@pytest.fixture
def shard_file(tmp_path: Path) -> tuple[str, bytes]:
    payload = random.Random(28).randbytes(3 * GRID)
    path = tmp_path / "object.bin"
    path.write_bytes(payload)
    return path.as_uri(), payload


def first_chunk(url: str, payload: bytes) -> ChunkRequest:
    return ChunkRequest(url, 0, GRID, "etag-1", False, len(payload))


def forged(key: bytes, payload: bytes) -> bytes:
    """A chunk file as anyone can make it from the library's source: the format's magic
    and header, the chunk's public identity, a CRC that matches the forged payload."""
    header = struct.pack("<8sQI4x32s8x", _cachedir._MAGIC, len(payload), zlib.crc32(payload), key)
    return header + payload


async def read_once(folder: Path, request: ChunkRequest) -> tuple[bytes, dict[str, int]]:
    """One read through a fresh cache store (a new process, as far as trust goes)."""
    store = await CachedStore(LocalStore(), str(folder), grid=GRID).open()
    try:
        slot = memoryview(bytearray(GRID))
        await store.read_into(request, slot)
        return bytes(slot), store.stats()["cache"]
    finally:
        await store.aclose()


def chunks(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name.endswith(".chunk"))


# -- the folder ----------------------------------------------------------------------------


@needs_root
def test_a_folder_of_another_user_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o700)
    os.chown(folder, NOBODY, NOBODY)
    with pytest.raises(ValueError, match=rf"owned by uid {NOBODY}.*chown"):
        cache_options(folder, None)
    with pytest.raises(OSError, match="owned by uid"):
        CacheDir(str(folder), None).open()
    assert os.listdir(folder) == []  # nothing created in it


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777])
def test_a_folder_writable_by_group_or_others_is_refused(tmp_path: Path, mode: int) -> None:
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(mode)
    with pytest.raises(ValueError, match=r"writable by group or others.*chmod 700"):
        cache_options(folder, None)
    with pytest.raises(OSError, match="writable by group or others"):
        CacheDir(str(folder), None).open()
    assert os.listdir(folder) == []


def test_a_planted_ledger_symlink_is_never_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious data, keep me")
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    (folder / ".ledger").symlink_to(victim)
    with pytest.raises(ValueError, match=r"\.ledger"):
        cache_options(folder, None)
    cache = CacheDir(str(folder), None)
    with contextlib.suppress(OSError):
        cache.open()
    cache.close()
    assert victim.read_bytes() == b"precious data, keep me"


def test_the_default_folder_is_per_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ASYNCSTREAM_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    path, _ = cache_options(True, None)
    assert path == str(tmp_path / "xdg" / "asyncstream" / "chunks")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    monkeypatch.setenv("ASYNCSTREAM_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_options(True, None)[0] == str(tmp_path / "mine" / "chunks")
    docs = Path(__file__).parent.parent / "docs"
    for page in ("cache.md", "configuration.md"):
        assert "/tmp/asyncstream-cache" not in (docs / page).read_text()


# -- the files in it -----------------------------------------------------------------------


async def test_a_forged_chunk_is_never_served(
    tmp_path: Path, shard_file: tuple[str, bytes]
) -> None:
    """The reviewer's attack: a chunk file with a valid header and CRC, under the name
    the chunk's URL, ETag and range give, planted before the first read."""
    url, payload = shard_file
    folder = tmp_path / "cache"
    cache_options(folder, None)
    request = first_chunk(url, payload)
    key = chunk_key(request)
    assert key is not None
    (folder / f"{key[:16].hex()}.chunk").write_bytes(forged(key, b"\x66" * GRID))
    served, stats = await read_once(folder, request)
    assert served == payload[:GRID]
    assert stats["hits"] == 0


async def test_a_chunk_file_overwritten_with_a_forgery_is_dropped(
    tmp_path: Path, shard_file: tuple[str, bytes]
) -> None:
    """Files the cache wrote, each replaced by a forgery under its own name (the folder's
    listing gives the names): dropped, counted, fetched again."""
    url, payload = shard_file
    folder = tmp_path / "cache"
    request = first_chunk(url, payload)
    await read_once(folder, request)  # cached
    key = chunk_key(request)
    assert key is not None
    (written,) = chunks(folder)
    written.write_bytes(forged(key, b"\x66" * GRID))
    served, stats = await read_once(folder, request)
    assert served == payload[:GRID]
    assert (stats["hits"], stats["dropped"], stats["writes"]) == (0, 1, 1)
    served, stats = await read_once(folder, request)  # written again, whole
    assert served == payload[:GRID]
    assert stats["hits"] == 1


@needs_root
async def test_a_chunk_file_of_another_user_is_dropped(
    tmp_path: Path, shard_file: tuple[str, bytes]
) -> None:
    url, payload = shard_file
    folder = tmp_path / "cache"
    request = first_chunk(url, payload)
    await read_once(folder, request)
    (written,) = chunks(folder)
    os.chown(written, NOBODY, NOBODY)  # a valid chunk, but not this user's file
    served, stats = await read_once(folder, request)
    assert served == payload[:GRID]
    assert (stats["hits"], stats["dropped"]) == (0, 1)
    (again,) = chunks(folder)
    assert again.stat().st_uid == os.geteuid()


async def test_a_symlinked_chunk_file_is_never_followed(
    tmp_path: Path, shard_file: tuple[str, bytes]
) -> None:
    url, payload = shard_file
    folder = tmp_path / "cache"
    request = first_chunk(url, payload)
    await read_once(folder, request)
    (written,) = chunks(folder)
    elsewhere = tmp_path / "elsewhere"
    os.replace(written, elsewhere)  # a valid file, reached through a link
    written.symlink_to(elsewhere)
    served, stats = await read_once(folder, request)
    assert served == payload[:GRID]
    assert (stats["hits"], stats["dropped"]) == (0, 1)
    assert not chunks(folder)[0].is_symlink()  # the link went; the chunk was written anew
    assert elsewhere.stat().st_size == HEADER_BYTES + GRID  # the target left alone


def test_the_secret_is_made_once_private_even_by_racing_openers(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    barrier = threading.Barrier(6)
    opened: list[CacheDir] = []

    def open_one() -> None:
        cache = CacheDir(str(folder), None)
        barrier.wait()
        cache.open()
        opened.append(cache)

    threads = [threading.Thread(target=open_one) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        key = hashlib.sha256(b"chunk").digest()
        assert len({cache.file(key) for cache in opened}) == 1  # one secret for all
        assert opened[0].write(key, memoryview(b"x" * 100))
        out = bytearray(100)
        assert all(cache.read(key, memoryview(out)) == "hit" for cache in opened)
    finally:
        for cache in opened:
            cache.close()
    secret = folder / ".key"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert len(secret.read_bytes()) == 32
    # A secret others could read is replaced: what it named is no longer trusted.
    secret.chmod(0o644)
    cache = CacheDir(str(folder), None)
    cache.open()
    try:
        assert cache.read(key, memoryview(out)) == "miss"
    finally:
        cache.close()
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600


# -- the index cache -----------------------------------------------------------------------


def s3(i: int) -> Shard:
    return Shard(f"s3://bkt/shard-{i:04d}.tar", 1000, '"e"')


def refused(folder: Path, caplog: pytest.LogCaptureFixture, match: str) -> None:
    cache = IndexCache(folder)
    with caplog.at_level(logging.WARNING, logger="asyncstream"):
        cache.put([(s3(0), 10)])
        assert cache.get([s3(0)]) == {}
    cache.close()
    assert not (folder / CACHE_FILE).exists() or (folder / CACHE_FILE).is_symlink()
    messages = [r.getMessage() for r in caplog.records if "index cache" in r.getMessage()]
    assert len(messages) == 1
    assert match in messages[0]


@needs_root
def test_an_index_cache_folder_of_another_user_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o700)
    os.chown(folder, NOBODY, NOBODY)
    refused(folder, caplog, f"owned by uid {NOBODY}")


def test_an_index_cache_folder_writable_by_others_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o777)
    refused(folder, caplog, "chmod 700")


def test_a_planted_index_cache_symlink_is_never_written_through(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"")
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    (folder / CACHE_FILE).symlink_to(victim)
    refused(folder, caplog, "symbolic link")
    assert victim.read_bytes() == b""


def test_the_index_cache_is_readable_by_its_user_only(tmp_path: Path) -> None:
    folder = tmp_path / "new" / "cache"
    with IndexCache(folder) as cache:
        cache.put([(s3(0), 10)])
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        for path in folder.iterdir():  # the database and its WAL files
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    # One an older version left readable (0644, umask 022) is made private.
    (folder / CACHE_FILE).chmod(0o644)
    with IndexCache(folder) as cache:
        assert cache.get([s3(0)]) == {s3(0).url: 10}
        for path in folder.iterdir():
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_presigned_query_strings_never_reach_the_index_cache(tmp_path: Path) -> None:
    signed = "X-Amz-Credential=AKIAEXAMPLE%2F20260101&X-Amz-Signature=deadbeefcafe"
    url = f"https://bucket.example.com/train/shard-0000.tar?{signed}"
    with IndexCache(tmp_path) as cache:
        cache.put([(Shard(url, 1000, '"e"'), 10)])
        # Signed again later: another query string, the same object.
        again = "https://bucket.example.com/train/shard-0000.tar?X-Amz-Signature=0123"
        assert cache.get([Shard(again, 1000, '"e"')]) == {again: 10}  # keyed by the URL given
    with contextlib.closing(sqlite3.connect(tmp_path / CACHE_FILE)) as db:
        (stored,) = db.execute("SELECT url FROM counts").fetchone()
    assert stored == "https://bucket.example.com/train/shard-0000.tar"
    for path in tmp_path.iterdir():
        assert b"deadbeefcafe" not in path.read_bytes(), path
        assert b"AKIAEXAMPLE" not in path.read_bytes(), path
