"""MosaicML ``streaming``: the tars converted once with its ``MDSWriter``, read back with
``StreamingDataset`` at its defaults.

Conversion: every tar sample becomes one MDS sample with the columns ``key`` (str), ``jpg``
and ``cls`` (bytes, as stored), no compression (JPEG does not compress), shards of the
default ``size_limit`` (64 MiB), uploaded by the writer itself to ``target``.

Reading: ``StreamingDataset(remote=target, local=<scratch>, shuffle=True)`` with its default
shuffle (``py1e``, default block size and canonical nodes), ``batch_size`` as given and the
seed. Shards are downloaded whole into the local cache (in the run's scratch folder, which
is removed afterwards); its index and locks live in shared memory. Mosaic reads its S3
endpoint from ``S3_ENDPOINT_URL``, which the runner sets.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from streaming import MDSWriter, StreamingDataset

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

NAME = "mosaic"
DISTRIBUTIONS = ("mosaicml-streaming", "torch", "torchvision")
SHUFFLE = "StreamingDataset(shuffle=True) with its default algorithm (py1e) and block size"

COLUMNS = {"key": "str", "jpg": "bytes", "cls": "bytes"}


def convert(ctx: Context) -> dict[str, Any]:
    """Write every tar sample to MDS shards at ``ctx.target`` (old contents removed)."""
    client = s3_client(ctx.endpoint_url)
    delete_prefix(client, ctx.target)
    count = 0
    with MDSWriter(out=ctx.target, columns=COLUMNS, compression=None) as writer:
        for url in ctx.shards:
            bucket, key = split_s3_url(url)
            body = client.get_object(Bucket=bucket, Key=key)["Body"]
            try:
                for name, fields in tar_samples(body):
                    writer.write({"key": name, "jpg": fields["jpg"], "cls": fields["cls"]})
                    count += 1
            finally:
                body.close()
    return {"samples": count}


def samples(ctx: Context) -> Iterator[Sample]:
    """Every sample through ``StreamingDataset``, shuffled."""
    dataset = StreamingDataset(
        remote=ctx.target,
        local=str(ctx.scratch / "mosaic-local"),
        shuffle=True,
        shuffle_seed=ctx.seed,
        batch_size=ctx.batch_size,
    )
    for sample in iterate(dataset, ctx.workers):
        yield sample_of(sample["key"], sample["jpg"], sample["cls"])
    ctx.end_of_epoch()
