"""``asyncstream index``: the manifest of foreign shards, written once, read by every open.

Real S3 (moto) behind the fault proxy, whose request log says which shards were read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _foreign import Foreign, foreign_shards, upload

from asyncstream import (
    FetchConfig,
    LocalS3,
    S3Options,
    ShardStream,
    StaleShardWarning,
    index_dataset,
    resolve_shards,
)
from asyncstream.cli._cli import main
from asyncstream.dataset._count import CountProgress, CountSettings
from asyncstream.dataset._index_cache import IndexCache
from asyncstream.testing import FaultProxy

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parent.parent
N = 10
SIZES = [5 + (7 * i) % 13 for i in range(N)]


@pytest.fixture
def shards(s3_client: Any, bucket: str) -> list[Foreign]:
    made = foreign_shards([f"{i:05d}.tar" for i in range(N)], SIZES)
    upload(s3_client, bucket, "raw/", made)
    return made


def options_for(s3_server: LocalS3, proxy: FaultProxy) -> S3Options:
    return S3Options(endpoint_url=proxy.endpoint_url, credentials=s3_server.options().credentials)


def shard_gets(proxy: FaultProxy, since: int = 0) -> Counter[str]:
    """GETs per shard file name since request number ``since``."""
    requests = proxy.requests()[since:]
    return Counter(p.rsplit("/", 1)[1] for m, p, _ in requests if m == "GET" and p.endswith(".tar"))


def test_the_command_writes_the_manifest_and_opens_then_read_no_shard(
    s3_server: LocalS3,
    s3_client: Any,
    bucket: str,
    shards: list[Foreign],
    proxy: FaultProxy,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ASYNCSTREAM_CACHE_DIR", str(tmp_path / "cache"))
    url = f"s3://{bucket}/raw/"
    argv = ["index", url, "--endpoint-url", proxy.endpoint_url, "--inflight", "3"]
    assert main([*argv, "--chunk-bytes", "8KiB", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert f"indexed {N} shards, {sum(SIZES):,} samples: {N} read" in out
    assert f"wrote {url}asyncstream.json" in out
    gets = shard_gets(proxy)  # every shard read; chunks in flow coalesce into fewer GETs
    assert set(gets) == {s.name for s in shards}
    assert all(1 <= gets[s.name] <= -(-len(s.data) // 8192) for s in shards)
    body = s3_client.get_object(Bucket=bucket, Key="raw/asyncstream.json")["Body"].read()
    manifest = json.loads(body)
    listed = resolve_shards(url, s3_server.options())
    assert [(e["url"], e["samples"], e["size"], e["etag"]) for e in manifest["shards"]] == [
        (s.url.rsplit("/", 1)[1], n, s.size, s.etag) for s, n in zip(listed, SIZES, strict=True)
    ]
    before = len(proxy.requests())
    with ShardStream(url, s3=options_for(s3_server, proxy), index_cache=False) as stream:
        assert stream.stats()["index"]["kind"] == "asyncstream"
        assert stream.num_samples == sum(SIZES)
    assert shard_gets(proxy, before) == Counter()


def ctrl_c_after(shards: int) -> Callable[[CountProgress], None]:
    def progress(p: CountProgress) -> None:
        if p.shards >= shards:
            raise KeyboardInterrupt  # as Ctrl-C would, between two chunks

    return progress


def test_an_interrupted_index_resumes_without_rereading_finished_shards(
    s3_server: LocalS3, bucket: str, shards: list[Foreign], proxy: FaultProxy, tmp_path: Path
) -> None:
    options = options_for(s3_server, proxy)
    settings = CountSettings(fetch=FetchConfig(inflight=1, chunk_bytes=8192), s3=options)
    url, cache = f"s3://{bucket}/raw/", tmp_path / "cache"
    with pytest.raises(KeyboardInterrupt):
        index_dataset(
            url, options=options, counting=settings, index_cache=cache, progress=ctrl_c_after(4)
        )
    finished = [s.name for s in shards[:4]]
    before = len(proxy.requests())
    result = index_dataset(url, options=options, counting=settings, index_cache=cache)
    assert (result.cached, result.read, result.samples) == (4, N - 4, sum(SIZES))
    again = shard_gets(proxy, before)
    assert set(again) == {s.name for s in shards[4:]}
    assert not set(again) & set(finished)


KILLED = """
import sys
from asyncstream.cli._cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_killed_index_resumes_without_rereading_finished_shards(
    s3_server: LocalS3, bucket: str, shards: list[Foreign], proxy: FaultProxy, tmp_path: Path
) -> None:
    proxy.inject("stall", count=1000, match="00006.tar", method="GET", after_bytes=0)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ASYNCSTREAM_CACHE_DIR": str(tmp_path)}
    argv = ["index", f"s3://{bucket}/raw/", "--endpoint-url", proxy.endpoint_url]
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED, *argv, "--inflight", "2", "--no-progress"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    listed = resolve_shards(f"s3://{bucket}/raw/", s3_server.options())
    try:
        deadline = time.monotonic() + 60
        with IndexCache(tmp_path) as cache:
            while len(cache.get(listed)) < 6:  # shards 0..5 counted; 6 stalls forever
                assert time.monotonic() < deadline, "the index did not get to shard 6"
                assert child.poll() is None
                time.sleep(0.05)
    finally:
        child.kill()
        child.wait(30)
    proxy.clear()
    before = len(proxy.requests())
    options = options_for(s3_server, proxy)
    result = index_dataset(f"s3://{bucket}/raw/", options=options, index_cache=tmp_path)
    assert (result.cached, result.read) == (6, N - 6)
    assert set(shard_gets(proxy, before)) == {s.name for s in shards[6:]}


