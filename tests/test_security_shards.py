"""What a hostile or cut shard can make the reader do (issue 28, items 3 and 9).

* **Bounded memory.** A member or sample larger than ``max_sample_bytes`` (by default the
  block, at least 16 MiB) is a ``CorruptTarError`` naming the shard and the member, met
  before its bytes are held: a GNU sparse member claiming a real size of 1 GiB or 1 TiB, a
  gzip or zstd shard of a few kilobytes that expands to gigabytes. The bombs run in a child
  process whose address space is capped (``RLIMIT_AS``): it must end with the error, not
  with a ``MemoryError`` or a kill.
* **A cut shard is never read as whole.** A shard cut exactly at a header (only the missing
  end-of-archive marker shows it) is a ``CorruptTarError`` naming the shard and the byte
  it ends at; ``on_truncated="warn"`` reads it with a ``TruncatedShardWarning`` and drops
  its last sample. Tars as ``tarfile``, ``webdataset.TarWriter``, GNU tar and ``pack`` write
  them, whole or with short record padding, read as before.
"""

from __future__ import annotations

import gzip
import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import zstandard

from asyncstream import CorruptTarError, LocalS3, ShardStream, TruncatedShardWarning, pack
from asyncstream.shards._compressed import count_samples, open_reader
from asyncstream.shards._limits import ReadLimits
from asyncstream.shards._tar import ShardReader
from asyncstream.testing._bombs import sparse_bomb, zstd_bomb
from tests._foreign import gnu_tar

URL = "s3://bucket/bomb.tar"
ROOT = Path(__file__).resolve().parent.parent

# ------------------------------------------------------------------------------- bombs


def test_the_bombs_are_what_they_claim() -> None:
    """The zstd bomb decompresses (zstd accepts it); the sparse bomb is a valid tar."""
    data = zstd_bomb(1 << 20)
    assert len(data) < 200
    out = (
        zstandard.ZstdDecompressor()
        .decompressobj()
        .decompress(data[data.index(b"\x28\xb5\x2f\xfd", 4) :])
    )
    assert out == bytes(1 << 20)
    with tarfile.open(fileobj=io.BytesIO(sparse_bomb(4096)), mode="r:") as archive:
        assert archive.getmember("bomb.bin").size == 4096


# A child that reads a bomb as the stream does (1 MiB chunks, the default 16 MiB limit)
# with its address space capped a little above what it holds when it starts.
CHILD = """
import resource, sys
sys.path.insert(0, sys.argv[3])
import asyncstream.testing._bombs as t
from asyncstream import CorruptTarError
from asyncstream.shards._compressed import open_reader
data = getattr(t, sys.argv[1] + "_bomb")(int(sys.argv[2]))
vm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmSize"))
resource.setrlimit(resource.RLIMIT_AS, (vm * 1024 + (768 << 20),) * 2)
url = "s3://bucket/bomb.tar" + {"sparse": "", "gzip": ".gz", "zstd": ".zst"}[sys.argv[1]]
reader = open_reader(url, len(data))
try:
    for at in range(0, len(data), 1 << 20):
        reader.records(data[at : at + (1 << 20)], at, final=at + (1 << 20) >= len(data))
    print("READ", flush=True)
except CorruptTarError as exc:
    print("REFUSED", exc.url, exc.offset, exc, flush=True)
except MemoryError:
    print("MemoryError", flush=True)
print("maxrss_kib", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, flush=True)
"""


@pytest.mark.parametrize(
    ("kind", "size"),
    [("sparse", 1 << 30), ("sparse", 1 << 40), ("gzip", 4 << 30), ("zstd", 4 << 30)],
    ids=["sparse-1GiB", "sparse-1TiB", "gzip-4GiB", "zstd-4GiB"],
)
def test_a_bomb_is_refused_in_bounded_memory(kind: str, size: int) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, kind, str(size), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "REFUSED" in out, out
    assert "'bomb.bin'" in out, out
    assert "max_sample_bytes" in out, out
    assert "s3://bucket/bomb.tar" in out, out


def test_a_sparse_bomb_names_the_member_and_the_offset() -> None:
    data = sparse_bomb(1 << 40)
    with pytest.raises(CorruptTarError) as caught:
        ShardReader(URL, len(data)).feed(data, 0, final=True)
    assert caught.value.url == URL
    assert caught.value.offset == 1024  # the sparse member's header
    assert "'bomb.bin' expands to 1099511627776 bytes" in str(caught.value)


