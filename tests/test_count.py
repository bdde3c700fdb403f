"""Counting through the fetch engine: real S3 (moto) behind the fault proxy, foreign shards.

Also the distributed split: two processes under ``torch.distributed`` (gloo, on the CPU)
open one dataset with no index; each shard is read once in all, and both ranks get (and
keep) every count.
"""

from __future__ import annotations

import io
import json
import tarfile
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from _foreign import foreign_shards, upload
from _torchrun import torchrun

from asyncstream import (
    CorruptTarError,
    FetchConfig,
    LocalS3,
    RetryPolicy,
    S3Options,
    Timeouts,
    resolve_shards,
)
from asyncstream.dataset._count import CountProgress, CountSettings, count_shards
from asyncstream.dataset._index_cache import IndexCache
from asyncstream.stores._s3 import parse_s3_url
from asyncstream.testing import FaultPlan, FaultProxy

pytestmark = pytest.mark.timeout(240)

SIZES = [7, 12, 1, 30, 9, 15]
FAST_RETRY = RetryPolicy(max_attempts=8, base_delay=0.001, max_delay=0.01, deadline=60)
SHORT = Timeouts(connect=5, first_byte=5, stall=0.5, chunk=30)


@pytest.fixture
def dataset(s3_client: Any, bucket: str) -> dict[str, Any]:
    names = [f"{i:05d}.tar" for i in range(len(SIZES))]
    shards = foreign_shards(names, SIZES)
    upload(s3_client, bucket, "wds/", shards)
    return {"url": f"s3://{bucket}/wds/", "bucket": bucket, "foreign": shards}


def proxied(s3_server: LocalS3, proxy: FaultProxy) -> S3Options:
    return S3Options(endpoint_url=proxy.endpoint_url, credentials=s3_server.options().credentials)


def test_every_shard_is_read_once_in_chunks_and_counted(
    s3_server: LocalS3, dataset: dict[str, Any]
) -> None:
    with FaultProxy(s3_server.endpoint_url) as proxy:
        options = proxied(s3_server, proxy)
        shards = resolve_shards(dataset["url"], options)
        seen: list[tuple[str, int]] = []
        reports: list[CountProgress] = []
        settings = CountSettings(fetch=FetchConfig(inflight=3, chunk_bytes=4096), s3=options)
        before = len(proxy.requests())
        counted = count_shards(
            shards,
            settings,
            on_shard=lambda s, n: seen.append((s.url, n)),
            progress=reports.append,
        )
        gets = Counter(path for method, path, _ in proxy.requests()[before:] if method == "GET")
    assert counted.counts == SIZES
    assert seen == [(s.url, n) for s, n in zip(shards, SIZES, strict=True)]
    for shard in shards:  # chunks in flow are coalesced: never more GETs than chunks
        assert 1 <= gets["/" + "/".join(parse_s3_url(shard.url))] <= -(-shard.size // 4096)
    assert counted.bytes == sum(s.size for s in shards)
    last = reports[-1]
    assert (last.shards, last.shards_total) == (len(SIZES), len(SIZES))
    assert (last.bytes, last.bytes_total, last.samples) == (counted.bytes,) * 2 + (sum(SIZES),)
    assert [r.shards for r in reports] == sorted(r.shards for r in reports)


def test_counting_reads_through_ten_percent_faulted_gets(
    s3_server: LocalS3, dataset: dict[str, Any]
) -> None:
    plan = FaultPlan(
        slowdown=0.03, internal_error=0.02, reset=0.02, truncate=0.02, stall=0.01, stall_seconds=2
    )
    with FaultProxy(s3_server.endpoint_url, faults=plan, seed=3) as proxy:
        options = proxied(s3_server, proxy)
        shards = resolve_shards(dataset["url"], options)
        settings = CountSettings(
            fetch=FetchConfig(inflight=4, chunk_bytes=4096, retry=FAST_RETRY, timeouts=SHORT),
            s3=options,
        )
        counted = count_shards(shards, settings)
        faults = proxy.stats()
    assert counted.counts == SIZES
    injected = sum(faults[k] for k in ("slowdown", "internal_error", "reset", "truncate", "stall"))
    assert injected > 0
    assert counted.retries >= injected - faults["stall"]  # a stall may outlive its attempt


def test_a_corrupt_shard_is_named_with_its_offset(
    s3_server: LocalS3, s3_client: Any, bucket: str
) -> None:
    good = foreign_shards(["good.tar"], [3])[0].data
    with tarfile.open(fileobj=io.BytesIO(good)) as archive:
        offset = archive.getmembers()[4].offset  # the second sample's second member
    bad = bytearray(good)
    bad[offset + 10] ^= 0xFF
    s3_client.put_object(Bucket=bucket, Key="bad.tar", Body=bytes(bad))
    shards = resolve_shards(f"s3://{bucket}/bad.tar", s3_server.options())
    with pytest.raises(CorruptTarError) as info:
        count_shards(
            shards,
            CountSettings(fetch=FetchConfig(inflight=2, chunk_bytes=1024), s3=s3_server.options()),
        )
    assert info.value.url == f"s3://{bucket}/bad.tar"
    assert info.value.offset == offset
    assert f"s3://{bucket}/bad.tar" in str(info.value)


def test_an_empty_object_is_no_shard(s3_server: LocalS3, s3_client: Any, bucket: str) -> None:
    s3_client.put_object(Bucket=bucket, Key="empty.tar", Body=b"")
    shards = resolve_shards(f"s3://{bucket}/empty.tar", s3_server.options())
    with pytest.raises(CorruptTarError, match="empty"):
        count_shards(shards, CountSettings(s3=s3_server.options()))


# --------------------------------------------------------------------------- distributed

RANK = textwrap.dedent(
    """
    import json, sys
    import torch.distributed as dist
    from asyncstream import S3Options, S3Credentials, ShardStream

    if __name__ == "__main__":
        url, endpoint, out = sys.argv[1], sys.argv[2], sys.argv[3]
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        options = S3Options(endpoint_url=endpoint, credentials=S3Credentials("k", "s"))
        stream = ShardStream(url, s3=options, inflight=2, index_cache=f"{out}/cache{rank}")
        stats = stream.stats()
        with open(f"{out}/rank{rank}.json", "w") as f:
            json.dump({"counts": list(stream._settings.counts), "index": stats["index"]}, f)
        stream.close()
        dist.destroy_process_group()
    """
)


@pytest.mark.slow
def test_ranks_split_the_counting_and_share_it(
    s3_server: LocalS3, dataset: dict[str, Any], tmp_path: Path
) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    with FaultProxy(s3_server.endpoint_url) as proxy:
        result = torchrun(script, dataset["url"], proxy.endpoint_url, str(tmp_path), timeout=200)
        gets = Counter(path for method, path, _ in proxy.requests() if method == "GET")
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["counts"] == ranks[1]["counts"] == SIZES
    for r in ranks:
        assert r["index"]["shards"]["counted"] == len(SIZES)
    bucket = dataset["bucket"]
    tars = {p: n for p, n in gets.items() if p.endswith(".tar")}
    assert tars == {f"/{bucket}/wds/{f.name}": 1 for f in dataset["foreign"]}  # once in all
    shards = resolve_shards(dataset["url"], s3_server.options())
    for r in range(2):  # and each rank keeps every count, the other rank's too
        with IndexCache(tmp_path / f"cache{r}") as cache:
            assert cache.get(shards) == {s.url: n for s, n in zip(shards, SIZES, strict=True)}
