"""s3torchconnector (Amazon's S3 Connector for PyTorch): its iterable dataset over the tars.

``S3IterableDataset.from_objects`` streams each shard object through the AWS CRT client
(Mountpoint's Rust client); each object is read front to back as a tar stream, as the
connector's own benchmark does with ``load_from_tar``. The dataset has no shuffle of its
own: the shard list is shuffled with the seed before it is handed over, and the samples of
a shard come in their stored order.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from s3torchconnector import S3ClientConfig, S3IterableDataset
from torch.utils.data import IterableDataset

from ._common import Context, Sample, iterate, sample_of, tar_samples

NAME = "s3torchconnector"
DISTRIBUTIONS = ("s3torchconnector", "s3torchconnectorclient", "torch")
SHUFFLE = "none of its own: shard order shuffled with the seed, samples in stored order"


class _TarSamples(IterableDataset[tuple[str, dict[str, bytes]]]):
    """The samples of each object of a dataset of tar objects (in the DataLoader worker)."""

    def __init__(self, objects: Any) -> None:
        self.objects = objects

    def __iter__(self) -> Iterator[tuple[str, dict[str, bytes]]]:
        for reader in self.objects:
            yield from tar_samples(reader)


def samples(ctx: Context) -> Iterator[Sample]:
    """Every sample, shard by shard, through ``S3IterableDataset``."""
    order = list(ctx.shards)
    random.Random(ctx.seed).shuffle(order)
    dataset = S3IterableDataset.from_objects(
        order,
        region=ctx.region,
        endpoint=ctx.endpoint_url,
        s3client_config=S3ClientConfig(force_path_style=ctx.endpoint_url is not None),
        enable_sharding=ctx.workers > 0,
    )
    for key, fields in iterate(_TarSamples(dataset), ctx.workers):
        yield sample_of(key, fields["jpg"], fields["cls"])
    ctx.end_of_epoch()
