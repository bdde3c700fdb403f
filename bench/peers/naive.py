"""The naive baseline: one boto3 GET per shard, read front to back with ``tarfile``.

What anyone writes first: the shard order is shuffled with the seed, the samples of a
shard come in their stored order (no sample shuffle), one shard at a time, no prefetch.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import boto3  # noqa: F401  # imported up front, so that import time is measured as such

from ._common import Context, Sample, s3_client, sample_of, split_s3_url, tar_samples

NAME = "naive"
DISTRIBUTIONS = ("boto3", "botocore")
SHUFFLE = "shard order shuffled with the seed; samples in stored order within a shard"


def samples(ctx: Context) -> Iterator[Sample]:
    """Every sample of every shard, shards in a seeded random order."""
    if ctx.workers:
        raise ValueError("the naive baseline reads in one process: workers must be 0")
    client = s3_client(ctx.endpoint_url)
    order = list(ctx.shards)
    random.Random(ctx.seed).shuffle(order)
    for url in order:
        bucket, key = split_s3_url(url)
        body = client.get_object(Bucket=bucket, Key=key)["Body"]
        try:
            for name, fields in tar_samples(body):
                yield sample_of(name, fields["jpg"], fields["cls"])
        finally:
            body.close()
    ctx.end_of_epoch()
