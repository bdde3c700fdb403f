"""Compressed shards (:mod:`asyncstream.shards._compressed`): decompressed on the way into
the reader.

In a stream (through the real moto server): an epoch over gzip, zstd, xz and bzip2 shards
through the fault proxy at 10% is exact, resume inside a compressed shard is exact (on the
same topology and onto another), the shards are cached, listed (a ``.tar.lz4`` beside them
is named in a warning) and indexed by ``asyncstream ls`` / ``index``.

Each compression (gzip, zstd, xz, bzip2) over the same tar, fed in ranges of many sizes,
gives webdataset's samples; a reader started at any ``pending_offset`` (a resume) reads
from the first stored byte and gives exactly the rest; concatenated streams and padding
read; a truncated or corrupt stream is a ``CorruptTarError`` naming the shard, never a
short shard; a gzip shard under 512 bytes is read, not called a truncated tar; a plain tar
under a compressed name reads as tarfile reads it; a compressed tar under a plain name is
refused saying so.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import os
import random
import tarfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zstandard
from _wds import ours, wds_samples

from asyncstream import (
    LocalS3,
    RetryPolicy,
    S3Options,
    ShardStream,
    Timeouts,
    UnreadShardWarning,
)
from asyncstream._exceptions import CorruptTarError
from asyncstream.cli._cli import main
from asyncstream.shards._compressed import (
    CompressedReader,
    compression_of,
    is_shard_name,
    open_reader,
    unread_format,
)
from asyncstream.shards._tar import ShardReader
from asyncstream.testing import FaultPlan, FaultProxy

COMPRESS: dict[str, Callable[[bytes], bytes]] = {
    ".tar.gz": lambda b: gzip.compress(b, mtime=0),
    ".tgz": lambda b: gzip.compress(b, compresslevel=1, mtime=0),
    ".tar.zst": lambda b: zstandard.ZstdCompressor(write_checksum=True).compress(b),
    ".tar.xz": lzma.compress,
    ".tar.bz2": bz2.compress,
}


def make_tar(n: int, seed: int = 0) -> bytes:
    rng = random.Random(seed)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for i in range(n):
            for ext, data in (
                ("JPEG", rng.randbytes(rng.choice([0, 100, 511, 512, 513, 3000]))),
                ("cls", b"%d" % i),
            ):
                info = tarfile.TarInfo(f"dir/{i:05d}.{ext}")
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    return buf.getvalue()


TAR = make_tar(40)


@pytest.mark.parametrize("suffix", list(COMPRESS))
@pytest.mark.parametrize("chunk", [None, 1, 97, 512, 4096, 100_000])
def test_each_compression_gives_webdatasets_samples(suffix: str, chunk: int | None) -> None:
    stored = COMPRESS[suffix](TAR)
    url = "s3://b/shard" + suffix
    expected = wds_samples(stored, url)
    assert len(expected) == 40
    assert expected == wds_samples(TAR)
    if chunk == 1 and len(stored) > 50_000:
        chunk = 7
    assert ours(stored, url, chunk) == expected


@pytest.mark.parametrize("suffix", list(COMPRESS))
def test_resume_at_any_pending_offset_reads_the_rest_from_the_first_byte(suffix: str) -> None:
    stored = COMPRESS[suffix](TAR)
    url = "shard" + suffix
    expected = ours(stored, url)
    reader = open_reader(url, len(stored))
    assert isinstance(reader, CompressedReader)
    returned, step = 0, 333
    for offset in range(0, len(stored), step):
        piece = stored[offset : offset + step]
        returned += len(reader.feed(piece, offset, final=offset + len(piece) == len(stored)))
        start = reader.pending_offset
        rest = open_reader(url, len(stored), start)
        got = []
        for at in range(0, len(stored), 1000):
            part = stored[at : at + 1000]
            got += rest.feed(part, at, final=at + len(part) == len(stored))
        assert [s.key for s in got] == [s["__key__"] for s in expected[returned:]], start


def test_concatenated_streams_and_zero_padding_are_read() -> None:
    half = len(TAR) // 2 // 512 * 512
    parts = (TAR[:half], TAR[half:])
    for suffix, pack in COMPRESS.items():
        stored = pack(parts[0]) + pack(parts[1])
        url = "x" + suffix
        assert ours(stored, url, 1000) == wds_samples(TAR), suffix
        assert ours(stored + bytes(700), url, 512) == wds_samples(TAR), suffix


def test_what_follows_the_last_stream_after_the_tar_ended_is_ignored() -> None:
    stored = gzip.compress(TAR) + b"garbage after the stream"
    assert ours(stored, "x.tar.gz", 100) == wds_samples(stored, "x.tar.gz")


@pytest.mark.parametrize("suffix", list(COMPRESS))
def test_a_truncated_stream_is_an_error_not_a_short_shard(suffix: str) -> None:
    stored = COMPRESS[suffix](TAR)
    for cut in (len(stored) // 2, len(stored) - 1):
        with pytest.raises(CorruptTarError) as info:
            ours(stored[:cut], "s3://b/x" + suffix, 999)
        assert "s3://b/x" + suffix in str(info.value)


@pytest.mark.parametrize("suffix", [".tar.gz", ".tar.zst", ".tar.xz", ".tar.bz2"])
def test_corrupt_compressed_bytes_are_an_error_naming_the_shard(suffix: str) -> None:
    stored = bytearray(COMPRESS[suffix](TAR))
    for i in range(len(stored) // 3, len(stored) // 3 + 40):
        stored[i] ^= 0x55
    with pytest.raises(CorruptTarError) as info:
        ours(bytes(stored), "s3://b/x" + suffix, 512)
    assert info.value.url == "s3://b/x" + suffix


def test_a_gzip_shard_under_512_bytes_is_read_not_called_truncated() -> None:
    empty = io.BytesIO()
    with tarfile.open(fileobj=empty, mode="w"):
        pass
    one = io.BytesIO()
    with tarfile.open(fileobj=one, mode="w") as archive:
        info = tarfile.TarInfo("000.cls")
        info.size = 1
        archive.addfile(info, io.BytesIO(b"7"))
    for tar in (empty.getvalue(), one.getvalue()):
        stored = gzip.compress(tar)
        assert len(stored) < 512
        assert ours(stored, "tiny.tar.gz") == wds_samples(stored, "tiny.tar.gz")
        assert ours(stored, "tiny.tar.gz", 3) == wds_samples(stored, "tiny.tar.gz")
    with pytest.raises(CorruptTarError, match=r"gzip-compressed: name it \.tar\.gz"):
        ours(gzip.compress(one.getvalue()), "tiny.tar")


def test_a_plain_tar_under_a_compressed_name_reads_as_tarfile_reads_it() -> None:
    assert ours(TAR, "plain.tar.gz", 700) == wds_samples(TAR, "plain.tar.gz")


def test_a_compressed_tar_under_a_plain_name_is_refused_saying_so() -> None:
    for suffix, pack in COMPRESS.items():
        kind = {".tgz": ".tar.gz"}.get(suffix, suffix)
        with pytest.raises(CorruptTarError, match=f"name it {kind}"):
            ours(pack(TAR), "s3://b/shard.tar")


def test_ranges_must_follow_and_errors_stick() -> None:
    stored = gzip.compress(TAR)
    reader = CompressedReader("x.tar.gz", len(stored))
    with pytest.raises(ValueError, match="does not follow"):
        reader.feed(stored[10:20], 10)
    bad = bytearray(stored)
    bad[100:200] = bytes(100)
    reader = CompressedReader("x.tar.gz", len(bad))
    with pytest.raises(CorruptTarError):
        reader.feed(bytes(bad), 0, final=True)
    with pytest.raises(CorruptTarError):
        reader.feed(b"", len(bad), final=True)
    with pytest.raises(ValueError, match="bad start"):
        CompressedReader("x.tar.gz", 10, start=3)


def test_a_resume_point_past_the_tars_end_is_refused() -> None:
    stored = gzip.compress(make_tar(1))
    with pytest.raises(CorruptTarError, match="before"):
        ours_from(stored, "x.tar.gz", start=1 << 20)


def ours_from(stored: bytes, url: str, start: int) -> list[object]:
    reader = open_reader(url, len(stored), start)
    return list(reader.feed(stored, 0, final=True))


def test_names() -> None:
    assert compression_of("s3://b/a.tar.gz") == "gzip"
    assert compression_of("file:///a.tgz") == "gzip"
    assert compression_of("a.tar.zst") == compression_of("a.tzst") == "zstd"
    assert compression_of("a.tar.xz") == "xz"
    assert compression_of("a.tar.bz2") == compression_of("a.tbz2") == "bzip2"
    assert compression_of("a.tar") is None
    assert all(is_shard_name(f"a{s}") for s in (".tar", *COMPRESS))
    assert not is_shard_name("a.tar.lz4")
    assert not is_shard_name("a.json")
    assert unread_format("s3://b/a.tar.lz4") == ".tar.lz4"
    assert unread_format("a.TAR.Z") == ".tar.z"
    assert unread_format("a.tar.gz") is None
    assert isinstance(open_reader("a.tar", 1024), ShardReader)


# --------------------------------------------------------------------------- in a stream


def compressed_shards() -> dict[str, bytes]:
    """Two gzip, two zstd, one xz and one bzip2 shard of 30 samples, members of 100 B to
    6 KB (chunks of 4 KiB cut through samples and through compressed blocks)."""
    out: dict[str, bytes] = {}
    names = ["a.tar.gz", "b.tgz", "c.tar.zst", "d.tar.zst", "e.tar.xz", "f.tar.bz2"]
    for i, name in enumerate(names):
        rng = random.Random(i)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as archive:
            for j in range(30):
                for ext, data in (
                    ("jpg", rng.randbytes(rng.choice([100, 700, 3000, 6000]))),
                    ("CLS", b"%d" % (j % 5)),
                ):
                    info = tarfile.TarInfo(f"s{i}_{j:03d}.{ext}")
                    info.size = len(data)
                    archive.addfile(info, io.BytesIO(data))
        suffix = "." + name.split(".", 1)[1]
        out[name] = COMPRESS[suffix](buf.getvalue())
    return out


@pytest.fixture(scope="module")
def compressed_bucket(s3_server: LocalS3) -> tuple[str, dict[str, dict[str, bytes]]]:
    """The shards under ``s3://compressed-<pid>/train/``, beside a ``.tar.lz4`` (not read)
    and a README; and every sample by key, as webdataset reads it."""
    bucket = f"compressed-{os.getpid()}"
    client = s3_server.client()
    client.create_bucket(Bucket=bucket)
    expected: dict[str, dict[str, bytes]] = {}
    for name, stored in compressed_shards().items():
        client.put_object(Bucket=bucket, Key=f"train/{name}", Body=stored)
        for sample in wds_samples(stored, name):
            expected[sample.pop("__key__")] = sample
    client.put_object(Bucket=bucket, Key="train/old.tar.lz4", Body=b"\x04\x22\x4d\x18")
    client.put_object(Bucket=bucket, Key="train/README", Body=b"hello")
    assert len(expected) == 180
    return f"s3://{bucket}/train/", expected


def open_compressed(url: str, options: S3Options, **kwargs: Any) -> ShardStream:
    with pytest.warns(UnreadShardWarning, match=r"\.tar\.lz4"):
        return ShardStream(
            url,
            s3=options,
            chunk_bytes=4096,
            window=3,
            inflight=3,
            index_cache=False,
            retry=RetryPolicy(max_attempts=30, base_delay=0.002, max_delay=0.02),
            timeouts=Timeouts(stall=1.0),
            **kwargs,
        )


def test_an_epoch_of_compressed_shards_through_faults_is_exact(
    s3_server: LocalS3, compressed_bucket: tuple[str, dict[str, dict[str, bytes]]]
) -> None:
    url, expected = compressed_bucket
    plan = FaultPlan(slowdown=0.03, internal_error=0.02, reset=0.02, truncate=0.03, match=".t")
    with FaultProxy(s3_server.endpoint_url, faults=plan, seed=5) as proxy:
        options = S3Options(
            endpoint_url=proxy.endpoint_url, credentials=s3_server.options().credentials
        )
        with open_compressed(url, options, seed=1) as stream:
            for epoch in range(2):
                stream.set_epoch(epoch)
                seen = Counter()
                for sample in stream:
                    key = sample["__key__"]
                    seen[key] += 1
                    assert {k: sample[k] for k in ("jpg", "cls")} == expected[key], key
                assert seen == Counter(dict.fromkeys(expected, 1))
            assert sum(stream.stats()["fetch"]["retries"].values()) > 0
        faults = proxy.stats()
        assert sum(faults[kind] for kind in ("slowdown", "internal_error", "reset", "truncate")) > 0


def test_resume_inside_compressed_shards_is_exact(
    s3_server: LocalS3, compressed_bucket: tuple[str, dict[str, dict[str, bytes]]]
) -> None:
    url, _ = compressed_bucket
    options = s3_server.options()
    with open_compressed(url, options, seed=3) as stream:
        whole = [s["__key__"] for s in stream]
    for cut in (1, 17, 95, 179):
        with open_compressed(url, options, seed=3) as stream:
            it = iter(stream)
            before = [next(it)["__key__"] for _ in range(cut)]
            state = json.loads(json.dumps(stream.state_dict()))
        assert before == whole[:cut]
        with open_compressed(url, options, seed=3) as stream:
            stream.load_state_dict(state)
            assert [s["__key__"] for s in stream] == whole[cut:], cut


def test_resume_onto_another_topology_reads_compressed_shards_from_their_start(
    s3_server: LocalS3, compressed_bucket: tuple[str, dict[str, dict[str, bytes]]]
) -> None:
    url, expected = compressed_bucket
    options = s3_server.options()
    read: list[str] = []
    states = []
    for rank in range(2):
        with open_compressed(url, options, seed=2, rank=rank, world_size=2) as stream:
            it = iter(stream)
            read += [next(it)["__key__"] for _ in range(24)]  # 132 left: 3 ranks, no remainder
            states.append(stream.state_dict())
    for rank in range(3):
        with open_compressed(url, options, seed=2, rank=rank, world_size=3) as stream:
            stream.load_state_dict(states)
            read += [s["__key__"] for s in stream]
    assert Counter(read) == Counter(dict.fromkeys(expected, 1))


def test_compressed_shards_are_cached_listed_and_indexed(
    s3_server: LocalS3,
    compressed_bucket: tuple[str, dict[str, dict[str, bytes]]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, expected = compressed_bucket
    options = s3_server.options()
    with open_compressed(url, options, cache_dir=tmp_path / "cache") as stream:
        for epoch in range(2):
            stream.set_epoch(epoch)
            assert sorted(s["__key__"] for s in stream) == sorted(expected)
        cache = stream.stats()["fetch"]["cache"]
        assert cache["hits"] > 0
    endpoint = ["--endpoint-url", s3_server.endpoint_url]
    with pytest.warns(UnreadShardWarning):
        assert main(["ls", url, "--samples", *endpoint]) == 0
    listing = capsys.readouterr().out
    for name in compressed_shards():
        assert name in listing
    assert "180 samples" in listing
    with pytest.warns(UnreadShardWarning):
        assert main(["index", url, "--no-progress", "--chunk-bytes", "4KiB", *endpoint]) == 0
    capsys.readouterr()
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    body = s3_server.client().get_object(Bucket=bucket, Key=prefix + "asyncstream.json")["Body"]
    manifest = json.loads(body.read())
    assert sorted(e["url"] for e in manifest["shards"]) == sorted(compressed_shards())
    assert sum(e["samples"] for e in manifest["shards"]) == 180
    with open_compressed(url, options) as stream:
        assert stream.stats()["index"]["kind"] == "asyncstream"
        assert stream.num_samples == 180
    s3_server.client().delete_object(Bucket=bucket, Key=prefix + "asyncstream.json")
