"""webdataset: tar shards streamed over HTTP, at the settings its documentation recommends.

The shards are read over plain HTTPS/HTTP as webdataset does for ``http(s)://`` URLs (a
``curl`` process per shard), with presigned GET URLs so that a private bucket works the
same way. Shuffling: ``shardshuffle=100`` (the value ``shardshuffle=True`` stands for) and
a sample buffer of ``shuffle_buffer`` (1,000 by default, as in webdataset's examples).

Mixing (:func:`mix_samples`): ``wds.RandomMix`` over one such pipeline per dataset, with
the weights as its ``probs``: each sample comes from a dataset drawn at random (Python's
``random``, seeded with the run's seed).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from typing import Any

import webdataset as wds

from ._common import Context, Sample, iterate, s3_client, sample_of, split_s3_url

NAME = "webdataset"
DISTRIBUTIONS = ("webdataset", "torch")
SHUFFLE = "shardshuffle=100 (a shard buffer of 100) and shuffle(shuffle_buffer) over samples"

_URL_LIFETIME_S = 6 * 3600


def _presigned(ctx: Context, shards: Sequence[str]) -> list[str]:
    client = s3_client(ctx.endpoint_url)
    urls = []
    for url in shards:
        bucket, key = split_s3_url(url)
        urls.append(
            client.generate_presigned_url(
                "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=_URL_LIFETIME_S
            )
        )
    return urls


def _pipeline(ctx: Context, shards: Sequence[str]) -> Any:
    dataset = wds.WebDataset(_presigned(ctx, shards), shardshuffle=100, seed=ctx.seed)
    return dataset.shuffle(ctx.shuffle_buffer, seed=ctx.seed)


def samples(ctx: Context) -> Iterator[Sample]:
    """Every sample through ``wds.WebDataset(...).shuffle(...)``."""
    dataset = _pipeline(ctx, ctx.shards)
    for sample in iterate(dataset, ctx.workers):
        yield sample_of(sample["__key__"], sample["jpg"], sample["cls"])
    ctx.end_of_epoch()


def mix_samples(ctx: Context, sources: Sequence[dict[str, Any]]) -> Iterator[tuple[str, Sample]]:
    """``(source name, sample)`` through ``wds.RandomMix`` of one pipeline per source
    (``{"name", "shards", "weight"}``), until the first source runs out."""
    random.seed(ctx.seed)  # RandomMix draws with the random module
    pipelines = [
        _pipeline(ctx, source["shards"]).map(lambda s, name=source["name"]: {**s, "source": name})
        for source in sources
    ]
    mixed = wds.RandomMix(pipelines, probs=[float(source["weight"]) for source in sources])
    for sample in iterate(mixed, ctx.workers):
        yield sample["source"], sample_of(sample["__key__"], sample["jpg"], sample["cls"])
