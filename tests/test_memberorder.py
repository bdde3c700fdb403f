"""Member order (``shards/_memberorder.py``): a shard made by GNU ``tar czf s.tar.gz -C dir
.`` of a folder, whose directory order puts the members of one key apart, is read as
webdataset reads it (a sample per run of adjacent members) with one MemberOrderWarning
naming the cause and the fix; the same folder tarred with ``--sort=name`` reads whole and
warns nothing; a file that is not a tar says what it looks like."""

from __future__ import annotations

import gzip
import itertools
import random
import shutil
import subprocess
import tarfile
import warnings
from pathlib import Path

import pytest

from asyncstream import CorruptTarError, MemberOrderWarning, ShardStream
from asyncstream.shards._tar import ShardReader
from tests._jpegs import jpeg_of

N = 40
STREAM = {"window": 2, "inflight": 2, "chunk_bytes": 16 << 10, "seed": 3, "shuffle": False}

needs_gnu_tar = pytest.mark.skipif(shutil.which("tar") is None, reason="no tar on PATH")


def _folder(root: Path) -> Path:
    """N samples of (jpg, cls), written all jpgs first, then all cls: in creation order,
    in reverse (tmpfs) and in hash order (ext4), one key's members are apart."""
    folder = root / "dir"
    folder.mkdir()
    for i in range(N):
        (folder / f"{i:04d}.jpg").write_bytes(bytes([i]) * (100 + i))
    for i in range(N):
        (folder / f"{i:04d}.cls").write_bytes(str(i % 7).encode())
    return folder


def _tar(folder: Path, out: Path, *flags: str) -> Path:
    subprocess.run(["tar", *flags, "-czf", str(out), "-C", str(folder), "."], check=True)
    return out


def _read(shards: Path) -> list[dict[str, bytes]]:
    with ShardStream(str(shards), **STREAM) as stream:
        return [{k: v for k, v in s.items() if not k.startswith("__")} for s in stream]


@needs_gnu_tar
def test_a_tar_of_a_folder_in_directory_order_warns_once_with_the_fix(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    shards = tmp_path / "shards"
    shards.mkdir()
    for n in range(2):
        _tar(folder, shards / f"s{n}.tar.gz")
    with tarfile.open(shards / "s0.tar.gz") as archive:  # the premise: keys are apart
        names = [m.name for m in archive.getmembers() if m.isfile()]
    runs = sum(1 for a, b in itertools.pairwise(names) if a[:6] != b[:6]) + 1
    assert runs > N
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        samples = _read(shards)
    assert len(samples) == 2 * runs  # as webdataset reads it: a sample per run
    ours = [w for w in caught if issubclass(w.category, MemberOrderWarning)]
    assert len(ours) == 1  # once for the folder, not once per shard or per sample
    text = str(ours[0].message)
    assert "members of one key are not adjacent" in text
    assert "tar --sort=name" in text
    assert "s0.tar.gz" in text or "s1.tar.gz" in text


@needs_gnu_tar
def test_the_same_folder_tarred_sorted_reads_whole_without_a_warning(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    shards = tmp_path / "shards"
    shards.mkdir()
    _tar(folder, shards / "s0.tar.gz", "--sort=name")
    with warnings.catch_warnings():
        warnings.simplefilter("error", MemberOrderWarning)
        samples = _read(shards)
    assert len(samples) == N
    assert all(set(s) == {"jpg", "cls"} for s in samples)


def test_samples_with_optional_members_do_not_warn(tmp_path: Path) -> None:
    """Keys never come back: fewer members in most samples is the data, not the order."""
    path = tmp_path / "opt.tar"
    with tarfile.open(path, "w") as archive:
        for i in range(30):
            for ext in ("jpg", "cls", "json")[: 1 + (i % 3 == 0) * 2]:
                (tmp_path / f"{i:03d}.{ext}").write_bytes(b"x")
                archive.add(tmp_path / f"{i:03d}.{ext}", arcname=f"{i:03d}.{ext}")
    data = path.read_bytes()
    with warnings.catch_warnings():
        warnings.simplefilter("error", MemberOrderWarning)
        reader = ShardReader(f"file://{path}", len(data))
        assert len(reader.feed(data, 0, final=True)) == 30


def test_a_jpeg_named_tar_says_it_looks_like_a_jpeg(tmp_path: Path) -> None:
    jpeg = jpeg_of(random.Random(0), 3000)
    assert jpeg[:3] == b"\xff\xd8\xff"
    for size in (len(jpeg), 300):  # a header's worth or more, and less
        reader = ShardReader("s3://bucket/photo.tar", size)
        with pytest.raises(CorruptTarError, match=r"not a tar \(looks like a JPEG image\)"):
            reader.feed(jpeg[:size], 0, final=True)


@needs_gnu_tar
@pytest.mark.parametrize("fast", [True, False])
def test_both_walks_warn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fast: bool) -> None:
    """The native walk and the Python reference give the same records: both warn."""
    data = gzip.decompress(_tar(_folder(tmp_path), tmp_path / "s.tar.gz").read_bytes())
    monkeypatch.setattr(ShardReader, "_fast_path", fast)
    reader = ShardReader(f"file://{tmp_path}/fast-{fast}/s.tar", len(data))
    ranges = [(data[at : at + 4096], at) for at in range(0, len(data), 4096)]  # as chunks
    with pytest.warns(MemberOrderWarning, match="not adjacent"):
        _ = [reader.feed(chunk, at, final=at + len(chunk) == len(data)) for chunk, at in ranges]
