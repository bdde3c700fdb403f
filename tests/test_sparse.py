"""Sparse members (:mod:`asyncstream.shards._sparse`): their real contents, as webdataset
reads them.

GNU tar writes them with ``--sparse`` in its own format (type ``S``, with extension blocks
for long maps) and in the three PAX versions (0.0, 0.1, 1.0); each is read through the
chunk-fed reader at several chunk sizes and compared with webdataset (Python's tarfile)
and with the file itself. Hand-made headers cover what GNU tar does not write here, and
the maps that are refused with a ``CorruptTarError`` naming the member.
"""

from __future__ import annotations

import io
import os
import random
import subprocess
import tarfile
from pathlib import Path

import pytest
from _wds import ours, wds_samples

from asyncstream._exceptions import CorruptTarError
from asyncstream.shards._sparse import expand, map_01, map_10, tar_number
from tests._foreign import gnu_tar

CHUNKS = [None, 37, 512, 700, 4096]


needs_gnu_tar = pytest.mark.skipif(gnu_tar() is None, reason="GNU tar is not installed")


def sparse_file(path: Path, size: int, regions: list[tuple[int, bytes]]) -> bytes:
    """A file of ``size`` bytes, holes but for ``regions``; returns its contents."""
    with open(path, "wb") as f:
        for offset, data in regions:
            f.seek(offset)
            f.write(data)
        f.truncate(size)
    return path.read_bytes()


@pytest.fixture(scope="module")
def sparse_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, bytes]]:
    """Files with holes (one with more than 4 + 21 regions: GNU extension blocks) and
    small plain members beside them."""
    root = tmp_path_factory.mktemp("sparse")
    rng = random.Random(0)
    contents = {
        "000.bin": sparse_file(root / "000.bin", 300_000, [(0, b"A" * 100), (70_000, b"B" * 5000)]),
        "001.bin": sparse_file(
            root / "001.bin",
            2_000_000,
            [(i * 50_000, rng.randbytes(700)) for i in range(36)],
        ),
        "002.bin": sparse_file(root / "002.bin", 100_000, []),  # all hole
        "003.bin": sparse_file(root / "003.bin", 9000, [(8000, b"end")]),  # ends in data
    }
    for stem in ("000", "001", "002", "003"):
        (root / f"{stem}.cls").write_bytes(stem.encode())
        contents[f"{stem}.cls"] = stem.encode()
    return root, contents


def gnu_sparse_tar(root: Path, fmt: str, version: str | None) -> bytes:
    tar = gnu_tar()
    assert tar is not None
    args = [tar, "--sparse", f"--format={fmt}", "-cf", "-", "-C", str(root)]
    if version is not None:
        args[2:2] = [f"--sparse-version={version}"]
    names = sorted(p.name for p in root.iterdir())
    return subprocess.run([*args, *names], capture_output=True, check=True).stdout


