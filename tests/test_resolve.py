"""Opening a dataset (asyncstream/dataset/_resolve.py): the requests it makes, counted by
the fault proxy in front of the real S3 server. Opening makes no request it does not need,
and the ones it needs run at once, on one client."""

from __future__ import annotations

import io
import tarfile
from dataclasses import replace
from typing import Any

from asyncstream import LocalS3, ShardStream, resolve_shards
from asyncstream.testing import FaultProxy

SHARDS, PER_SHARD = 12, 4


def _upload(client: Any, bucket: str) -> list[str]:
    urls = []
    for i in range(SHARDS):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for j in range(PER_SHARD):
                info = tarfile.TarInfo(f"{i:02d}{j}.txt")
                info.size = 3
                tar.addfile(info, io.BytesIO(b"abc"))
        client.put_object(Bucket=bucket, Key=f"d/shard-{i:02d}.tar", Body=buf.getvalue())
        urls.append(f"s3://{bucket}/d/shard-{i:02d}.tar")
    return urls


def test_shards_named_one_by_one_with_their_counts_take_one_head_each_and_nothing_else(
    s3_server: LocalS3, s3_client: Any, bucket: str, proxy: FaultProxy
) -> None:
    """12 shards named one by one, their sample counts given: opening the stream sends
    exactly one HEAD per shard (the sizes no listing or index gives here), no listing, no
    GET; and they run at once: each held back by the proxy, they need several connections
    (one after another, one kept-alive connection would carry them all)."""
    urls = _upload(s3_client, bucket)
    options = replace(s3_server.options(), endpoint_url=proxy.endpoint_url)
    proxy.inject("latency", SHARDS, method="HEAD", seconds=0.3)
    with ShardStream(urls, s3=options, samples_per_shard=PER_SHARD, window=2, inflight=2) as s:
        opening = proxy.requests()
        connections = proxy.stats()["connections"]
        assert len(list(s)) == SHARDS * PER_SHARD
    assert sorted(opening) == sorted(
        ("HEAD", f"/{bucket}/d/shard-{i:02d}.tar", 200) for i in range(SHARDS)
    )
    assert proxy.pending() == 0  # every HEAD was held back
    assert connections > 1


def test_a_folder_of_many_named_shards_is_sized_by_one_listing(
    s3_server: LocalS3, s3_client: Any, bucket: str, proxy: FaultProxy
) -> None:
    """16 or more named shards in one folder: one listing sizes them all, no HEAD."""
    urls = _upload(s3_client, bucket)
    more = [f"s3://{bucket}/d/more-{i:02d}.tar" for i in range(8)]
    for url in more:
        s3_client.put_object(Bucket=bucket, Key=url.split("/", 3)[3], Body=b"x" * 1024)
    options = replace(s3_server.options(), endpoint_url=proxy.endpoint_url)
    shards = resolve_shards(urls + more, options)
    assert [s.url for s in shards] == urls + more
    assert [(method, status) for method, _, status in proxy.requests()] == [("GET", 200)]
    assert proxy.requests()[0][1] == f"/{bucket}"
