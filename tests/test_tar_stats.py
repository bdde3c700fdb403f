"""``stats()["tar_general_members"]``: what the general tar parser read rather than the walk.

The walk (native, or its Python reference) reads runs of plain members, and names a plain
member that a chunk's end cuts; the general parser reads what is rare by nature (pax and
GNU headers, long names, sparse members), a cut member among them. The count shows where a
dataset leaves the fast path, on shards written by ``tarfile``, not by ``pack``.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from asyncstream import ShardStream

SAMPLES = 12


def _shard(path: Path, fmt: int, long_names: bool) -> None:
    with tarfile.open(path, "w", format=fmt) as tar:
        for i in range(SAMPLES):
            stem = ("d" * 120 + "/" if long_names else "") + f"s{i:03d}"
            for ext, data in (("jpg", bytes([i]) * 700), ("cls", str(i % 3).encode())):
                info = tarfile.TarInfo(f"{stem}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def _read(folder: Path, **options: object) -> tuple[int, dict[str, object]]:
    with ShardStream(str(folder), samples_per_shard=SAMPLES, shuffle=False, **options) as s:
        n = sum(1 for _ in s)
        return n, s.stats()


@pytest.mark.parametrize("native", ["1", "0"])
def test_plain_members_are_all_walked(
    tmp_path: Path, native: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ASYNCSTREAM_NATIVE", native)
    _shard(tmp_path / "a.tar", tarfile.USTAR_FORMAT, long_names=False)
    n, stats = _read(tmp_path)
    assert n == SAMPLES
    assert stats["tar_general_members"] == 0


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT])
def test_long_names_are_read_by_the_general_parser_and_counted(tmp_path: Path, fmt: int) -> None:
    _shard(tmp_path / "a.tar", fmt, long_names=True)
    n, stats = _read(tmp_path)
    assert n == SAMPLES
    assert stats["tar_general_members"] == 2 * SAMPLES  # every member has a long name


@pytest.mark.parametrize("native", ["1", "0"])
def test_plain_members_cut_by_chunks_are_named_by_the_walk(
    tmp_path: Path, native: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ASYNCSTREAM_NATIVE", native)
    _shard(tmp_path / "a.tar", tarfile.USTAR_FORMAT, long_names=False)
    n, stats = _read(tmp_path, chunk_bytes=4096)  # 4 KiB chunks cut a 700-byte member
    assert n == SAMPLES
    assert stats["tar_general_members"] == 0


def test_long_names_cut_by_chunks_are_counted_once(tmp_path: Path) -> None:
    _shard(tmp_path / "a.tar", tarfile.PAX_FORMAT, long_names=True)
    n, stats = _read(tmp_path, chunk_bytes=4096)
    assert n == SAMPLES
    assert stats["tar_general_members"] == 2 * SAMPLES  # cut or whole, each read once


@pytest.mark.parametrize("native", ["1", "0"])
def test_webdataset_tar_writer_shards_are_walked(
    tmp_path: Path, native: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``webdataset.TarWriter`` puts a PAX header of a fractional mtime before each member:
    the walk reads such members, whole or with their data cut by a chunk's end; the
    general parser only an entry whose headers a chunk's end cuts."""
    from tests._foreign import webdataset_shard, write

    monkeypatch.setenv("ASYNCSTREAM_NATIVE", native)
    write(tmp_path, [webdataset_shard("a.tar", 0, SAMPLES)])
    n, stats = _read(tmp_path, chunk_bytes=1 << 20)  # one chunk
    assert n == SAMPLES
    assert stats["tar_general_members"] == 0
    size = (tmp_path / "a.tar").stat().st_size
    n, stats = _read(tmp_path, chunk_bytes=4096)
    assert n == SAMPLES
    assert stats["tar_general_members"] <= -(-size // 4096) - 1  # one a chunk's edge
