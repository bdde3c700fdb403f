"""webdataset: tar shards streamed over HTTP, at the settings its documentation recommends.

The shards are read over plain HTTPS/HTTP as webdataset does for ``http(s)://`` URLs (a
``curl`` process per shard), with presigned GET URLs so that a private bucket works the
same way. Shuffling: ``shardshuffle=100`` (the value ``shardshuffle=True`` stands for) and
a sample buffer of ``shuffle_buffer`` (1,000 by default, as in webdataset's examples).
"""

from __future__ import annotations

from collections.abc import Iterator

import webdataset as wds

from ._common import Context, Sample, iterate, s3_client, sample_of, split_s3_url

NAME = "webdataset"
DISTRIBUTIONS = ("webdataset", "torch")
SHUFFLE = "shardshuffle=100 (a shard buffer of 100) and shuffle(shuffle_buffer) over samples"

_URL_LIFETIME_S = 6 * 3600


def samples(ctx: Context) -> Iterator[Sample]:
    """Every sample through ``wds.WebDataset(...).shuffle(...)``."""
    client = s3_client(ctx.endpoint_url)
    urls = []
    for url in ctx.shards:
        bucket, key = split_s3_url(url)
        urls.append(
            client.generate_presigned_url(
                "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=_URL_LIFETIME_S
            )
        )
    dataset = wds.WebDataset(urls, shardshuffle=100, seed=ctx.seed)
    dataset = dataset.shuffle(ctx.shuffle_buffer, seed=ctx.seed)
    for sample in iterate(dataset, ctx.workers):
        yield sample_of(sample["__key__"], sample["jpg"], sample["cls"])
    ctx.end_of_epoch()
