"""The dataset DataLoader workers run for :class:`~._feeds.WorkerFeed`: whole encoded batches.

Each worker iterates its copy of the stream (the stream splits the epoch over workers, as
for any DataLoader) and yields batches built by a :class:`~._batch.BatchBuilder`, each as
one shared-memory buffer of encoded images, reused (:mod:`._shm`), plus small lists
(:meth:`EncodedBatch.to_wire`).
``state_dict`` / ``load_state_dict`` are the stream's, so ``StatefulDataLoader`` saves each
worker's exact position with every batch and gives it back on resume.

A worker's last batch of an epoch may be short (each worker's share ends on its own), as
with any DataLoader over an iterable dataset; with ``drop_last`` it is dropped, and counted.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from asyncstream import ShardStream

from ._batch import BatchBuilder, read_batches
from ._shm import BufferPool

__all__ = ["EncodedBatches", "identity"]


def identity(batch: dict[str, Any]) -> dict[str, Any]:
    """The DataLoader's ``collate_fn``: a batch is already built (and must stay numpy)."""
    return batch


class EncodedBatches(IterableDataset[dict[str, Any]]):
    """Batches of encoded images from a stream, for ``StatefulDataLoader(batch_size=None)``.

    Args:
        stream: the samples; each worker reads its share of the epoch.
        builder: makes the batches.
        drop_last: drop a worker's last batch when it is short.
    """

    def __init__(self, stream: ShardStream, builder: BatchBuilder, *, drop_last: bool) -> None:
        self.stream = stream
        self.builder = builder
        self.drop_last = drop_last
        self._pool: BufferPool | None = None  # made in the worker, at its first pass

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker = -1 if info is None else info.id
        pool = self._pool
        if pool is None or pool.pid != os.getpid():  # one pool a worker process, kept
            pool = self._pool = BufferPool()
        for batch in read_batches(
            self.stream, self.builder, drop_last=self.drop_last, worker=worker, pool=pool
        ):
            yield batch.to_wire()

    def state_dict(self) -> dict[str, Any]:
        """The stream's position (this worker's, in a worker)."""
        return self.stream.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume the stream (this worker's share, in a worker)."""
        self.stream.load_state_dict(state)


def make_worker_loader(
    stream: ShardStream, builder: BatchBuilder, *, workers: int, drop_last: bool, prefetch: int
) -> Any:
    """A ``StatefulDataLoader`` whose ``workers`` persistent workers build whole batches.

    ``snapshot_every_n_steps=1``: the DataLoader records every worker's stream position
    with every batch, so its ``state_dict()`` before any batch resumes exactly there.
    """
    from torchdata.stateful_dataloader import StatefulDataLoader

    return StatefulDataLoader(
        EncodedBatches(stream, builder, drop_last=drop_last),
        batch_size=None,
        num_workers=workers,
        collate_fn=identity,
        persistent_workers=True,
        prefetch_factor=prefetch,
        snapshot_every_n_steps=1,
    )
