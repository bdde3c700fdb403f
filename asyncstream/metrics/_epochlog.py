"""Throughput and the stall share of a training loop, per epoch, for any logger.

The loop is timed where it runs: between the end of one step and the arrival of the
next batch it waits for data; between the arrival of a batch and the end of its step it
works. The stall share is ``waited / (waited + worked)`` over the epoch, throughput the
epoch's samples over the same time. Time outside the loop (validation, the hooks after
the last step) is not counted, so a slow evaluation does not read as a slow data path.

Measuring at the loop, not inside the loader, holds for any loader and any number of
DataLoader workers (whose streams live in other processes). Where the loader keeps its
own stall meter (:meth:`DALIImageLoader.stats`, or a :class:`~asyncstream.ShardStream`
read without workers), its epoch share is added as ``loader_stall_share``: the loader's
view of the same wait. Nothing here imports the stream: the source is any object with a
``stats()`` method (:class:`StatsSource`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

__all__ = ["EpochFigures", "EpochLog", "StatsSource", "batch_size"]

T = TypeVar("T")

Write = Callable[[str, float, int], object]
"""``write(name, value, step)``: TensorBoard's ``SummaryWriter.add_scalar`` is one."""


@runtime_checkable
class StatsSource(Protocol):
    """What the figures may be read from: a loader or stream with ``stats()`` (a
    :class:`~asyncstream.ShardStream`, a stage on one, a ``DALIImageLoader``), whose
    ``stats()["stall"]["epoch"]`` is a :class:`~asyncstream.StallMeter` epoch report."""

    def stats(self) -> Mapping[str, Any]: ...


@dataclass(frozen=True)
class EpochFigures:
    """One epoch of a training loop, as :class:`EpochLog` timed it.

    Attributes:
        epoch: the epoch's number.
        samples: the samples of the batches the loop took (see :func:`batch_size`).
        batches: the batches the loop took.
        waited_s: seconds the loop waited for its next batch.
        worked_s: seconds the loop spent on its batches (its steps).
        loader_stall_share: the source's own stall meter's share over its epoch, where
            the source has one that counted calls; else ``None``.
    """

    epoch: int
    samples: int
    batches: int
    waited_s: float
    worked_s: float
    loader_stall_share: float | None = None

    @property
    def seconds(self) -> float:
        """The loop's time over the epoch: waiting and working."""
        return self.waited_s + self.worked_s

    @property
    def samples_per_s(self) -> float:
        """The epoch's samples over :attr:`seconds` (0 for an epoch with no time)."""
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def stall_share(self) -> float:
        """The share of the loop's time spent waiting for data, in [0, 1]."""
        return self.waited_s / self.seconds if self.seconds > 0 else 0.0

    def scalars(self, prefix: str = "asyncstream/", unit: str = "samples") -> dict[str, float]:
        """The figures as named scalars for a logger.

        Args:
            prefix: put before each name (TensorBoard groups the names by it).
            unit: what a sample is called: ``"images"`` names the throughput
                ``images_per_s`` and the count ``images``.

        Returns:
            ``{prefix}{unit}_per_s``, ``{prefix}stall_share``, ``{prefix}{unit}``,
            ``{prefix}batches``, ``{prefix}waited_s``, ``{prefix}epoch`` and, where
            known, ``{prefix}loader_stall_share``.
        """
        out = {
            f"{prefix}{unit}_per_s": self.samples_per_s,
            f"{prefix}stall_share": self.stall_share,
            f"{prefix}{unit}": float(self.samples),
            f"{prefix}batches": float(self.batches),
            f"{prefix}waited_s": self.waited_s,
            f"{prefix}epoch": float(self.epoch),
        }
        if self.loader_stall_share is not None:
            out[f"{prefix}loader_stall_share"] = self.loader_stall_share
        return out


def batch_size(batch: Any) -> int:
    """The samples in ``batch``: the first dimension of a tensor or array, else of the
    first value of a dict or the first item of a list or tuple (a ``(images, labels)``
    pair, a collated dict), else its length; 1 for anything else."""
    shape = getattr(batch, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) else 1
    if isinstance(batch, Mapping):
        return batch_size(next(iter(batch.values()))) if batch else 0
    if isinstance(batch, Sequence) and not isinstance(batch, str | bytes):
        if batch and (hasattr(batch[0], "shape") or isinstance(batch[0], Mapping)):
            return batch_size(batch[0])
        return len(batch)
    return 1


def _loader_share(source: StatsSource | None) -> float | None:
    """The source's stall meter's epoch share, where it has one that counted calls."""
    if source is None:
        return None
    stall = source.stats().get("stall")
    epoch = stall.get("epoch") if isinstance(stall, Mapping) else None
    if not isinstance(epoch, Mapping) or not epoch.get("calls"):
        return None
    share = epoch.get("waited_share")
    return float(share) if isinstance(share, int | float) else None


