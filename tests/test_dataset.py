"""Opening datasets that other tools made (``_dataset.py``, ``_opener.py``): their indexes,
the cache, counting, stale shards.

Everything runs against the real S3 server (moto) through the fault proxy, whose request
log tells which objects were read: "zero shard GETs" is counted there. Shards are written
with ``tarfile`` and ``webdataset.TarWriter`` (tests/_foreign.py), never by ``pack``.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path
from typing import Any

import pytest
from _foreign import Foreign, foreign_shards, upload, write

from asyncstream import (
    DataError,
    LocalS3,
    RetryPolicy,
    S3Options,
    ShardStream,
    StaleShardWarning,
    Timeouts,
)
from asyncstream.dataset._index import MANIFEST_KIND
from asyncstream.testing import FaultPlan, FaultProxy

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parent.parent
FAST_RETRY = RetryPolicy(max_attempts=8, base_delay=0.001, max_delay=0.01, deadline=60)
SHORT = Timeouts(connect=5, first_byte=5, stall=0.5, chunk=30)
CHUNK = 8192


def options_for(s3_server: LocalS3, proxy: FaultProxy) -> S3Options:
    return S3Options(endpoint_url=proxy.endpoint_url, credentials=s3_server.options().credentials)


def shard_gets(proxy: FaultProxy, since: int = 0) -> list[str]:
    """Paths of the ``.tar`` objects GET since request number ``since``."""
    return [p for m, p, _ in proxy.requests()[since:] if m == "GET" and p.endswith(".tar")]


def keys(stream: ShardStream) -> list[str]:
    return [sample["__key__"] for sample in stream]


def all_keys(shards: list[Foreign]) -> list[str]:
    return sorted(k for s in shards for k in s.keys)


def open_stream(url: str, options: S3Options, **kwargs: Any) -> ShardStream:
    base: dict[str, Any] = {"s3": options, "chunk_bytes": CHUNK, "window": 3, "inflight": 2}
    return ShardStream(url, **{**base, **kwargs})


# --------------------------------------------------------------------------- foreign indexes

NAMES = [f"{i:05d}.tar" for i in range(5)]
SIZES = [11, 4, 20, 7, 13]


def _wids(shards: list[Foreign]) -> tuple[str, Any]:
    return "wids-index.json", {
        "__kind__": "wids-shard-index-v1",
        "wids_version": 1,
        "shardlist": [{"url": s.name, "nsamples": len(s.keys)} for s in shards],
    }


def _info(shards: list[Foreign]) -> tuple[str, Any]:
    split = {"name": "train", "filenames": [s.name for s in shards]}
    split["shard_lengths"] = [len(s.keys) for s in shards]
    split["num_samples"] = sum(len(s.keys) for s in shards)
    return "_info.json", {"name": "foreign", "splits": {"train": split}}


def _sizes(shards: list[Foreign]) -> tuple[str, Any]:
    return "sizes.json", {s.name: len(s.keys) for s in shards}


INDEXES = {"wids": _wids, "info.json": _info, "sizes.json": _sizes}


@pytest.mark.parametrize("kind", [*INDEXES, "img2dataset"])
def test_a_foreign_index_opens_with_its_counts_and_no_shard_get(
    kind: str, s3_server: LocalS3, s3_client: Any, bucket: str, proxy: FaultProxy
) -> None:
    shards = foreign_shards(NAMES, SIZES)
    upload(s3_client, bucket, "ds/", shards)
    if kind == "img2dataset":
        for s in shards:
            stats = {"count": len(s.keys) + 2, "successes": len(s.keys), "failed_to_download": 2}
            key = f"ds/{s.name[:-4]}_stats.json"
            s3_client.put_object(Bucket=bucket, Key=key, Body=json.dumps(stats).encode())
        index_url = f"s3://{bucket}/ds/*_stats.json"
    else:
        name, body = INDEXES[kind](shards)
        s3_client.put_object(Bucket=bucket, Key=f"ds/{name}", Body=json.dumps(body).encode())
        index_url = f"s3://{bucket}/ds/{name}"
    options = options_for(s3_server, proxy)
    with open_stream(f"s3://{bucket}/ds/", options) as stream:
        assert shard_gets(proxy) == []  # opened from the index alone
        assert list(stream._settings.counts) == SIZES
        index = stream.stats()["index"]
        assert (index["kind"], index["url"]) == (kind, index_url)
        assert index["shards"] == {"index": 5, "given": 0, "cache": 0, "counted": 0}
        assert sorted(keys(stream)) == all_keys(shards)  # and the counts were right


def test_an_index_given_as_the_url_with_every_size_opens_in_one_get(
    s3_server: LocalS3, s3_client: Any, bucket: str, proxy: FaultProxy
) -> None:
    shards = foreign_shards(NAMES, SIZES)
    upload(s3_client, bucket, "data/", shards)
    wids = {
        "__kind__": "wids-shard-index-v1",
        "base": "../data",
        "shardlist": [
            {"url": s.name, "nsamples": len(s.keys), "filesize": len(s.data)} for s in shards
        ],
    }
    body = json.dumps(wids).encode()
    s3_client.put_object(Bucket=bucket, Key="indexes/train.json", Body=body)
    options = options_for(s3_server, proxy)
    with open_stream(f"s3://{bucket}/indexes/train.json", options) as stream:
        assert proxy.requests() == [("GET", f"/{bucket}/indexes/train.json", 200)]
        assert stream.num_samples == sum(SIZES)
        assert stream.stats()["index"]["kind"] == "wids"
        assert sorted(keys(stream)) == all_keys(shards)


def test_timm_splits_are_chosen_and_other_splits_left_out_silently(
    s3_server: LocalS3, s3_client: Any, bucket: str, proxy: FaultProxy
) -> None:
    train = foreign_shards([f"imagenet-train-{i:04d}.tar" for i in range(3)], [5, 6, 7])
    val = foreign_shards(["imagenet-validation-0000.tar"], [4], seed=1)
    stray = foreign_shards(["imagenet-extra-0000.tar"], [2], seed=2)
    upload(s3_client, bucket, "in1k/", train + val + stray)

    def split(shards: list[Foreign]) -> dict[str, Any]:
        return {
            "filenames": [s.name for s in shards],
            "shard_lengths": [len(s.keys) for s in shards],
        }

    info = {"splits": {"train": split(train), "validation": split(val)}}
    s3_client.put_object(Bucket=bucket, Key="in1k/_info.json", Body=json.dumps(info).encode())
    options = options_for(s3_server, proxy)
    url = f"s3://{bucket}/in1k/"
    with pytest.raises(ValueError, match=r"several splits \('train', 'validation'\)"):
        open_stream(url, options)
    with pytest.warns(StaleShardWarning, match="imagenet-extra-0000.tar") as caught:
        stream = open_stream(url, options, split="validation")
    assert len(caught) == 1
    assert "imagenet-train" not in str(caught[0].message)  # another split is not stale
    with stream:
        assert sorted(keys(stream)) == all_keys(val)
        assert stream.stats()["index"]["split"] == "validation"
    with pytest.raises(ValueError, match="no split 'test'"):
        open_stream(url, options, split="test")
    assert all("extra" not in p for p in shard_gets(proxy))


# --------------------------------------------------------------------------- no index at all


def test_no_index_counts_through_ten_percent_faulted_gets_and_reads_each_sample_once(
    s3_server: LocalS3, s3_client: Any, bucket: str, tmp_path: Path, caplog: Any
) -> None:
    shards = foreign_shards([f"{i:09d}.tar" for i in range(8)], [9, 14, 3, 21, 8, 12, 5, 16])
    upload(s3_client, bucket, "raw/", shards)
    plan = FaultPlan(
        slowdown=0.03, internal_error=0.02, reset=0.02, truncate=0.02, stall=0.01, stall_seconds=2
    )
    with FaultProxy(s3_server.endpoint_url, faults=plan, seed=11) as proxy:
        options = options_for(s3_server, proxy)
        caplog.set_level("WARNING", logger="asyncstream")
        with open_stream(
            f"s3://{bucket}/raw/",
            options,
            retry=FAST_RETRY,
            timeouts=SHORT,
            index_cache=tmp_path / "cache",
        ) as stream:
            counted = proxy.stats()
            got = keys(stream)
            index = stream.stats()["index"]
        faults = proxy.stats()
    assert sorted(got) == all_keys(shards)  # every sample exactly once
    assert index["shards"]["counted"] == 8
    injected = ("slowdown", "internal_error", "reset", "truncate", "stall")
    assert sum(counted[k] for k in injected) > 0  # faults hit the counting itself
    assert sum(faults[k] for k in injected) > sum(counted[k] for k in injected)
    (line,) = [r.getMessage() for r in caplog.records if "counting samples" in r.getMessage()]
    assert "8 shards" in line
    assert f"asyncstream index s3://{bucket}/raw/" in line


CHILD = textwrap.dedent(
    """
    import json, sys
    from asyncstream import S3Credentials, S3Options, ShardStream
    url, endpoint, cache = sys.argv[1:4]
    options = S3Options(endpoint_url=endpoint, credentials=S3Credentials("k", "s"))
    with ShardStream(url, s3=options, index_cache=cache) as stream:
        print(json.dumps(stream.stats()["index"]))
    """
)


def test_the_second_open_in_a_new_process_reads_no_shard(
    s3_server: LocalS3, s3_client: Any, bucket: str, proxy: FaultProxy, tmp_path: Path
) -> None:
    shards = foreign_shards([f"part-{i}.tar" for i in range(4)], [6, 2, 9, 4])
    upload(s3_client, bucket, "p/", shards)
    url, cache = f"s3://{bucket}/p/", str(tmp_path / "cache")
    with open_stream(url, options_for(s3_server, proxy), index_cache=cache) as stream:
        assert stream.stats()["index"]["shards"]["counted"] == 4
    assert set(shard_gets(proxy)) == {f"/{bucket}/p/{s.name}" for s in shards}
    before = len(proxy.requests())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.run(
        [sys.executable, "-c", CHILD, url, proxy.endpoint_url, cache],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    assert shard_gets(proxy, before) == []
    assert json.loads(child.stdout)["shards"] == {"index": 0, "given": 0, "cache": 4, "counted": 0}
    with open_stream(url, options_for(s3_server, proxy), index_cache=False) as uncached:
        assert uncached.stats()["index"]["shards"]["counted"] == 4  # no cache: counted again


def test_named_shards_the_index_lacks_are_counted(
    s3_server: LocalS3, s3_client: Any, bucket: str, proxy: FaultProxy, tmp_path: Path
) -> None:
    shards = foreign_shards(NAMES, SIZES)
    upload(s3_client, bucket, "ds/", shards)
    sizes = {s.name: len(s.keys) for s in shards[:3]}
    s3_client.put_object(Bucket=bucket, Key="ds/sizes.json", Body=json.dumps(sizes).encode())
    options = options_for(s3_server, proxy)
    url = f"s3://{bucket}/ds/{{00000..00004}}.tar"
    with open_stream(url, options, index_cache=tmp_path) as stream:
        assert list(stream._settings.counts) == SIZES
        assert stream.stats()["index"]["shards"] == {
            "index": 3,
            "given": 0,
            "cache": 0,
            "counted": 2,
        }
    assert set(shard_gets(proxy)) == {f"/{bucket}/ds/00003.tar", f"/{bucket}/ds/00004.tar"}


# --------------------------------------------------------------------------- the index is the truth


def _manifest(shards: list[Foreign], **override: Any) -> bytes:
    rows = []
    for s in shards:
        row = {"url": s.name, "samples": len(s.keys), "size": len(s.data), "etag": None}
        rows.append({**row, **override.get(s.name, {})})
    return json.dumps({"__kind__": MANIFEST_KIND, "shards": rows}).encode()


@pytest.mark.parametrize(
    ("override", "extra", "fragment"),
    [
        ({}, ["00005.tar"], "listed by"),
        ({"00002.tar": {"size": 12345}}, [], "gives 12345 bytes, the store has"),
        ({"00002.tar": {"etag": '"0123456789abcdef"'}}, [], 'gives ETag "0123456789abcdef"'),
        ({"00002.tar": {"samples": 10_000}}, [], "more than a shard of"),
    ],
)
def test_an_index_that_disagrees_with_the_store_is_refused_naming_both(
    override: dict[str, Any],
    extra: list[str],
    fragment: str,
    s3_server: LocalS3,
    s3_client: Any,
    bucket: str,
    proxy: FaultProxy,
) -> None:
    shards = foreign_shards(NAMES, SIZES)
    upload(s3_client, bucket, "ds/", shards)
    listed = shards + foreign_shards(extra, [1] * len(extra))
    body = _manifest(listed, **override)
    s3_client.put_object(Bucket=bucket, Key="ds/asyncstream.json", Body=body)
    with pytest.raises(DataError) as info:
        open_stream(f"s3://{bucket}/ds/", options_for(s3_server, proxy))
    message = str(info.value)
    assert fragment in message
    assert f"s3://{bucket}/ds/asyncstream.json" in message
    culprit = extra[0] if extra else "00002.tar"
    assert f"s3://{bucket}/ds/{culprit}" in message
    assert shard_gets(proxy) == []


def test_stale_shards_are_warned_about_and_never_read(
    s3_server: LocalS3, s3_client: Any, bucket: str, proxy: FaultProxy
) -> None:
    shards = foreign_shards(NAMES, SIZES)
    upload(s3_client, bucket, "ds/", shards)  # five shards of an earlier, larger pack
    kept = shards[:3]
    s3_client.put_object(Bucket=bucket, Key="ds/asyncstream.json", Body=_manifest(kept))
    options = options_for(s3_server, proxy)
    with pytest.warns(StaleShardWarning) as caught:
        stream = open_stream(f"s3://{bucket}/ds/", options)
    (warning,) = caught
    assert warning.filename == __file__  # the user's line, not asyncstream's
    for stale in NAMES[3:]:
        assert f"s3://{bucket}/ds/{stale}" in str(warning.message)
    assert f"s3://{bucket}/ds/asyncstream.json" in str(warning.message)
    with stream:
        assert sorted(keys(stream)) == all_keys(kept)
        assert stream.stats()["index"]["stale"] == 2
    assert {p.rsplit("/", 1)[1] for p in shard_gets(proxy)} == set(NAMES[:3])
    with pytest.raises(DataError, match=r"00003\.tar, s3://.*00004\.tar: 2 shards not listed"):
        open_stream(f"s3://{bucket}/ds/", options, strict=True)


def test_a_local_folder_with_an_index(tmp_path: Path) -> None:
    shards = foreign_shards(NAMES, SIZES, writer="webdataset")
    write(tmp_path / "ds", shards)
    (tmp_path / "ds" / "sizes.json").write_text(json.dumps({s.name: len(s.keys) for s in shards}))
    with ShardStream(str(tmp_path / "ds"), chunk_bytes=CHUNK, window=2, inflight=2) as stream:
        index = stream.stats()["index"]
        assert (index["kind"], index["url"]) == (
            "sizes.json",
            (tmp_path / "ds" / "sizes.json").as_uri(),
        )
        assert sorted(keys(stream)) == all_keys(shards)


def test_valid_tars_with_no_member_or_only_folders_are_zero_samples_not_an_error(
    tmp_path: Path,
) -> None:
    """As webdataset, which yields nothing for them and goes on."""

    def tar_of(entries: list[tuple[str, bytes | None]]) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as archive:
            for name, data in entries:
                info = tarfile.TarInfo(name)
                if data is None:
                    info.type = tarfile.DIRTYPE
                else:
                    info.size = len(data)
                archive.addfile(info, None if data is None else io.BytesIO(data))
        return buf.getvalue()

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "a.tar").write_bytes(tar_of([]))
    (empty / "b.tar").write_bytes(tar_of([("train/", None), ("train/sub/", None)]))
    (empty / "c.tar").write_bytes(tar_of([("README", b"no extension: no member")]))
    with ShardStream(str(empty) + "/", index_cache=False) as stream:
        assert stream.num_samples == 0
        assert len(stream) == 0
        assert list(stream) == []
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "a.tar").write_bytes(tar_of([]))
    (mixed / "b.tar").write_bytes(tar_of([("x/1.jpg", b"1"), ("x/1.cls", b"0")]))
    with ShardStream(str(mixed) + "/", index_cache=False) as stream:
        assert [s["__key__"] for s in stream] == ["x/1"]
