"""Producers of batches, ahead of DALI: a thread of the training process, or DataLoader workers.

DALI asks for a batch from the thread that drives the pipeline (the training loop's), inside
``schedule_run``. If that thread also read the stream and built the batch, reading and
decoding would take turns: while it built batch ``i + 2`` nothing new was decoded once DALI
finished batch ``i + 1``, and while it waited for batch ``i`` nothing was built. So batches
are built by a *producer* and queued, at most ``depth`` ahead; DALI's source only takes the
oldest (:meth:`Feed.get`). Two producers:

* :class:`ThreadFeed`: a thread of the training process iterates the stream. Reading and
  decoding overlap (DALI's threads run without the GIL), but the stream's Python work
  (tar headers, shuffle, copies) shares the training process's one interpreter.
* :class:`WorkerFeed`: ``StatefulDataLoader`` workers, each reading its share of the stream
  (the split is the stream's own, as for any DataLoader) and building whole batches
  (:mod:`._workers`); one thread of the training process takes them in the DataLoader's
  order. The training process then spends about a microsecond per image on the feed, and
  the rate a node can feed grows with its cores. Exact resume is the DataLoader's: its
  ``state_dict()`` before each batch.

Why DataLoader workers rather than DALI's parallel external source or its PyTorch proxy:
both call a Python source per sample or per batch *index*, with no state of their own to
resume from, while a stream is a stateful iterator whose exact position must be saved; the
DataLoader already collects each worker's stream state with every batch
(``snapshot_every_n_steps=1``), and its workers are where users already put data reading.

Each batch carries the position to resume from before it (``EncodedBatch.state``), so the
loader can say where it stands while batches wait here and in DALI. A producer is stopped
between batches (a batch being built is finished first, so stopping waits at most for one
batch's samples).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from nvidia.dali.tensors import TensorCPU

from ._batch import BatchBuilder, EncodedBatch, read_batches

if TYPE_CHECKING:
    from torchdata.stateful_dataloader import StatefulDataLoader

    from asyncstream import ShardStream

__all__ = ["Feed", "ThreadFeed", "WorkerFeed"]


class Feed:
    """Batches built by a producer thread, oldest first, at most ``depth`` waiting.

    Args:
        depth: batches built ahead at most.
        name: the producer thread's name.
    """

    def __init__(self, depth: int, name: str) -> None:
        self._depth = depth
        self._name = name
        self._cond = threading.Condition()
        self._ready: deque[EncodedBatch] = deque()
        self._done = False
        self._stopping = False
        self._next_state: Any = None  # position before the batch being built
        self._thread: threading.Thread | None = None
        self.wait_seconds = 0.0  # the consumer's time waiting for a batch
        self.busy_seconds = 0.0  # the producer's time building batches
        self.batches = 0

    def start(self) -> None:
        """Start the producer thread."""
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def _produce(self) -> Generator[EncodedBatch, None, None]:
        raise NotImplementedError

    def _run(self) -> None:
        produced = self._produce()
        try:
            while True:
                started = time.perf_counter()
                try:
                    batch = next(produced)
                except StopIteration:
                    break
                if batch.arrays:
                    batch.inputs = [TensorCPU(a, "") for a in batch.arrays]  # zero-copy views
                self.busy_seconds += time.perf_counter() - started
                with self._cond:
                    while len(self._ready) >= self._depth and not self._stopping:
                        self._cond.wait()
                    if self._stopping:
                        break
                    self._ready.append(batch)
                    self.batches += 1
                    self._cond.notify_all()
                if batch.error is not None:
                    break
        except BaseException as exc:  # a bug of ours or the DataLoader's: the consumer raises it
            with self._cond:
                self._ready.append(EncodedBatch(state=self._next_state, error=exc))
        finally:
            produced.close()
            with self._cond:
                self._done = True
                self._cond.notify_all()

    def get(self) -> EncodedBatch | None:
        """The oldest batch, waiting for the producer; ``None`` once it has ended."""
        with self._cond:
            if not self._ready and not self._done:
                started = time.perf_counter()
                while not self._ready and not self._done:
                    self._cond.wait()
                self.wait_seconds += time.perf_counter() - started
            if not self._ready:
                return None
            batch = self._ready.popleft()
            self._cond.notify_all()
            return batch

    def next_state(self) -> Any:
        """The position before the first batch not yet taken by :meth:`get`."""
        with self._cond:
            return self._ready[0].state if self._ready else self._next_state

    @property
    def alive(self) -> bool:
        """Whether the producer thread still runs."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        """Stop the producer after the batch it is building, and wait for it."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        self._ready.clear()


class ThreadFeed(Feed):
    """Builds batches from a stream in a thread of the training process.

    The stream is iterated in the producer thread only (a stream serves one thread): its
    ``state_dict()`` before each batch is the batch's ``state``, and its ``stats()`` come
    in batches now and then (the loader must not call the stream while the producer reads
    it).
    """

    def __init__(
        self, stream: ShardStream, builder: BatchBuilder, *, depth: int, drop_last: bool
    ) -> None:
        super().__init__(depth, "dali_ops-feed")
        self.stream = stream
        self.builder = builder
        self.drop_last = drop_last

    def _produce(self) -> Generator[EncodedBatch, None, None]:
        return read_batches(self.stream, self.builder, drop_last=self.drop_last, track=self._track)

    def _track(self, state: Any) -> None:
        self._next_state = state


class WorkerFeed(Feed):
    """Takes the batches DataLoader workers built, in the DataLoader's order.

    Args:
        loader: a ``StatefulDataLoader`` over :class:`~._workers.EncodedBatches`, with
            ``batch_size=None``.
        depth: batches taken ahead at most (the workers build more: ``prefetch_factor``).
    """

    def __init__(self, loader: StatefulDataLoader, *, depth: int) -> None:
        super().__init__(depth, "dali_ops-workers")
        self.loader = loader
        # Here, in the caller's thread: the first pass forks the workers before the loader
        # builds its pipeline (no DALI or CUDA thread is running yet at that fork).
        self._next_state = loader.state_dict()
        self._batches = iter(loader)

    def _produce(self) -> Generator[EncodedBatch, None, None]:
        loader, batches = self.loader, self._batches
        while True:
            self._next_state = state = loader.state_dict()
            try:
                wire = next(batches)
            except StopIteration:
                self._next_state = loader.state_dict()
                return
            yield EncodedBatch.from_wire(wire, state)