class EpochLog:
    """Times a training loop, epoch by epoch, and hands each epoch's figures to a logger.

    Wrap the loader (:meth:`iterate`), or, in a loop of one's own, call
    :meth:`start_epoch`, then :meth:`batch_start` when a batch arrives and
    :meth:`batch_end` when its step is done, and :meth:`end_epoch`::

        log = EpochLog(write=writer.add_scalar)  # a TensorBoard SummaryWriter
        for epoch in range(epochs):
            for batch in log.iterate(loader):
                step(batch)
        log.epochs[-1].samples_per_s

    Each call costs a clock read; nothing is printed.

    Args:
        source: a loader or stream whose ``stats()`` holds a stall meter (adds
            ``loader_stall_share``); ``None`` for none.
        write: called as ``write(name, value, step)`` for each scalar at the end of an
            epoch (``step`` is the epoch's number, or what :meth:`end_epoch` is given);
            ``None`` to only keep the figures in :attr:`epochs`.
        unit: what a sample is called in the scalars' names (``"images"``).
        prefix: put before each scalar's name.
        count: the samples in a batch (default :func:`batch_size`).
    """

    def __init__(
        self,
        source: StatsSource | None = None,
        *,
        write: Write | None = None,
        unit: str = "samples",
        prefix: str = "asyncstream/",
        count: Callable[[Any], int] | None = None,
    ) -> None:
        if source is not None and not callable(getattr(source, "stats", None)):
            raise TypeError(f"source must have a stats() method, got {type(source).__name__}")
        if not unit or not isinstance(unit, str):
            raise ValueError(f"unit must be a non-empty string, got {unit!r}")
        self.source = source
        self.write = write
        self.unit, self.prefix = unit, prefix
        self.count = count or batch_size
        self.epochs: list[EpochFigures] = []  #: every epoch ended, in order
        self._epoch = 0
        self._waiting_since: float | None = None  # None: paused, or in a step
        self._working_since: float | None = None
        self._waited = self._worked = 0.0
        self._samples = self._batches = 0

    def __repr__(self) -> str:
        return f"EpochLog(unit={self.unit!r}, prefix={self.prefix!r}, epochs={len(self.epochs)})"

    def start_epoch(self, epoch: int | None = None) -> None:
        """An epoch begins: its loop waits for its first batch from now.

        Args:
            epoch: its number (default: one more than the last, from 0).
        """
        if epoch is None:
            epoch = self.epochs[-1].epoch + 1 if self.epochs else 0
        self._epoch = epoch
        self._waited = self._worked = 0.0
        self._samples = self._batches = 0
        self._working_since = None
        self._waiting_since = time.perf_counter()

    def batch_start(self) -> None:
        """The loop has its batch: the wait since the last step (or the epoch's start)
        ends, the step begins."""
        now = time.perf_counter()
        if self._waiting_since is not None:
            self._waited += now - self._waiting_since
        self._waiting_since, self._working_since = None, now

    def batch_end(self, samples: int) -> None:
        """The step of a batch of ``samples`` is done: the loop waits from now."""
        now = time.perf_counter()
        if self._working_since is not None:
            self._worked += now - self._working_since
        self._samples += samples
        self._batches += 1
        self._working_since, self._waiting_since = None, now

    def pause(self) -> None:
        """Count nothing until :meth:`resume` or the next batch (validation runs)."""
        self._waiting_since = None

    def resume(self) -> None:
        """The loop waits for its next batch from now (after :meth:`pause`)."""
        if self._working_since is None:
            self._waiting_since = time.perf_counter()

    def end_epoch(self, step: int | None = None) -> EpochFigures:
        """The epoch is over: its figures, kept in :attr:`epochs` and written.

        Args:
            step: the step to write the scalars at (default: the epoch's number).
        """
        figures = EpochFigures(
            self._epoch,
            self._samples,
            self._batches,
            self._waited,
            self._worked,
            _loader_share(self.source),
        )
        self.epochs.append(figures)
        self._waiting_since = self._working_since = None
        if self.write is not None:
            at = figures.epoch if step is None else step
            for name, value in figures.scalars(self.prefix, self.unit).items():
                self.write(name, value, at)
        return figures

    def iterate(self, loader: Iterable[T]) -> Iterator[T]:
        """``loader``'s batches, one epoch, timed: the epoch ends (:meth:`end_epoch`)
        when the loader is exhausted or the loop leaves early."""
        self.start_epoch()
        batches = iter(loader)
        try:
            for batch in batches:
                self.batch_start()
                yield batch
                self.batch_end(self.count(batch))
        finally:
            self.end_epoch()