def test_the_limit_is_settable_and_counts_the_whole_sample() -> None:
    rows = [("a.jpg", b"A" * 3000), ("a.cls", b"1" * 3000), ("b.jpg", b"B" * 10)]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for name, data in rows:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    tar = buf.getvalue()
    assert count_samples(io.BytesIO(tar), URL, len(tar)) == 2  # default: 16 MiB
    # 2000: a.jpg alone is too large (refused at its header where its bytes have not all
    # arrived); 5000: a.jpg and a.cls together. The error is at the sample's first header.
    for limit in (2000, 5000):
        for block in (512, 1000, 1 << 20):  # carried across ranges, or inside one
            with pytest.raises(CorruptTarError, match=r"'a(\.jpg)?' .*max_sample_bytes") as caught:
                count_samples(
                    io.BytesIO(tar),
                    URL,
                    len(tar),
                    block=block,
                    limits=ReadLimits(max_sample_bytes=limit),
                )
            assert caught.value.offset == 0
    assert (
        count_samples(io.BytesIO(tar), URL, len(tar), limits=ReadLimits(max_sample_bytes=6000)) == 2
    )


def test_max_sample_bytes_through_the_stream(s3_server: LocalS3, tmp_path: Path) -> None:
    client = s3_server.client()
    client.create_bucket(Bucket="limits")
    body = tar_bytes([(f"{i:04d}", {"bin": bytes(4096) + b"%d" % i}) for i in range(4)])
    client.put_object(Bucket="limits", Key="big.tar", Body=body)
    url = "s3://limits/big.tar"
    assert len(list(ShardStream(url, s3=s3_server.options(), index_cache=False))) == 4
    with pytest.raises(CorruptTarError, match="max_sample_bytes") as caught:
        ShardStream(url, s3=s3_server.options(), index_cache=False, max_sample_bytes=4000)
    assert caught.value.url == url
    assert "'0000.bin'" in str(caught.value)


# ------------------------------------------------------------------------- cut shards


def tar_bytes(rows: list[tuple[str, dict[str, bytes]]], writer: str = "tarfile") -> bytes:
    """A shard written by ``tarfile`` or ``webdataset.TarWriter``."""
    buf = io.BytesIO()
    if writer == "webdataset":
        import webdataset

        with webdataset.TarWriter(buf) as sink:
            for key, fields in rows:
                sink.write({"__key__": key, **fields})
        return buf.getvalue()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for key, fields in rows:
            for ext, data in fields.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    return buf.getvalue()


ROWS = [(f"{i:04d}", {"jpg": b"J" * (700 + i), "cls": b"%d" % i}) for i in range(5)]


def last_header(tar: bytes) -> int:
    """The offset of the last member's header (the last sample's ``cls``)."""
    with tarfile.open(fileobj=io.BytesIO(tar), mode="r:") as archive:
        return archive.getmembers()[-1].offset


