"""The local index cache: keyed by URL, size and version, shared by processes, optional."""

from __future__ import annotations

import logging
import multiprocessing
import os
import sqlite3
import stat
from pathlib import Path

import pytest

from asyncstream.dataset._index_cache import CACHE_FILE, IndexCache, default_cache_dir
from asyncstream.shards._urls import Shard


def s3(i: int, size: int = 1000, etag: str | None = '"e"') -> Shard:
    return Shard(f"s3://bkt/shard-{i:04d}.tar", size, etag)


def test_counts_are_found_only_for_the_same_size_and_etag(tmp_path: Path) -> None:
    cache = IndexCache(tmp_path)
    cache.put([(s3(0), 10), (s3(1, etag=None), 11)])
    assert cache.get([s3(0), s3(1, etag=None), s3(2)]) == {s3(0).url: 10, s3(1).url: 11}
    assert cache.get([s3(0, size=999)]) == {}
    assert cache.get([s3(0, etag='"other"')]) == {}
    cache.put([(s3(0, etag='"other"'), 12)])  # the object was rewritten: a new key
    assert cache.get([s3(0, etag='"other"')]) == {s3(0).url: 12}
    assert cache.get([s3(0)]) == {s3(0).url: 10}
    cache.close()
    again = IndexCache(tmp_path)  # another open, as another process would
    assert again.get([s3(0)]) == {s3(0).url: 10}
    again.close()


def test_many_shards_in_one_lookup(tmp_path: Path) -> None:
    with IndexCache(tmp_path) as cache:
        shards = [s3(i) for i in range(2_345)]
        cache.put((s, i) for i, s in enumerate(shards))
        found = cache.get(shards)
    assert found == {s.url: i for i, s in enumerate(shards)}


def test_a_local_shard_is_keyed_by_its_mtime(tmp_path: Path) -> None:
    path = tmp_path / "a.tar"
    path.write_bytes(b"x" * 1024)
    shard = Shard(path.as_uri(), 1024)
    with IndexCache(tmp_path / "cache") as cache:
        cache.put([(shard, 3)])
        assert cache.get([shard]) == {shard.url: 3}
        os.utime(path, ns=(0, 123_456_789))  # rewritten in place, same size
        assert cache.get([shard]) == {}


def test_the_file_is_opened_only_when_used(tmp_path: Path) -> None:
    cache = IndexCache(tmp_path / "lazy")
    assert cache.get([]) == {}
    assert not (tmp_path / "lazy").exists()
    cache.put([(s3(0), 1)])
    assert (tmp_path / "lazy" / CACHE_FILE).exists()
    cache.close()


def _write(folder: str, start: int) -> None:
    cache = IndexCache(folder)
    for i in range(start, start + 200):
        cache.put([(s3(i), i)])  # one transaction per count, as counting writes them
    cache.close()


def test_several_processes_write_at_once(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    procs = [context.Process(target=_write, args=(str(tmp_path), k * 200)) for k in range(4)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
        assert proc.exitcode == 0
    with IndexCache(tmp_path) as cache:
        shards = [s3(i) for i in range(800)]
        assert cache.get(shards) == {s.url: i for i, s in enumerate(shards)}
    with sqlite3.connect(tmp_path / CACHE_FILE) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_an_unwritable_folder_warns_once_and_keeps_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        cache = IndexCache(folder)
        with caplog.at_level(logging.WARNING, logger="asyncstream"):
            cache.put([(s3(0), 1)])
            cache.put([(s3(1), 1)])
            assert cache.get([s3(0)]) == {}
        cache.close()
    finally:
        folder.chmod(stat.S_IRWXU)
    warnings = [r for r in caplog.records if "cannot be opened" in r.getMessage()]
    assert len(warnings) == 1
    assert str(folder) in warnings[0].getMessage()


def test_a_file_in_the_way_warns_and_keeps_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    cache = IndexCache(blocker)
    with caplog.at_level(logging.WARNING, logger="asyncstream"):
        cache.put([(s3(0), 1)])
        assert cache.get([s3(0)]) == {}
    assert any("cannot be opened" in r.getMessage() for r in caplog.records)


def test_where_the_cache_lives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCSTREAM_CACHE_DIR", str(tmp_path / "explicit"))
    assert default_cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv("ASYNCSTREAM_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "asyncstream"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "asyncstream"
    assert IndexCache.open(False) is None
    opened = IndexCache.open(tmp_path / "given")
    assert opened is not None
    assert opened.path == tmp_path / "given" / CACHE_FILE