def test_unchanged_shards_keep_their_entry_and_a_rewritten_one_is_read_again(
    s3_server: LocalS3, s3_client: Any, bucket: str, shards: list[Foreign], proxy: FaultProxy
) -> None:
    options = options_for(s3_server, proxy)
    url = f"s3://{bucket}/raw/"
    index_dataset(url, options=options, index_cache=False)
    rewritten = foreign_shards(["00002.tar"], [3], seed=7)
    upload(s3_client, bucket, "raw/", rewritten)  # a new ETag, a new count
    before = len(proxy.requests())
    result = index_dataset(url, options=options, index_cache=False)
    assert (result.reused, result.read) == (N - 1, 1)
    assert shard_gets(proxy, before) == Counter({"00002.tar": 1})
    assert result.samples == sum(SIZES) - SIZES[2] + 3
    with ShardStream(url, s3=options) as stream:
        assert stream._settings.counts[2] == 3


def test_output_elsewhere_opens_the_dataset_from_there_with_no_request(
    s3_server: LocalS3, bucket: str, shards: list[Foreign], proxy: FaultProxy, tmp_path: Path
) -> None:
    options = options_for(s3_server, proxy)
    manifest = tmp_path / "indexes" / "train.json"
    manifest.parent.mkdir()
    result = index_dataset(f"s3://{bucket}/raw/", output=str(manifest), options=options)
    assert result.manifest == manifest.as_uri()
    entries = json.loads(manifest.read_text())["shards"]
    assert entries[0]["url"] == f"s3://{bucket}/raw/00000.tar"  # absolute: it lives elsewhere
    assert [p.name for p in manifest.parent.iterdir()] == ["train.json"]  # no temporary left
    before = len(proxy.requests())
    with ShardStream(str(manifest), s3=options) as stream:
        assert proxy.requests()[before:] == []  # sizes and ETags are in the manifest
        assert sorted(s["__key__"] for s in stream) == sorted(k for s in shards for k in s.keys)


def test_timm_splits_are_carried_into_the_manifest(
    s3_server: LocalS3, s3_client: Any, bucket: str, proxy: FaultProxy
) -> None:
    train = foreign_shards([f"set-train-{i}.tar" for i in range(2)], [3, 4])
    val = foreign_shards(["set-validation-0.tar"], [2], seed=1)
    upload(s3_client, bucket, "t/", train + val)

    def split(part: list[Foreign]) -> dict[str, Any]:
        return {"filenames": [s.name for s in part], "shard_lengths": [len(s.keys) for s in part]}

    info = {"splits": {"train": split(train), "validation": split(val)}}
    s3_client.put_object(Bucket=bucket, Key="t/_info.json", Body=json.dumps(info).encode())
    options = options_for(s3_server, proxy)
    index_dataset(f"s3://{bucket}/t/", options=options)
    manifest = json.loads(
        s3_client.get_object(Bucket=bucket, Key="t/asyncstream.json")["Body"].read()
    )
    assert manifest["splits"] == {
        "train": ["set-train-0.tar", "set-train-1.tar"],
        "validation": ["set-validation-0.tar"],
    }
    with ShardStream(f"s3://{bucket}/t/", s3=options, split="train") as stream:
        assert stream.stats()["index"]["kind"] == "asyncstream"
        assert stream.num_samples == 7


def test_another_tools_index_says_which_shards_are_indexed(
    s3_server: LocalS3, s3_client: Any, bucket: str, shards: list[Foreign], proxy: FaultProxy
) -> None:
    sizes = {s.name: len(s.keys) for s in shards[:7]}  # three .tar of an earlier write linger
    s3_client.put_object(Bucket=bucket, Key="raw/sizes.json", Body=json.dumps(sizes).encode())
    options = options_for(s3_server, proxy)
    with pytest.warns(StaleShardWarning, match="00007.tar") as caught:
        result = index_dataset(f"s3://{bucket}/raw/", options=options, index_cache=False)
    assert "00009.tar" in str(caught[0].message)
    assert (result.shards, result.read) == (7, 7)  # its counts are checked by reading, too
    assert set(shard_gets(proxy)) == set(sizes)