@needs_gnu_tar
@pytest.mark.parametrize(
    ("fmt", "version"),
    [("gnu", None), ("pax", "0.0"), ("pax", "0.1"), ("pax", "1.0")],
    ids=["gnu", "pax-0.0", "pax-0.1", "pax-1.0"],
)
def test_gnu_tar_sparse_members_read_their_real_contents(
    sparse_dir: tuple[Path, dict[str, bytes]], fmt: str, version: str | None
) -> None:
    root, contents = sparse_dir
    tar = gnu_sparse_tar(root, fmt, version)
    if fmt == "gnu":
        assert b"S" in bytes(tar[i * 512 + 156] for i in range(len(tar) // 512))
    else:
        assert b"GNU.sparse" in tar
    expected = wds_samples(tar)
    assert [s["__key__"] for s in expected] == ["000", "001", "002", "003"]
    for sample in expected:  # the oracle gives the files' real bytes
        assert sample["bin"] == contents[sample["__key__"] + ".bin"]
    for chunk in CHUNKS:
        assert ours(tar, chunk=chunk) == expected, chunk


def _header(name: bytes, size: int, flag: bytes, extra: dict[int, bytes]) -> bytearray:
    h = bytearray(512)
    h[0 : len(name)] = name
    h[100:108] = b"0000644\0"
    h[124:136] = b"%011o\0" % size
    h[136:148] = b"00000000000\0"
    h[156:157] = flag
    h[257:265] = b"ustar  \0"
    for at, value in extra.items():
        h[at : at + len(value)] = value
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return h


def _struct(offset: int, length: int) -> bytes:
    return b"%011o\0" % offset + b"%011o\0" % length


def _pad(data: bytes) -> bytes:
    return data + bytes(-len(data) % 512)


def gnu_sparse(name: str, real: int, regions: list[tuple[int, bytes]]) -> bytes:
    """A hand-made GNU ``S`` entry: 4 map entries in the header, the rest in extension
    blocks of 21."""
    structs = [_struct(off, len(data)) for off, data in regions]
    head, rest = structs[:4], structs[4:]
    blocks = [rest[i : i + 21] for i in range(0, len(rest), 21)]
    extra = {386: b"".join(head), 482: b"\1" if blocks else b"\0", 483: b"%011o\0" % real}
    stored = b"".join(data for _, data in regions)
    out = bytes(_header(name.encode(), len(stored), b"S", extra))
    for i, block in enumerate(blocks):
        ext = bytearray(512)
        ext[: 24 * len(block)] = b"".join(block)
        ext[504] = 1 if i < len(blocks) - 1 else 0
        out += bytes(ext)
    return out + _pad(stored)


def regular(name: str, data: bytes) -> bytes:
    return bytes(_header(name.encode(), len(data), b"0", {})) + _pad(data)


def pax(records: dict[str, str] | list[tuple[str, str]]) -> bytes:
    items = records.items() if isinstance(records, dict) else records
    body = b""
    for key, value in items:
        line = f" {key}={value}\n".encode()
        n = len(line) + 1
        n = len(str(n + len(str(n))).encode()) + len(line)
        body += str(n).encode() + line
    return bytes(_header(b"PaxHeaders/x", len(body), b"x", {})) + _pad(body)


def test_hand_made_gnu_sparse_with_extension_blocks() -> None:
    rng = random.Random(1)
    regions = [(i * 4096, rng.randbytes(512)) for i in range(30)] + [(200_000, b"tail")]
    tar = (
        regular("a.cls", b"1")
        + gnu_sparse("a.bin", 200_004, regions)
        + gnu_sparse("b.bin", 10_000, [(512, b"x" * 512), (9000, b"yz")])
        + bytes(1024)
    )
    expected = wds_samples(tar)
    real = bytearray(200_004)
    for offset, data in regions:
        real[offset : offset + len(data)] = data
    assert expected[0]["bin"] == bytes(real)
    for chunk in CHUNKS:
        assert ours(tar, chunk=chunk) == expected


def test_hand_made_pax_sparse_versions() -> None:
    data = b"Q" * 1024 + b"R" * 10
    v00 = pax(
        [
            ("GNU.sparse.size", "5000"),
            ("GNU.sparse.numblocks", "2"),
            ("GNU.sparse.offset", "0"),
            ("GNU.sparse.numbytes", "1024"),
            ("GNU.sparse.offset", "4990"),
            ("GNU.sparse.numbytes", "10"),
        ]
    ) + regular("v00.bin", data)
    v01 = pax(
        {
            "GNU.sparse.size": "5000",
            "GNU.sparse.map": "0,1024,4990,10",
            "GNU.sparse.name": "v01.BIN",
        }
    ) + regular("GNUSparseFile.1/v01.bin", data)
    map10 = _pad(b"2\n0\n1024\n4990\n10\n")
    v10 = pax(
        {
            "GNU.sparse.major": "1",
            "GNU.sparse.minor": "0",
            "GNU.sparse.name": "v10.bin",
            "GNU.sparse.realsize": "5000",
        }
    ) + regular("GNUSparseFile.1/v10.bin", map10 + data)
    tar = v00 + v01 + v10 + bytes(1024)
    expected = wds_samples(tar)
    real = b"Q" * 1024 + bytes(5000 - 1034) + b"R" * 10
    assert [(s["__key__"], s["bin"]) for s in expected] == [
        ("v00", real),
        ("v01", real),
        ("v10", real),
    ]
    for chunk in CHUNKS:
        assert ours(tar, chunk=chunk) == expected


@pytest.mark.parametrize(
    ("regions", "why"),
    [
        ([(4096, b"a" * 512), (0, b"b" * 512)], "out of order"),
        ([(0, b"a" * 700), (1000, b"b" * 10)], "not a whole number of blocks"),
        ([(9990, b"a" * 20)], "runs past"),
    ],
    ids=["unordered", "unaligned", "past-the-end"],
)
def test_maps_that_cannot_be_read_surely_are_refused_naming_the_member(
    regions: list[tuple[int, bytes]], why: str
) -> None:
    tar = regular("a.cls", b"1") + gnu_sparse("a.bin", 10_000, regions) + bytes(1024)
    for chunk in CHUNKS:
        with pytest.raises(CorruptTarError, match=why) as info:
            ours(tar, chunk=chunk)
        assert "'a.bin'" in str(info.value)
        assert info.value.offset == 1024


def test_a_map_needing_more_bytes_than_stored_is_refused() -> None:
    entry = bytearray(gnu_sparse("a.bin", 10_000, [(0, b"a" * 512)]))
    entry[386:410] = _struct(0, 1024)  # says 1024 stored, 512 are
    entry[148:156] = b" " * 8
    entry[148:156] = b"%06o\0 " % sum(entry[:512])
    with pytest.raises(CorruptTarError, match="needs 1024 stored bytes"):
        ours(bytes(entry) + bytes(1024))


def test_pax_sparse_records_that_make_no_map_are_refused() -> None:
    for records in (
        {"GNU.sparse.major": "2", "GNU.sparse.minor": "0", "GNU.sparse.realsize": "9"},
        {"GNU.sparse.map": "0,x", "GNU.sparse.size": "9"},
        {"GNU.sparse.realsize": "9"},
        {"GNU.sparse.map": "0,1", "GNU.sparse.size": "9", "size": "1"},
    ):
        tar = pax(records) + regular("a.bin", b"z") + bytes(1024)
        with pytest.raises(CorruptTarError) as info:
            ours(tar)
        assert info.value.offset == 0, records
    map_without_newline = pax(
        {"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.realsize": "9"}
    )
    with pytest.raises(CorruptTarError, match="no map count"):
        ours(map_without_newline + regular("a.bin", b"no newline") + bytes(1024))


def test_helpers() -> None:
    assert tar_number(b"0000017\0") == 15
    assert tar_number(b"\x80" + (300).to_bytes(11, "big")) == 300
    assert tar_number(b"\xff" * 12) == -1
    assert map_01("0,10,20,5") == [(0, 10), (20, 5)]
    assert map_10(_pad(b"1\n5\n3\n") + b"abc") == ([(5, 3)], 512)
    assert expand(b"abc", [(5, 3), (8, 0)], 10) == bytes(5) + b"abc" + bytes(2)
    with pytest.raises(ValueError, match="negative"):
        expand(b"", [], -1)


def test_sparse_fields_are_owned_bytes_among_zero_copy_ones() -> None:
    tar = regular("a.cls", b"1") + gnu_sparse("a.bin", 2000, [(1000, b"x" * 10)]) + bytes(1024)
    from asyncstream.shards._tar import ShardReader

    (sample,) = ShardReader("s.tar", len(tar)).feed(tar, 0, final=True)
    assert isinstance(sample.fields["cls"], memoryview)
    assert type(sample.fields["bin"]) is bytes
    assert sample.fields["bin"] == bytes(1000) + b"x" * 10 + bytes(990)


@needs_gnu_tar
def test_python_tarfile_writes_no_sparse_but_reads_gnu_tar_s(tmp_path: Path) -> None:
    """The oracle itself: tarfile really expands what GNU tar stored sparse."""
    sparse_file(tmp_path / "x.bin", 100_000, [(50_000, b"data")])
    tar = gnu_sparse_tar(tmp_path, "gnu", None)
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        (member,) = archive.getmembers()
        assert member.type == tarfile.GNUTYPE_SPARSE
        assert len(tar) < 100_000 - os.sysconf("SC_PAGE_SIZE")
