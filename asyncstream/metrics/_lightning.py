"""The stall where people watch training: a PyTorch Lightning callback.

:class:`StallLogger` times the training loop with an :class:`~._epochlog.EpochLog` from
Lightning's hooks (a batch arrives at ``on_train_batch_start``, its step ends at
``on_train_batch_end``; validation is not counted) and, at each epoch's end, logs the
throughput and the stall share to every logger the trainer has, at the trainer's global
step, as Lightning's ``LearningRateMonitor`` does. Lightning's loggers write on rank 0
only: under DDP the figures are rank 0's, whose loop waits as long as the slowest rank's.

Lightning is imported by this module only, which ``asyncstream`` loads when
:class:`StallLogger` is first asked for: asyncstream imports without it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._epochlog import EpochFigures, EpochLog, StatsSource

try:
    from lightning.pytorch import LightningModule, Trainer
    from lightning.pytorch.callbacks import Callback
except ImportError as exc:  # pragma: no cover - lightning is in the test extra
    raise ImportError(
        "asyncstream.StallLogger needs PyTorch Lightning: pip install lightning"
    ) from exc

__all__ = ["StallLogger"]


class StallLogger(Callback):
    """Logs the loader's throughput and the training loop's stall share every epoch.

    The scalars (see :meth:`EpochFigures.scalars`), under ``prefix``:
    ``{unit}_per_s``, the epoch's samples over the loop's time; ``stall_share``, the
    share of that time spent waiting for the next batch (0: the data path keeps up; 0.3:
    the loop would run 1.4x faster with a faster one); ``{unit}`` and ``batches``, what
    the epoch took; ``waited_s``; ``epoch``; and ``loader_stall_share`` where the loader
    keeps its own stall meter. The figures of every epoch are kept in :attr:`epochs`.

    Args:
        source: where a loader stall meter is read (an object with ``stats()``); by
            default the trainer's train dataloader, or its dataset, if either has one.
        unit: what a sample is called in the names (``"images"`` for
            ``images_per_s``).
        prefix: put before each name.
        count: the samples in a batch (default: :func:`~._epochlog.batch_size`).
    """

    def __init__(
        self,
        source: StatsSource | None = None,
        *,
        unit: str = "samples",
        prefix: str = "asyncstream/",
        count: Callable[[Any], int] | None = None,
    ) -> None:
        super().__init__()
        self._given = source
        self._log = EpochLog(source, unit=unit, prefix=prefix, count=count)

    def __repr__(self) -> str:
        return f"StallLogger(unit={self._log.unit!r}, prefix={self._log.prefix!r})"

    @property
    def epochs(self) -> list[EpochFigures]:
        """The figures of every epoch logged so far, in order."""
        return self._log.epochs

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """The epoch's loop starts waiting for its first batch."""
        if self._given is None:
            self._log.source = _source_of(trainer.train_dataloader)
        self._log.start_epoch(trainer.current_epoch)

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """The batch arrived: the wait ends."""
        self._log.batch_start()

    def on_train_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """The step is done: the loop waits for the next batch."""
        self._log.batch_end(self._log.count(batch))

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Validation inside the epoch is not the loader's wait."""
        self._log.pause()

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Back to training: the loop waits for its next batch."""
        self._log.resume()

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Log the epoch's figures to each of the trainer's loggers."""
        figures = self._log.end_epoch(trainer.current_epoch)
        scalars = figures.scalars(self._log.prefix, self._log.unit)
        for logger in trainer.loggers:
            logger.log_metrics(scalars, step=trainer.global_step)


def _source_of(loader: Any) -> StatsSource | None:
    """The loader, or its dataset, where it has ``stats()``."""
    for candidate in (loader, getattr(loader, "dataset", None)):
        if callable(getattr(candidate, "stats", None)):
            return candidate
    return None