def end_of_members(tar: bytes) -> int:
    """Where the end-of-archive marker begins: after the last member's data."""
    with tarfile.open(fileobj=io.BytesIO(tar), mode="r:") as archive:
        last = archive.getmembers()[-1]
    return last.offset_data + -(-last.size // 512) * 512


def read_all(tar: bytes, url: str = URL, step: int = 1000, **limits: object) -> list[str]:
    reader = open_reader(url, len(tar), limits=ReadLimits(**limits))  # type: ignore[arg-type]
    keys: list[str] = []
    for at in range(0, len(tar), step):
        keys += [s.key for s in reader.feed(tar[at : at + step], at, final=at + step >= len(tar))]
    return keys


def gnu_tar_bytes(folder: Path) -> bytes:
    tar = gnu_tar()
    if tar is None:
        pytest.skip("GNU tar is not installed")
    for key, fields in ROWS:
        for ext, data in fields.items():
            (folder / f"{key}.{ext}").write_bytes(data)
    names = sorted(p.name for p in folder.iterdir())
    return subprocess.run(
        [tar, "--format=gnu", "-cf", "-", "-C", str(folder), *names],
        capture_output=True,
        check=True,
    ).stdout


@pytest.fixture(params=["tarfile", "webdataset", "gnu-tar"])
def written(request: pytest.FixtureRequest, tmp_path: Path) -> bytes:
    if request.param == "gnu-tar":
        return gnu_tar_bytes(tmp_path)
    return tar_bytes(ROWS, request.param)


def test_a_shard_cut_at_a_header_is_truncated(written: bytes) -> None:
    whole = read_all(written)
    assert whole == [k for k, _ in ROWS]
    cut = last_header(written)  # the last sample lost its cls, and the end marker
    for step in (512, 1000, 1 << 20):
        with pytest.raises(CorruptTarError, match="without the end-of-archive marker") as caught:
            read_all(written[:cut], step=step)
        assert caught.value.url == URL
        assert caught.value.offset == cut
        assert f"{URL}: corrupt tar at byte {cut}: " in str(caught.value)
    with pytest.raises(CorruptTarError, match="end-of-archive marker"):
        read_all(written[: end_of_members(written)])  # every member there, no marker


def test_on_truncated_warn_drops_the_partial_sample(written: bytes) -> None:
    cut = last_header(written)
    for step in (512, 1000, 1 << 20):
        with pytest.warns(TruncatedShardWarning, match="'0004' is dropped"):
            keys = read_all(written[:cut], step=step, on_truncated="warn")
        assert keys == [k for k, _ in ROWS[:-1]]  # never the sample without its cls


def test_whole_tars_with_short_record_padding_still_read(written: bytes) -> None:
    end = end_of_members(written)
    keys = [k for k, _ in ROWS]
    for size in (end + 1024, end + 700, end + 512, len(written)):  # cut inside the padding
        assert read_all(written[:size]) == keys, size


def test_pack_output_is_complete(tmp_path: Path) -> None:
    from PIL import Image

    source = tmp_path / "src" / "a"
    source.mkdir(parents=True)
    for i in range(3):
        Image.new("RGB", (8, 8), (i, 0, 0)).save(source / f"{i}.jpg", "JPEG")
    result = pack(str(source.parent), str(tmp_path / "out"), shard_bytes=1 << 20)
    shards = sorted((tmp_path / "out").glob("*.tar"))
    assert shards, result
    for shard in shards:
        data = shard.read_bytes()
        assert len(read_all(data)) > 0
        with pytest.raises(CorruptTarError, match="end-of-archive marker"):
            read_all(data[: end_of_members(data)])


@pytest.mark.parametrize("suffix", [".tar.gz", ".tar.zst"])
def test_a_compressed_shard_of_a_cut_tar_is_truncated(suffix: str) -> None:
    tar = tar_bytes(ROWS)
    cut = tar[: last_header(tar)]
    packed = gzip.compress(cut) if suffix == ".tar.gz" else zstandard.ZstdCompressor().compress(cut)
    url = "s3://bucket/cut" + suffix
    with pytest.raises(CorruptTarError, match="end-of-archive marker") as caught:
        read_all(packed, url=url)
    assert caught.value.offset == len(cut)
    with pytest.warns(TruncatedShardWarning):
        assert read_all(packed, url=url, on_truncated="warn") == [k for k, _ in ROWS[:-1]]


@pytest.fixture(scope="module")
def cut_bucket(s3_server: LocalS3) -> str:
    client = s3_server.client()
    client.create_bucket(Bucket="cut")
    tar = tar_bytes(ROWS)
    client.put_object(Bucket="cut", Key="whole.tar", Body=tar)
    client.put_object(Bucket="cut", Key="cut.tar", Body=tar[: last_header(tar)])
    return "cut"


def test_a_cut_shard_through_the_stream(s3_server: LocalS3, cut_bucket: str) -> None:
    options = s3_server.options()
    url = f"s3://{cut_bucket}/cut.tar"
    cut = last_header(tar_bytes(ROWS))
    with pytest.raises(CorruptTarError, match="end-of-archive marker") as caught:
        ShardStream(url, s3=options, index_cache=False)  # counting reads it whole
    assert caught.value.url == url
    assert caught.value.offset == cut
    # An index that counts 5 (the shard was whole when counted): an exact plan.
    refused = pytest.raises(CorruptTarError, match="end-of-archive marker")
    with ShardStream(url, s3=options, samples_per_shard=5, chunk_bytes=1024) as stream, refused:
        list(stream)
    warned = pytest.warns(TruncatedShardWarning, match="'0004' is dropped")
    with warned, ShardStream(url, s3=options, index_cache=False, on_truncated="warn") as stream:
        keys = sorted(s["__key__"] for s in stream)
    assert keys == [k for k, _ in ROWS[:-1]]
    whole = f"s3://{cut_bucket}/whole.tar"
    with ShardStream(whole, s3=options, index_cache=False, chunk_bytes=1024) as stream:
        assert sorted(s["__key__"] for s in stream) == [k for k, _ in ROWS]
