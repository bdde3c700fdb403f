"""Batches of encoded images: what a producer builds from samples and DALI is fed.

An :class:`EncodedBatch` holds, for up to ``batch_size`` samples, the encoded image of each
as a 1-D ``uint8`` array, its label, its key and shard, and the position to resume from to
read the batch again (``state``). A :class:`BatchBuilder` makes batches from an iterator of
samples; it runs wherever the samples are read: a feed thread of the training process, or
a DataLoader worker process (:mod:`._workers`), which hands the batch over as one buffer in
shared memory (:meth:`EncodedBatch.to_wire` / :meth:`EncodedBatch.from_wire`).

Checks made here, before DALI sees an image (see :mod:`._feed` for what DALI itself
rejects): the sample has an image member and an integer label, and the image passes
:func:`~._feed.check_image` at the chosen ``precheck`` level. A failing sample is skipped
and recorded (``on_error="skip"``: the batch is filled from the next samples) or ends the
batch with its error (``"raise"``). An error of the stream itself (a fetch that failed, a
corrupt tar) always ends the batch with that error. A batch with an error is never fed to
DALI: the loader raises the error when that batch's turn comes, after every earlier batch.

Native. The records path's common sample (an image found, a label of digits, an image that
passes the check) is added by a C sink, ``_batchc.Sink``, that ``Iteration.take`` calls
directly, through the C sink protocol of ``asyncstream/shards/_records.h`` where the
chunk's records are the native walk's table: no Python call and no record tuple per
sample; any other sample goes to :meth:`BatchBuilder.
_add_record`, the Python sink, which stays the reference for all of them.
``ASYNCSTREAM_NATIVE=0`` in the environment (read once, at import) or :data:`NATIVE` set
to ``False`` selects the Python sink for every sample; the tests build every batch both
ways.
"""

from __future__ import annotations

import functools
import importlib
import os
import time
import traceback
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from asyncstream import DataError, DecodeError

from ._checks import Precheck, check_image, describe_sample, source_of
from ._shm import BatchBuffer, BufferPool, BufferViews

if TYPE_CHECKING:
    from types import ModuleType

    from asyncstream import ShardStream

__all__ = ["NATIVE", "BatchBuilder", "EncodedBatch", "Skipped", "read_batches"]


def _native() -> ModuleType | None:
    """The extension, or None where it was not built (a source tree never installed: the
    Python sink then takes every sample, as exactly and more slowly)."""
    try:
        # By name: grimp finds no .py for an extension and reads `from . import _batchc` as
        # an import of the package `dali_ops`, which imports this module (a false cycle).
        return importlib.import_module("dali_ops._batchc")
    except ImportError:
        return None


_NATIVE = _native()
# Whether BatchBuilder.build hands records to the native sink; tests set it to compare.
NATIVE = _NATIVE is not None and os.environ.get("ASYNCSTREAM_NATIVE", "1") != "0"

_LEVELS = {"none": 0, "markers": 1, "header": 2}  # the native sink's precheck levels
_HEADER_CHECK = functools.partial(check_image, level="header")

STATS_INTERVAL = 1.0  # seconds between snapshots of the stream's statistics

_META_KEY = "json"  # the member in which pack records a sample's source file

Spans = list[int] | npt.NDArray[np.int64]
"""Where each image of a batch lies in its buffer, ``(start, stop)``: a flat list
``[start, stop, start, stop, ...]`` while the batch is built (no tuple per image, which the
cyclic garbage collector would track), an ``(n, 2)`` ``int64`` array once it is handed
over."""

Skipped = tuple[str, str, str, "str | None"]
"""A skipped image: ``(shard URL, key, reason, source file or None)``."""


class RemoteTraceback(Exception):
    """The traceback of an error raised in a DataLoader worker, chained as its cause."""


