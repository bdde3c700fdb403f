"""One pass over the stream through a DALI pipeline: drive it, recover it, hand batches out.

The pipeline is driven with ``schedule_run`` / ``outputs``: the first ``schedule_run``
makes DALI pull ``prefetch_queue_depth`` batches from the :class:`~._feed.Feeder`, and
each later one, issued right after a batch's outputs are taken, pulls one more, so DALI
stays that many batches ahead of the training loop. The feeder runs in this thread,
inside ``schedule_run``.

When DALI fails, the pass releases the pipeline, lets the feeder triage the batches DALI
held (see :mod:`._feed`), and builds a fresh pipeline that is fed those batches again,
seeded anew (:func:`~._pipeline.pipeline_seed` with the rebuild count). A failure of
``schedule_run`` is kept and dealt with on the next call, after the batch already decoded
is handed out.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Literal

import torch

from ._device import to_torch
from ._feed import Counters, FedBatch, Feeder
from ._pipeline import PipelineSettings, build_pipeline, pipeline_seed, release_pipeline

__all__ = ["PipelinePass"]


class PipelinePass:
    """Batches of one pass, from the feeder's current stream iteration.

    Args:
        feeder: the source, already started on the stream's iterator.
        settings: the pipeline settings.
        batch_size: the largest batch.
        device: ``"cpu"`` or ``"mixed"``.
        device_id: the GPU for ``"mixed"``.
        epoch: the stream's epoch, for the seed.
        batches: batches of this epoch handed out before the pass starts (resume).
        counters: updated as batches are handed out and pipelines rebuilt.
    """

    def __init__(
        self,
        feeder: Feeder,
        settings: PipelineSettings,
        *,
        batch_size: int,
        device: Literal["cpu", "mixed"],
        device_id: int | None,
        epoch: int,
        batches: int,
        counters: Counters,
    ) -> None:
        self.feeder = feeder
        self.settings = settings
        self.batch_size = batch_size
        self.device: Literal["cpu", "mixed"] = device
        self.device_id = device_id
        self.epoch = epoch
        self.batches = batches
        self.counters = counters
        self.attempt = 0  # rebuilds so far
        # DALI reads fed arrays in place: keep handed-out batches referenced a while more.
        self.retired: deque[FedBatch] = deque(maxlen=settings.prefetch_queue_depth + 2)
        self.last: FedBatch | None = None
        self.pipe: Any = None
        self.scheduled = False
        self.broken: Exception | None = None
        self._build()

    def _build(self) -> None:
        seed = pipeline_seed(self.settings.seed, self.epoch, self.batches, self.attempt)
        self.pipe = build_pipeline(
            self.settings,
            self.feeder,
            batch_size=self.batch_size,
            device=self.device,
            device_id=self.device_id,
            seed=seed,
        )
        self.scheduled = False
        self.broken = None

    def next(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The next batch, or ``None`` at the end of the pass.

        Raises:
            DecodeError, DataError, FetchError...: the error of the batch that comes next;
                :meth:`head_state` is then that batch's position.
            RuntimeError: DALI failed and no image is to blame.
        """
        while True:
            self._raise_if_failed()
            try:
                outputs = self._outputs()
            except Exception as exc:  # DALI failed: RuntimeError
                self._recover(exc)
                continue
            if outputs is not None:
                break
            self._raise_if_failed()  # the epoch ended early on an error
            if self.feeder.head() is not None:
                raise RuntimeError("DALI ended the epoch with batches in flight")
            return None
        batch = self.feeder.in_flight.popleft()
        try:
            self.pipe.schedule_run()  # keep DALI prefetch_queue_depth batches ahead
        except Exception as exc:
            self.broken = exc
        return self._hand_out(outputs, batch)

    def _raise_if_failed(self) -> None:
        head = self.feeder.head()
        if head is not None and head.error is not None:
            raise head.error

    def _outputs(self) -> Any:
        if self.broken is not None:
            raise self.broken
        try:
            if not self.scheduled:
                self.scheduled = True
                self.pipe.schedule_run()
            started = time.perf_counter()
            outputs = self.pipe.outputs()
        except StopIteration:
            return None
        self.counters.decode_wait_seconds += time.perf_counter() - started
        return outputs

    def _recover(self, error: Exception) -> None:
        self.counters.rebuilds += 1
        self.attempt += 1
        release_pipeline(self.pipe)
        self.pipe = None
        started = time.perf_counter()
        blamed = self.feeder.triage(self.device, self.device_id)
        self.counters.probe_seconds += time.perf_counter() - started
        if not blamed:
            raise RuntimeError(
                f"the DALI pipeline failed, no single image to blame: {error}"
            ) from error
        self._build()

    def _hand_out(self, outputs: Any, batch: FedBatch) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = outputs
        if len(images) != len(batch.keys):
            self.feeder.in_flight.appendleft(batch)
            raise RuntimeError(f"DALI returned {len(images)} images for {len(batch.keys)}")
        self.retired.append(batch)
        self.last = batch
        self.batches += 1
        self.counters.batches += 1
        self.counters.images += len(batch.keys)
        device_id = self.device_id
        return to_torch(images.as_tensor(), device_id), to_torch(labels.as_tensor(), device_id)

    def head_state(self) -> dict[str, Any]:
        """The stream's state before the first batch not handed out."""
        head = self.feeder.head()
        return head.state if head is not None else self.feeder.stream.state_dict()

    def close(self) -> None:
        """Release the pipeline and forget the batches in flight."""
        release_pipeline(self.pipe)
        self.pipe = None
        self.feeder.start(iter(()))
