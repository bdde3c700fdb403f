"""Driving the loader's one DALI pipeline: passes, recovery, handing batches out.

One pipeline serves a loader for its whole life: it is built at the first pass (its
random operators seeded with :func:`~._pipeline.pipeline_seed` of where that pass starts)
and kept across epochs and resumes, as DALI's own training loops keep theirs: between
passes it is only ``reset()``, so the decoder's buffers, the CUDA context and the thread
pool are set up once. A pass that ends early (a new epoch, a loaded state, ``close``) is
drained first: the iterations already scheduled are run to their end and dropped, since
a ``reset()`` alone would hand them to the next pass. The pipeline is rebuilt only after
DALI fails on an image (:meth:`PipelineDriver._recover`), seeded anew.

The pipeline is driven with ``schedule_run`` / ``outputs``: the first ``schedule_run`` of a
pass makes DALI pull ``prefetch_queue_depth`` batches from the :class:`~._feed.Feeder`, and
each later one, issued right after a batch's outputs are taken, pulls one more, so DALI
stays that many batches ahead of the training loop. The feeder only takes batches a
producer built ahead (:mod:`._feeds`), so this thread spends little time feeding.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Literal

import torch

from ._batch import EncodedBatch
from ._device import to_torch
from ._feed import Counters, Feeder
from ._pipeline import PipelineSettings, build_pipeline, pipeline_seed, release_pipeline

__all__ = ["PipelineDriver"]


class PipelineDriver:
    """The loader's pipeline, across passes.

    Args:
        feeder: the pipeline's source.
        settings: the pipeline settings.
        batch_size: the largest batch.
        device: ``"cpu"`` or ``"mixed"``.
        device_id: the GPU for ``"mixed"``.
        counters: updated as batches are handed out and pipelines built.
    """

    def __init__(
        self,
        feeder: Feeder,
        settings: PipelineSettings,
        *,
        batch_size: int,
        device: Literal["cpu", "mixed"],
        device_id: int | None,
        counters: Counters,
    ) -> None:
        self.feeder = feeder
        self.settings = settings
        self.batch_size = batch_size
        self.device: Literal["cpu", "mixed"] = device
        self.device_id = device_id
        self.counters = counters
        self.epoch = 0
        self.batches = 0  # batches of this epoch handed out, resumed ones included
        self.attempt = 0  # rebuilds so far
        # DALI reads fed arrays in place: keep handed-out batches referenced a while more.
        self.retired: deque[EncodedBatch] = deque(maxlen=settings.prefetch_queue_depth + 2)
        self.last: EncodedBatch | None = None
        self.pipe: Any = None
        self.scheduled = False  # this pass's first schedule_run is done
        self.ended = False  # DALI said StopIteration: reset before the next pass
        self.broken: Exception | None = None

    def begin(self, epoch: int, batches: int) -> None:
        """Start a pass (the feeder already started) at batch ``batches`` of ``epoch``."""
        self.epoch, self.batches = epoch, batches
        if self.pipe is not None and self.scheduled:
            self.drain()  # may release a pipeline that fails
            if self.pipe is not None:
                self.pipe.reset()
        if self.pipe is None:
            self._build()
        self.scheduled = False
        self.ended = False
        self.broken = None

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
        self.counters.builds += 1
        self.scheduled = False
        self.broken = None

    def next(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The next batch, or ``None`` at the end of the pass.

        Raises:
            DecodeError, DataError, FetchError...: the error of the batch that comes next;
                :meth:`Feeder.head_state` is then that batch's position.
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
        if self.ended:
            return None
        try:
            if not self.scheduled:
                self.scheduled = True
                self.pipe.schedule_run()
            started = time.perf_counter()
            outputs = self.pipe.outputs()
        except StopIteration:
            self.ended = True
            return None
        self.counters.decode_wait_seconds += time.perf_counter() - started
        return outputs

    def drain(self) -> None:
        """Run the iterations DALI still has scheduled to their end, and drop them.

        Their inputs stay referenced until DALI is done with them; after this, ``reset()``
        starts a clean pass. A pipeline that fails while draining is released (and built
        again at the next pass).
        """
        if self.pipe is None or not self.scheduled or self.ended:
            return
        while True:
            try:
                self.pipe.outputs()
            except StopIteration:
                break
            except Exception:  # a failed decode in an abandoned batch: start afresh
                release_pipeline(self.pipe)
                self.pipe = None
                break
            if self.feeder.in_flight:
                self.retired.append(self.feeder.in_flight.popleft())
        self.ended = True

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

    def _hand_out(self, outputs: Any, batch: EncodedBatch) -> tuple[torch.Tensor, torch.Tensor]:
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

    def close(self) -> None:
        """Release the pipeline."""
        self.drain()
        release_pipeline(self.pipe)
        self.pipe = None
        self.retired.clear()