@dataclass
class EncodedBatch:
    """One batch for DALI, or, with ``error`` set, the batch that failed before it.

    A batch's images lie in one buffer, one after the other (``data`` and ``spans``): the
    producer copies each out of the stream's ring straight into it (no object per image
    while it builds), and ``_feeds.prepare`` makes DALI's input of it.

    Attributes:
        state: where to resume to read this batch again (set by the producer): a
            stream state dict, a DataLoader's, or a :class:`~asyncstream.StateSnapshot`
            to make one (:meth:`._feed.Feeder.head_state` makes it).
        keys: each sample's key.
        urls: each sample's shard URL.
        labels: each sample's label.
        metas: each sample's ``json`` member, if it has one (for messages).
        skipped: the images skipped while this batch was built.
        dropped: images dropped with a short last batch (``drop_last``).
        error: the error that ended the batch (it is then not fed).
        worker: the DataLoader worker that built it (``-1``: the training process).
        stats: the worker stream's statistics, sent now and then by workers.
        placed: while the batch is built, the buffer its images are written into as they
            come (:class:`~._shm.BatchBuffer`); handed over, it becomes ``data``.
        spans: where each image lies in the buffer (:data:`Spans`).
        data: the images' bytes, once the batch is handed over: a view of a buffer of the
            feed thread's pool, or of a worker's shared buffer.
        owner: what keeps ``data``'s buffer alive and, once dropped, gives it back to the
            pool it came from (:mod:`._shm`).
        inputs: DALI's input for the images, one ``TensorListCPU`` made by the producer
            (DALI's source then skips its own per-image checks and conversion; see
            ``_feeds.prepare``).
        held: what ``inputs`` views besides ``data`` (the images padded to one length),
            kept as long as the batch.
    """

    state: Any = None
    keys: list[str] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    metas: list[bytes | None] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    error: BaseException | None = None
    dropped: int = 0
    worker: int = -1
    stats: dict[str, Any] | None = None
    placed: BatchBuffer | None = None
    spans: Spans = field(default_factory=list)
    data: npt.NDArray[np.uint8] | None = None
    owner: Any = None
    inputs: Any = None
    held: Any = None

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def images(self) -> list[npt.NDArray[np.uint8]]:
        """Each image's bytes, a view of ``data`` (for messages and checks, not the hot
        path)."""
        if self.data is None:
            return []
        data = self.data
        return [data[a:b] for a, b in np.asarray(self.spans, dtype=np.int64).reshape(-1, 2)]

    def keep(self) -> None:
        """Take the buffer the batch was built into, in the process that built it (the
        feed thread's): ``placed`` becomes ``data``, ``spans`` an array."""
        self.spans = _span_array(self.spans)
        if self.placed is not None:
            if len(self.spans):
                self.data, self.owner = self.placed.keep()
            else:
                self.placed.free()
            self.placed = None

    def source_batch(self) -> tuple[Any, npt.NDArray[np.int64]]:
        """What DALI's external source is given: the images and their labels."""
        labels = np.asarray(self.labels, dtype=np.int64)
        if self.inputs is not None:
            return self.inputs, labels
        # without the producer's inputs (a batch refed after remove()): a view per image,
        # which DALI's source converts one by one
        return self.images, labels

    def describe(self, index: int) -> str:
        """Shard, key and source file of the sample at ``index``, for a message."""
        return describe_sample(self.urls[index], self.keys[index], self.metas[index])

    def remove(self, indices: set[int]) -> None:
        """Drop the samples at ``indices``."""
        keep = [i for i in range(len(self.keys)) if i not in indices]
        self.keys = [self.keys[i] for i in keep]
        self.urls = [self.urls[i] for i in keep]
        self.labels = [self.labels[i] for i in keep]
        self.metas = [self.metas[i] for i in keep]
        self.spans = _span_array(self.spans)[np.asarray(keep, dtype=np.intp)]
        self.inputs = self.held = None

    # -- across a process boundary -------------------------------------------------------

    def to_wire(self) -> dict[str, Any]:
        """A picklable form: the images stay in the shared buffer they were written into
        (``placed``), which is named rather than sent (see :mod:`._shm`)."""
        buffer = None
        if self.placed is not None:
            buffer = self.placed.wire() if len(self.spans) else None
            self.placed.free()  # given back unsent (nothing to send); nothing once sent
            self.placed = None
        elif len(self.spans):
            raise ValueError("only a batch built into a shared buffer (placed) can be sent")
        error = self.error
        trace = None
        if error is not None:
            trace = "".join(traceback.format_exception(error))
            error = error.with_traceback(None)
        return {
            "buffer": buffer,
            "spans": _span_array(self.spans),
            "keys": self.keys,
            "urls": self.urls,
            "labels": self.labels,
            "metas": self.metas,
            "skipped": self.skipped,
            "error": error,
            "trace": trace,
            "dropped": self.dropped,
            "worker": self.worker,
            "stats": self.stats,
        }

    @classmethod
    def from_wire(cls, wire: dict[str, Any], state: Any, views: BufferViews) -> EncodedBatch:
        """The batch a worker sent: a view of its buffer, mapped by ``views``; the batch
        holds the buffer, which the worker reuses once the batch is dropped.

        Raises:
            ValueError: the spans do not fit the buffer or the samples.
        """
        data, lease = None, None
        spans = _span_array(wire["spans"])
        if wire["buffer"] is not None:
            data, lease = views.open(wire["buffer"], wire["worker"])
        bound = 0 if data is None else len(data)
        fits = not len(spans) or (
            spans.min() >= 0 and spans.max() <= bound and bool((spans[:, 0] <= spans[:, 1]).all())
        )
        if len(spans) != len(wire["keys"]) or not fits:
            raise ValueError(
                f"DataLoader worker {wire['worker']} sent {len(spans)} image spans for "
                f"{len(wire['keys'])} samples and a buffer of {bound} bytes"
            )
        error = wire["error"]
        if error is not None and wire["trace"]:
            error.__cause__ = RemoteTraceback(f"in a DataLoader worker:\n{wire['trace']}")
        return cls(
            state=state,
            keys=wire["keys"],
            urls=wire["urls"],
            labels=wire["labels"],
            metas=wire["metas"],
            skipped=wire["skipped"],
            error=error,
            dropped=wire["dropped"],
            worker=wire["worker"],
            stats=wire["stats"],
            spans=spans,
            data=data,
            owner=lease,
        )


