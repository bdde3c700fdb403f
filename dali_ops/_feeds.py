"""Producers of batches, ahead of DALI: a thread of the training process, or DataLoader workers.

DALI asks for a batch from the thread that drives the pipeline (the training loop's), inside
``schedule_run``. If that thread also read the stream and built the batch, reading and
decoding would take turns: while it built batch ``i + 2`` nothing new was decoded once DALI
finished batch ``i + 1``, and while it waited for batch ``i`` nothing was built. So batches
are built ahead by a *producer*, and DALI's source only takes the oldest
(:meth:`Feed.get`). Two producers:

* :class:`ThreadFeed` (``workers=0``): a thread of the training process iterates the
  stream and queues batches, at most ``depth`` ahead. Reading and decoding overlap (DALI's
  threads run without the GIL), but the stream's Python work (tar headers, shuffle,
  copies) shares the training process's one interpreter with the training loop: each
  time the loop needs the GIL while the producer holds it, it waits (up to
  ``sys.getswitchinterval()``, 5 ms). Measured on an H200, this caps the thread feed at
  about half of what DALI decodes: use workers for a GPU.
* :class:`WorkerFeed` (``workers=N``): ``StatefulDataLoader`` workers, each reading its
  share of the stream (the split is the stream's own, as for any DataLoader) and building
  whole batches (:mod:`._workers`), up to ``prefetch_factor`` each ahead. DALI's source
  takes them from the DataLoader in its thread, with no thread of ours in between: the
  work left in the training process (mapping the batch's shared memory, a view per image)
  is a few microseconds an image and never holds the GIL for long. The rate a node can
  feed grows with its cores. Exact resume is the DataLoader's: its ``state_dict()``
  before each batch.

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
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
from nvidia.dali.tensors import TensorCPU, TensorListCPU

from . import _batch
from ._batch import BatchBuilder, EncodedBatch, read_batches
from ._shm import BufferViews

if TYPE_CHECKING:
    from torchdata.stateful_dataloader import StatefulDataLoader

    from asyncstream import ShardStream

__all__ = ["Feed", "ThreadFeed", "WorkerFeed"]


class Feed:
    """A source of built batches for DALI's source, oldest first.

    Attributes:
        wait_seconds: DALI's source's time waiting for a batch (the feed was behind).
        busy_seconds: time spent preparing batches.
        cpu_seconds: the CPU time of a producer thread of the feed's own (0 where the
            batches are built elsewhere).
    """

    def __init__(self) -> None:
        self.wait_seconds = 0.0
        self.busy_seconds = 0.0
        self.cpu_seconds = 0.0

    def start(self) -> None:
        """Start producing."""

    def get(self) -> EncodedBatch | None:
        """The oldest batch, waiting for it; ``None`` once the pass has ended."""
        raise NotImplementedError

    def next_state(self) -> Any:
        """The position before the first batch not yet taken by :meth:`get`."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop producing (after the batch being built, if any)."""


PAD_LIMIT = 1.5
"""Images are padded to one length where that makes the batch at most this many times
larger (see :func:`prepare`)."""


def prepare(batch: EncodedBatch) -> EncodedBatch:
    """Give a batch its DALI input, one ``TensorListCPU``, made here by the producer so that
    DALI's source in the training thread takes the whole batch at once (given a list, it
    checks and converts each item in Python: about 5 us an image of the training thread's
    time, GIL held).

    Where the images are of about one size (padded to the longest, the batch is at most
    :data:`PAD_LIMIT` times larger), they are copied into one ``(n, longest)`` array, each
    image at the start of its row and zeros after it (``_batchc.pad``, the GIL released),
    which DALI wraps as one dense tensor list: no object per image, 0.2 us an image where a
    ``TensorCPU`` view per image cost 4 (1 kB images, ``bench/RESULTS.md``). Only where
    every image is a JPEG whose end marker lies in its last 64 bytes: the decoder stops
    there, so the zeros after it are never read (the outputs are the same, checked by
    ``tests/test_dali_feed.py``), while a truncated image, or another format, is decoded as
    it is and fails as it would (padded, libjpeg would read the zeros as more of a
    truncated scan and decode it). Otherwise (sizes far apart, as photographs are, where the
    copy and the decode dwarf a view's cost) each image is a zero-copy ``TensorCPU`` view
    of the batch's buffer. Cutting the images out inside the pipeline instead (one
    broadcast buffer and ``fn.slice``) was tried and dropped: the slice cost DALI's threads
    3 us an image, and those threads are what the loader waits for.
    """
    if not len(batch.keys) or batch.error is not None:
        return batch
    data = batch.data if batch.data is not None else np.empty(0, dtype=np.uint8)
    spans = np.ascontiguousarray(batch.spans, dtype=np.int64).reshape(-1, 2)
    lengths = spans[:, 1] - spans[:, 0]
    longest = int(lengths.max())
    native = _batch._NATIVE if _batch.NATIVE else None  # no pad in C: a view per image
    padded = None
    if native is not None and len(spans) * longest <= PAD_LIMIT * max(1, int(lengths.sum())):
        padded = np.empty((len(spans), max(1, longest)), dtype=np.uint8)
        if not native.pad(data, spans, padded):
            padded = None  # not every image a JPEG that ends: each decoded as it is
    if padded is not None:
        batch.held = padded
        batch.inputs = TensorListCPU(padded, "")
    else:
        views = [TensorCPU(data[a:b], "") for a, b in spans.tolist()]
        # DALI 2.4's type stubs lack the binding's ``contiguous`` argument.
        batch.inputs = TensorListCPU(views, contiguous=False)  # type: ignore[call-overload]
    return batch


