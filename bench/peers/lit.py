"""litdata (Lightning AI): the tars converted once with its ``optimize``, read back with its
``StreamingDataset`` at its defaults.

Conversion: ``optimize`` is given the shard URLs as its inputs; it downloads each shard to
its own cache and calls :func:`shard_samples` on the local copy, which yields one item per
sample (``key`` str, ``jpg`` and ``cls`` bytes as stored); chunks of ``chunk_bytes="64MB"``
(the size its documentation suggests), one worker per core, uploaded by ``optimize`` to
``target``.

Reading: ``StreamingDataset(target, shuffle=True, seed=...)`` with its default cache limit
and pre-download; the cache folder is in the run's scratch folder, removed afterwards.

Mixing (:func:`mix_samples`): each dataset converted as above, to a target of its own,
and read with ``CombinedStreamingDataset(datasets, weights=..., iterate_over_all=False,
seed=...)``, as litdata's documentation mixes datasets by proportion.

litdata prefers ``obstore`` for chunk downloads when it is installed, but its ``S3Store``
gets explicit client options that drop ``AWS_ALLOW_HTTP``, so it cannot reach a plain
``http://`` endpoint (moto, the fault proxy): the peers environment leaves obstore out,
and litdata downloads with boto3, its other documented path.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import litdata

from ._common import (
    Context,
    Sample,
    delete_prefix,
    iterate,
    s3_client,
    sample_of,
    split_s3_url,
    tar_samples,
)

NAME = "litdata"
DISTRIBUTIONS = ("litdata", "torch")
SHUFFLE = "StreamingDataset(shuffle=True) with its default algorithm"

CHUNK_BYTES = "64MB"


def shard_samples(path: str) -> Iterator[dict[str, Any]]:
    """The items of one shard for ``optimize``: a local copy, or an ``s3://`` URL."""
    if path.startswith("s3://"):
        bucket, key = split_s3_url(path)
        body = s3_client(os.environ.get("AWS_ENDPOINT_URL")).get_object(Bucket=bucket, Key=key)
        source = body["Body"]
    else:
        source = open(path, "rb")  # noqa: SIM115 - closed below
    try:
        for name, fields in tar_samples(source):
            yield {"key": name, "jpg": fields["jpg"], "cls": fields["cls"]}
    finally:
        source.close()


def _storage_options(ctx: Context) -> dict[str, Any]:
    return {"endpoint_url": ctx.endpoint_url} if ctx.endpoint_url else {}


def convert(ctx: Context) -> dict[str, Any]:
    """``optimize`` every shard into litdata chunks at ``ctx.target`` (old contents removed)."""
    delete_prefix(s3_client(ctx.endpoint_url), ctx.target)
    litdata.optimize(
        fn=shard_samples,
        inputs=list(ctx.shards),
        output_dir=ctx.target,
        chunk_bytes=CHUNK_BYTES,
        num_workers=os.cpu_count() or 1,
        storage_options=_storage_options(ctx),
        mode="overwrite",
    )
    return {}


def _as_bytes(item: dict[str, Any]) -> dict[str, Any]:
    # Items are memoryviews into the chunk; a DataLoader worker cannot send those.
    return {k: bytes(v) if isinstance(v, memoryview) else v for k, v in item.items()}


def samples(ctx: Context) -> Iterator[Sample]:
    """Every sample through litdata's ``StreamingDataset``, shuffled."""
    dataset = litdata.StreamingDataset(
        ctx.target,
        cache_dir=str(ctx.scratch / "litdata-cache"),
        shuffle=True,
        seed=ctx.seed,
        storage_options=_storage_options(ctx),
        transform=_as_bytes if ctx.workers else None,
    )
    for sample in iterate(dataset, ctx.workers):
        yield sample_of(sample["key"], sample["jpg"], sample["cls"])
    ctx.end_of_epoch()


def mix_samples(ctx: Context, sources: Sequence[dict[str, Any]]) -> Iterator[tuple[str, Sample]]:
    """``(source name, sample)`` through ``CombinedStreamingDataset`` over one
    ``StreamingDataset`` per source (``{"name", "target", "weight"}``, converted at
    ``target``), weighted, until the first source runs out."""
    datasets = [
        litdata.StreamingDataset(
            source["target"],
            cache_dir=str(ctx.scratch / f"litdata-cache-{k}"),
            shuffle=True,
            seed=ctx.seed,
            storage_options=_storage_options(ctx),
            transform=lambda item, name=source["name"]: {**_as_bytes(item), "source": name},
        )
        for k, source in enumerate(sources)
    ]
    total = sum(float(source["weight"]) for source in sources)
    combined = litdata.CombinedStreamingDataset(
        datasets,
        seed=ctx.seed,
        weights=[float(source["weight"]) / total for source in sources],
        iterate_over_all=False,
    )
    for sample in iterate(combined, ctx.workers):
        yield sample["source"], sample_of(sample["key"], sample["jpg"], sample["cls"])