def _span_array(spans: Spans) -> npt.NDArray[np.int64]:
    """``spans`` as an ``(n, 2)`` ``int64`` array (no copy where it is one)."""
    return np.asarray(spans, dtype=np.int64).reshape(-1, 2)


class BatchBuilder:
    """Builds :class:`EncodedBatch` es from samples: checks, labels, skips.

    Args:
        batch_size: samples per batch.
        on_error: ``"skip"`` or ``"raise"`` for an image that fails the checks.
        precheck: how hard :func:`~._feed.check_image` looks at each image.
        image_keys: the members that may hold the image, tried in order.
        label_key: the member holding the class index as ASCII digits.
    """

    def __init__(
        self,
        batch_size: int,
        *,
        on_error: Literal["raise", "skip"],
        precheck: Precheck,
        image_keys: tuple[str, ...],
        label_key: str,
    ) -> None:
        self.batch_size = batch_size
        self.on_error = on_error
        self.precheck: Precheck = precheck
        self.image_keys = image_keys
        self.label_key = label_key
        self._image_rank = {k: i for i, k in enumerate(image_keys)}
        self._pool: BufferPool | None = None  # made at the first pass with no pool given

    def pool(self) -> BufferPool:
        """The buffers of batches built in this process with no pool given (the feed
        thread's), kept across passes so that a pass reuses the buffers of the last."""
        if self._pool is None:
            self._pool = BufferPool(shared=False)
        return self._pool

    def __getstate__(self) -> dict[str, Any]:  # sent to DataLoader workers: no buffers
        return {**self.__dict__, "_pool": None}

    def build(self, samples: Iterator[dict[str, Any]], batch: EncodedBatch) -> bool:
        """Fill ``batch`` from ``samples``; returns whether the samples are exhausted.

        ``samples`` may be a stream's :meth:`~asyncstream.ShardStream.iter_views`: the
        samples then come in bulk as records (:meth:`_add_record`), with no dict per
        sample; any other iterator of sample dicts is read one sample at a time.

        Never raises: an error (the stream's, or a sample's with ``on_error="raise"``) is
        stored in ``batch.error`` and ends the batch; the caller should then stop.
        """
        take = getattr(samples, "take", None)
        try:
            if take is not None:
                sink = self._sink(batch)
                while len(batch.keys) < self.batch_size and batch.error is None:
                    if not take(self.batch_size - len(batch.keys), sink):
                        return True
                return batch.error is not None
            while len(batch.keys) < self.batch_size:
                sample = next(samples, None)
                if sample is None:
                    return True
                self._add(batch, sample)
        except Exception as exc:  # stream errors too: raised in order, never into DALI
            batch.error = exc
            return True
        return False

    def _sink(self, batch: EncodedBatch) -> Callable[[memoryview, str, Any], bool]:
        """What ``take`` hands each record to for ``batch``: the native sink, which hands
        any sample but the common one to :meth:`_add_record`, or that alone."""
        fallback = functools.partial(self._add_record, batch)
        if not NATIVE or _NATIVE is None:
            return fallback
        placed = batch.placed
        assert placed is not None  # read_batches gives every batch a buffer
        sink: Callable[[memoryview, str, Any], bool] = _NATIVE.Sink(
            batch.keys,
            batch.urls,
            batch.labels,
            batch.metas,
            batch.spans,
            placed,
            self.image_keys,
            self.label_key,
            _META_KEY,
            _LEVELS[self.precheck],
            _HEADER_CHECK,
            fallback,
        )
        return sink

    def _add(self, batch: EncodedBatch, sample: dict[str, Any]) -> None:
        """Members are ``bytes``, or views valid until the next sample: what is kept is
        copied here."""
        meta = sample.get(_META_KEY)
        image = None
        for image_key in self.image_keys:
            image = sample.get(image_key)
            if image is not None:
                break
        error = self._accept(
            batch,
            sample["__url__"],
            sample["__key__"],
            meta,
            sample.get(self.label_key),
            image,
            lambda: [k for k in sample if not k.startswith("__")],
        )
        if error is not None:
            raise error

    def _add_record(self, batch: EncodedBatch, view: memoryview, url: str, record: Any) -> bool:
        """:meth:`_add` for a sample handed over as a record of offsets in ``view`` (see
        ``Iteration.take``): no dict, and only the members used are touched. A label of
        digits and an image that passes :func:`~._checks.check_image` take the short way;
        anything else goes through :meth:`_accept`. Returns whether to go on (an error is
        stored in ``batch.error``)."""
        rank, image, label, meta = len(self.image_keys), None, None, None
        ranks, label_key = self._image_rank, self.label_key
        for ext, start, stop, owned in record[2:]:
            if ext == label_key:
                label = view[start:stop] if owned is None else owned
            elif ext == _META_KEY:
                meta = view[start:stop].tobytes() if owned is None else owned
            at = ranks.get(ext, rank)
            if at < rank:
                rank, image = at, view[start:stop] if owned is None else owned
        if image is not None and label is not None:
            digits = label.tobytes() if isinstance(label, memoryview) else label
            # the common sample: a label of digits and an image that passes the checks
            if digits.isdigit() and len(digits) < 19 and check_image(image, self.precheck) is None:
                _append(batch, record[0], url, image, int(digits), meta)
                return True
        error = self._accept(
            batch, url, record[0], meta, label, image, lambda: [f[0] for f in record[2:]]
        )
        if error is not None:
            batch.error = error
            return False
        return True

    def _accept(
        self,
        batch: EncodedBatch,
        url: str,
        key: str,
        meta: object,
        raw_label: object,
        data: object,
        members: Callable[[], list[str]],
    ) -> Exception | None:
        """Check a sample's label and image and add it to ``batch`` (or record it skipped);
        returns the error to raise (``on_error="raise"``), if any. Views are copied."""
        meta = bytes(meta) if isinstance(meta, memoryview) else meta
        meta = meta if isinstance(meta, bytes) else None
        try:
            if raw_label is None:
                raise KeyError(self.label_key)
            if isinstance(raw_label, memoryview):
                raw_label = bytes(raw_label)
            if not isinstance(raw_label, (bytes, str, int)):
                raise TypeError(f"a {type(raw_label).__name__}, not bytes")
            label = int(raw_label)
        except (KeyError, ValueError, TypeError) as exc:
            return DataError(
                f"{describe_sample(url, key, meta)}: no integer label in {self.label_key!r} ({exc})"
            )
        if not isinstance(data, (bytes, memoryview)):
            found = ", ".join(repr(k) for k in sorted(members()))
            wanted = ", ".join(repr(k) for k in self.image_keys)
            problem: str | None = (
                f"no image member: it has {found or 'no member'}, the loader looks for "
                f"{wanted} (DALIImageLoader's image_keys)"
            )
        else:
            problem = check_image(data, self.precheck)
        if problem is not None:
            if self.on_error == "raise":
                return DecodeError(f"{describe_sample(url, key, meta)}: {problem}")
            batch.skipped.append((url, key, problem, source_of(meta)))
            return None
        assert isinstance(data, (bytes, memoryview))
        _append(batch, key, url, data, label, meta)
        return None