class ThreadFeed(Feed):
    """Builds batches from a stream in a thread of the training process.

    The stream is iterated in the producer thread only (a stream serves one thread): its
    ``state_dict()`` before each batch is the batch's ``state``, and its ``stats()`` come
    in batches now and then (the loader must not call the stream while the producer reads
    it).

    Args:
        stream: the samples.
        builder: makes the batches.
        depth: batches built ahead at most.
        drop_last: drop the pass's last batch when it is short.
    """

    def __init__(
        self,
        stream: ShardStream,
        builder: BatchBuilder,
        *,
        depth: int,
        drop_last: bool,
    ) -> None:
        super().__init__()
        self.stream = stream
        self.builder = builder
        self.drop_last = drop_last
        self._depth = depth
        self._cond = threading.Condition()
        self._ready: deque[EncodedBatch] = deque()
        self._done = False
        self._stopping = False
        self._next_state: Any = None  # position before the batch being built
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="dali_ops-feed", daemon=True)
        self._thread.start()

    def _track(self, state: Any) -> None:
        self._next_state = state

    def _run(self) -> None:
        cpu = time.thread_time()  # this thread's own CPU: a clock read per batch
        produced = read_batches(
            self.stream, self.builder, drop_last=self.drop_last, track=self._track
        )
        try:
            while True:
                started = time.perf_counter()
                batch = next(produced, None)
                if batch is None:
                    break
                prepare(batch)
                self.busy_seconds += time.perf_counter() - started
                self.cpu_seconds = time.thread_time() - cpu
                with self._cond:
                    while len(self._ready) >= self._depth and not self._stopping:
                        self._cond.wait()
                    if self._stopping:
                        break
                    self._ready.append(batch)
                    self._cond.notify_all()
                if batch.error is not None:
                    break
        except BaseException as exc:  # a bug of ours: the consumer raises it in its turn
            with self._cond:
                self._ready.append(EncodedBatch(state=self._next_state, error=exc))
        finally:
            produced.close()
            self.cpu_seconds = time.thread_time() - cpu
            with self._cond:
                self._done = True
                self._cond.notify_all()

    def get(self) -> EncodedBatch | None:
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
        with self._cond:
            return self._ready[0].state if self._ready else self._next_state

    def stop(self) -> None:
        """Stop the producer after the batch it is building, and wait for it."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        self._ready.clear()


class WorkerFeed(Feed):
    """Takes the batches DataLoader workers built, in the DataLoader's order, when asked.

    Args:
        loader: a ``StatefulDataLoader`` over :class:`~._workers.EncodedBatches`, with
            ``batch_size=None``.
        views: the workers' buffers as mapped here, kept across passes (a buffer is
            mapped once: its name is gone after), made before the workers start.
    """

    def __init__(self, loader: StatefulDataLoader, views: BufferViews) -> None:
        super().__init__()
        self.loader = loader
        self.views = views  # the workers' batch buffers, mapped once for the loader's life
        # Here, in the caller's thread: the first pass forks the workers before the loader
        # builds its pipeline (no DALI or CUDA thread is running yet at that fork).
        self._next_state: Any = loader.state_dict()
        self._batches: Iterator[dict[str, Any]] | None = iter(loader)

    def get(self) -> EncodedBatch | None:
        if self._batches is None:
            return None
        state = self._next_state
        started = time.perf_counter()
        try:
            wire = next(self._batches)
        except StopIteration:
            self._batches = None
            self._next_state = self.loader.state_dict()
            return None
        except Exception as exc:  # a worker died, or the DataLoader failed: in its turn
            self._batches = None
            return EncodedBatch(state=state, error=exc)
        finally:
            self.wait_seconds += time.perf_counter() - started
        started = time.perf_counter()
        try:
            batch = prepare(EncodedBatch.from_wire(wire, state, self.views))
        except OSError as exc:  # its buffer is gone: the worker exited meanwhile
            self._batches = None
            return EncodedBatch(
                state=state,
                error=RuntimeError(
                    f"the batch of DataLoader worker {wire.get('worker')} cannot be read: "
                    f"its shared-memory buffer is gone ({exc}); did the worker exit?"
                ),
            )
        self._next_state = self.loader.state_dict()
        self.busy_seconds += time.perf_counter() - started
        return batch

    def next_state(self) -> Any:
        return self._next_state

    def stop(self) -> None:
        self._batches = None
