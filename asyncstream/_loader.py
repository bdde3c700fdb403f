"""ShardLoader: torchdata's StatefulDataLoader, with a ``len()`` that is the truth.

A DataLoader over an ``IterableDataset`` computes ``len(loader)`` as
``ceil(len(dataset) / batch_size)`` (``floor`` with ``drop_last``), but its workers each
batch their own share of the epoch: with ``W`` workers up to ``W`` batches come out
short, so more batches come out than that (1,000 samples, batches of 16, 2 workers: 63
by the formula, 64 in fact), and with ``drop_last`` up to ``W`` short batches are dropped
(fewer). The dataset alone cannot fix it: ``len(dataset)`` is called without the batch
size or the number of workers. :class:`ShardLoader` asks the stream instead
(:meth:`ShardStream.batches`), which knows every worker's share.
"""

from __future__ import annotations

import warnings
from collections.abc import Sized
from typing import Any, cast

from torchdata.stateful_dataloader import StatefulDataLoader

__all__ = ["ShardLoader"]

SET_VITAL = "'set_vital' is deprecated"


class ShardLoader(StatefulDataLoader):
    """A :class:`torchdata.stateful_dataloader.StatefulDataLoader` whose ``len()`` is the
    number of batches it yields, whatever the number of workers and ``drop_last``.

    It takes StatefulDataLoader's arguments and behaves as it does (exact resume through
    its ``state_dict()``); only ``len()`` differs, for a :class:`~asyncstream.ShardStream`
    or a stage on one (``stream.map(fn)``): the sum of every worker's batches of this
    rank's epoch, each worker ending with its own short batch (dropped with
    ``drop_last=True``). For any other dataset it is StatefulDataLoader's.
    """

    def __init__(self, dataset: Any, *args: Any, **kwargs: Any) -> None:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", SET_VITAL, UserWarning)
            super().__init__(dataset, *args, **kwargs)

    def __len__(self) -> int:
        batches = getattr(self.dataset, "batches", None)
        if self.batch_size is None or not callable(batches):
            return int(super().__len__())
        # As DataLoader.__len__ does: torch warns if more samples come than that.
        self._IterableDataset_len_called = len(cast(Sized, self.dataset))
        return int(batches(self.batch_size, num_workers=self.num_workers, drop_last=self.drop_last))