def _append(
    batch: EncodedBatch,
    key: str,
    url: str,
    data: bytes | memoryview,
    label: int,
    meta: bytes | None,
) -> None:
    """Add a checked sample to ``batch``, its image copied once, into the batch's buffer
    (``placed``)."""
    if batch.placed is None:
        raise ValueError("a batch is built into a buffer (EncodedBatch.placed)")
    assert isinstance(batch.spans, list)
    batch.keys.append(key)
    batch.urls.append(url)
    batch.spans.extend(batch.placed.put(data))
    batch.labels.append(label)
    batch.metas.append(meta)


def read_batches(
    stream: ShardStream,
    builder: BatchBuilder,
    *,
    drop_last: bool,
    worker: int = -1,
    track: Callable[[Any], None] | None = None,
    pool: BufferPool | None = None,
) -> Generator[EncodedBatch, None, None]:
    """The batches of one pass over the stream's current epoch, built in this thread.

    A batch that holds no image but records skipped or dropped images, or the stream's
    statistics (snapshot every :data:`STATS_INTERVAL` seconds and at the end), is yielded
    too, for its records. A batch with an error is the last.

    Args:
        stream: the samples (iterated here: a stream serves one thread).
        builder: makes the batches.
        drop_last: drop the pass's last batch when it is short (counted in ``dropped``).
        worker: recorded in each batch.
        track: given ``stream.state_snapshot()`` before each batch and after the last,
            which is then each batch's ``state`` (a :class:`~asyncstream.StateSnapshot`:
            its ``to_dict()`` is the stream's ``state_dict()`` then, made only for the
            batch whose state is asked for); ``None``: not taken (DataLoader workers,
            whose DataLoader saves the stream's state itself).
        pool: where each batch's images are copied as they come, from the stream's views
            (``iter_views``: one copy in all): a DataLoader worker's shared buffers (the
            batch is handed over by :meth:`EncodedBatch.to_wire`, and a batch not handed
            over gives its buffer back), or a pool of this process's own
            (``None``: :meth:`BatchBuilder.pool`), whose buffer each batch takes with it
            (:meth:`EncodedBatch.keep`) before it is yielded.
    """
    if pool is None:
        pool = builder.pool()
    state = stream.state_snapshot() if track is not None else None
    if track is not None:
        track(state)
    samples = stream.iter_views()  # members copied as the batch takes them (build)
    last_stats = time.monotonic()
    batch = None
    try:
        while True:
            batch = EncodedBatch(state=state, worker=worker, placed=BatchBuffer(pool))
            ended = builder.build(samples, batch)
            if ended and batch.error is None and drop_last and len(batch) < builder.batch_size:
                batch.dropped = len(batch)
                batch.remove(set(range(len(batch))))
            if track is not None and batch.error is None:
                state = stream.state_snapshot()
                track(state)
            now = time.monotonic()
            if (ended and batch.error is None) or now - last_stats > STATS_INTERVAL:
                last_stats = now
                batch.stats = stream.stats()
            if not pool.shared:
                batch.keep()
            if batch.keys or batch.skipped or batch.dropped or batch.stats or batch.error:
                yield batch
            if batch.placed is not None:  # not handed over (to_wire takes it): give it back
                batch.placed.free()
            if ended:
                return
    finally:
        if batch is not None and batch.placed is not None:
            batch.placed.free()
