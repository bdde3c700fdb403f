"""DALIImageLoader: batches of decoded images from a ShardStream, for a PyTorch loop.

The path of a batch. A *producer* reads the stream and builds batches of encoded images
ahead of DALI (:mod:`._feeds`): a thread of the training process (``workers=0``), or
``StatefulDataLoader`` workers (``workers=N``), each reading its share of the stream and
handing whole batches over in shared memory. DALI's source takes the built batches
(:mod:`._feed`), so reading and decoding overlap, and one pipeline, built once, decodes
them for the loader's whole life (:mod:`._pass`).

Copies. Each image is copied once: the producer takes the stream's samples as records of
offsets in its shared-memory ring (``ShardStream.iter_views().take``) and copies only the
image, out of the ring into ``bytes`` in the training process, or straight into one of a
few shared-memory buffers a worker keeps and reuses, which the training process maps
once (:mod:`._shm`); DALI is fed views of those copies with ``no_copy=True``. Not zero:
the stream hands a ring slot back to its fetch engine as soon as the chunk's last sample
is drawn, so views into the ring would be overwritten while DALI still reads them. With
``no_copy`` DALI does not own what it reads, so every fed batch stays referenced while in
flight and for ``prefetch_queue_depth + 2`` batches after it is handed out. On the way
out, DALI's outputs become torch tensors through DLPack, without a copy and without
waiting for the GPU (torch's stream is made to wait for DALI's).

Exact resume. DALI works ``prefetch_queue_depth`` batches ahead and the producer more, so
the stream's position is past samples the user has not seen. Each batch records the
position before it (the stream's ``state_dict()``, or the DataLoader's with workers), and
:meth:`DALIImageLoader.state_dict` returns the one of the oldest batch not yet handed
out, so a restart continues with exactly the next batch's samples. The augmentation's
random state is not saved: the pipeline is seeded with ``seed`` when its first pass starts
at batch 0 of epoch 0, and with a hash of (seed, epoch, batch, rebuilds) otherwise.

Undecodable images are caught before DALI by a cheap pre-check where possible; when DALI
itself fails, the batches it held are probed image by image, dealt with per ``on_error``
and fed again to a fresh pipeline (see :mod:`._feed`). Errors are raised when the failing
batch would have been handed out, after every earlier batch.

Is the GPU waiting? A :class:`~asyncstream.StallMeter` times each ``next()`` against the
loop's work between calls; ``stats()["stall"]`` gives the shares, and a warning is logged
(logger ``dali_ops``) when the loop waits more than ``stall_warning`` of the time, naming
the stage that holds it back (:mod:`._stages`).

Multi-GPU: one process per GPU (torchrun); give each its rank's stream,
``ShardStream(urls, rank=rank, world_size=world_size)`` (the default reads
torch.distributed or RANK/WORLD_SIZE); ``device_id`` defaults to ``LOCAL_RANK``, else
``torch.cuda.current_device()``.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, replace
from typing import Any, Literal

import torch

from asyncstream import ShardStream, StallMeter, StateError

from ._batch import BatchBuilder, EncodedBatch, Skipped
from ._checks import IMAGE_KEYS, Precheck
from ._device import resolve_device, resolve_device_id
from ._feed import Counters, Feeder
from ._feeds import Feed, ThreadFeed, WorkerFeed
from ._pass import PipelineDriver
from ._pipeline import PipelineSettings
from ._shm import BufferViews
from ._stages import StallWatch
from ._workers import make_worker_loader

__all__ = ["DALIImageLoader"]

_STATE_VERSION = 2
_STATE_KIND = "asyncstream.DALIImageLoader"  # old states have no kind: accepted


class DALIImageLoader:
    """Decoded, augmented ``(images, labels)`` batches from a :class:`~asyncstream.ShardStream`.

    ``for images, labels in loader`` reads one pass over an epoch of the stream: images
    NCHW (float32 or float16) and labels int64 ``[B]``, both on the pipeline's device.
    Each pass reads the next epoch; :meth:`set_epoch` chooses one. Last batch: with
    ``drop_last=False``
    a final short batch comes with its true size; with ``True`` it is dropped (with
    workers, each worker's last batch is short or dropped: every worker ends its share of
    the epoch on its own). With ``on_error="skip"`` a batch in which DALI itself failed on
    an image also comes out one image short (pre-checked images are replaced by the next
    samples instead).

    The loader owns the stream: :meth:`close` closes both.

    Args:
        stream: the samples (``__key__``, ``__url__``, image and label members).
        batch_size: images per batch.
        image_size: output side; default ``settings.image_size`` (224).
        device: ``"mixed"`` (GPU decode; ``"gpu"`` is the same), ``"cpu"``, or ``"auto"``:
            mixed when CUDA is available to torch.
        train: training augmentation or eval resize + centre crop; default
            ``settings.train`` (``True``).
        drop_last: drop a final batch shorter than ``batch_size``.
        on_error: an undecodable image raises :class:`~asyncstream.DecodeError` naming
            shard, key and, where the sample records it (``asyncstream pack`` does), its
            source file (``"raise"``), or is dropped and counted (``"skip"``). A raised
            error comes after every earlier batch, the pass ends, and
            :meth:`state_dict` points at the failed batch (``iter`` again reads the next
            epoch, ``set_epoch`` restarts one; load that state to continue). A missing
            or non-integer label always raises :class:`~asyncstream.DataError`.
        precheck: ``"markers"`` (default: the format's signature and the JPEG end marker,
            under 1 us/image), ``"header"`` (adds Pillow's header parse, ~90 us/image) or
            ``"none"``. Whatever slips past is still caught: a batch DALI cannot decode is
            decoded image by image to find the culprit.
        settings: everything else about the pipeline (mean, std, dtype, threads, seed...).
        device_id: the GPU; default ``LOCAL_RANK``, else the current CUDA device.
        image_keys: the members that may hold a sample's encoded image, tried in order;
            default every extension ``asyncstream pack`` writes (``jpg``, ``png``,
            ``webp``, ``bmp``) and ``jpeg``, ``tif``, ``tiff``. DALI tells the format from
            the bytes. A sample with none of them is a
            :class:`~asyncstream.DecodeError` (or skipped) naming the members it has.
        label_key: the sample member holding the class index as ASCII digits.
        workers: ``0`` reads the stream in a thread of this process; ``N`` in ``N``
            ``StatefulDataLoader`` worker processes (persistent), each reading its share
            and building whole batches, so the feed grows with the node's cores. Each
            worker runs its own fetch engine and ring (``stream.ring_bytes`` each).
        prefetch_batches: batches built ahead of DALI: by the producer thread
            (``workers=0``), or by each worker (the DataLoader's ``prefetch_factor``).
        stall_warning: log a warning when the training loop waits for data more than this
            share of the time over the last 200 batches (``None``: never).

    Raises:
        ValueError: a bad argument, naming it; with workers, rings that the node's
            memory cannot hold (the message gives the node's total).
    """

    def __init__(
        self,
        stream: ShardStream,
        batch_size: int,
        image_size: int | None = None,
        *,
        device: Literal["auto", "cpu", "mixed", "gpu"] = "auto",
        train: bool | None = None,
        drop_last: bool = False,
        on_error: Literal["raise", "skip"] = "raise",
        precheck: Precheck = "markers",
        settings: PipelineSettings | None = None,
        device_id: int | None = None,
        image_keys: Sequence[str] = IMAGE_KEYS,
        label_key: str = "cls",
        workers: int = 0,
        prefetch_batches: int = 2,
        stall_warning: float | None = 0.2,
    ) -> None:
        _check_arguments(
            stream, batch_size, drop_last, on_error, precheck, settings, label_key, image_keys
        )
        for name, value, low in (
            ("workers", workers, 0),
            ("prefetch_batches", prefetch_batches, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if stall_warning is not None and not (
            isinstance(stall_warning, int | float) and 0 < stall_warning < 1
        ):
            raise ValueError(f"stall_warning must be in (0, 1) or None, got {stall_warning!r}")
        overrides: dict[str, Any] = {"image_size": image_size, "train": train}
        self.settings = replace(
            settings or PipelineSettings(), **{k: v for k, v in overrides.items() if v is not None}
        )
        self.device = resolve_device(device)
        self.device_id = resolve_device_id(self.device, device_id)
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.on_error = on_error
        self.workers = workers
        self.prefetch_batches = prefetch_batches
        self._stream = stream
        self._builder = BatchBuilder(
            batch_size,
            on_error=on_error,
            precheck=precheck,
            image_keys=tuple(image_keys),
            label_key=label_key,
        )
        self._counters = Counters()
        self._skipped: deque[Skipped] = deque(maxlen=100)
        self._feeder = Feeder(self._counters, self._skipped, on_error)
        self._driver = PipelineDriver(
            self._feeder,
            self.settings,
            batch_size=batch_size,
            device=self.device,
            device_id=self.device_id,
            counters=self._counters,
        )
        self._meter = StallMeter()
        self._watch = StallWatch(stall_warning)
        self._workers_loader: Any = None  # the StatefulDataLoader, while workers=N
        self._views: BufferViews | None = None  # the workers' batch buffers, mapped here
        self._workers_state: Any = None  # a DataLoader state to give it before its next pass
        self._feed: Feed | None = None
        self._resume: Any = None  # saved position while no pass runs
        self._loaded = False  # load_state_dict since the last pass started
        self._loaded_epoch = -1  # the epoch of the state loaded
        self._epoch_batches = 0  # batches handed out this epoch, while no pass runs
        self._last: EncodedBatch | None = None
        self._closed = False
        if workers:
            stream.node_ring_bytes(workers)  # refuses up front what memory cannot hold

    def __repr__(self) -> str:
        return (
            f"DALIImageLoader(batch_size={self.batch_size}, device={self.device!r}, "
            f"workers={self.workers}, drop_last={self.drop_last}, on_error={self.on_error!r}, "
            f"{self.settings!r})"
        )

    def __len__(self) -> int:
        """Batches in a full epoch of this rank (an upper bound when images are skipped).

        Every reader (the process, or each worker) ends its share on its own, so each one's
        last batch may be short: the count is summed over them.
        """
        b = self.batch_size
        counts = self._stream.worker_samples(self.workers)
        return sum(n // b if self.drop_last else -(-n // b) for n in counts)

    @property
    def torch_device(self) -> torch.device:
        """Where the batches are: ``cpu`` or ``cuda:<device_id>``."""
        return (
            torch.device("cpu") if self.device_id is None else torch.device("cuda", self.device_id)
        )

    @property
    def last_keys(self) -> list[tuple[str, str]]:
        """``(shard URL, key)`` of each image of the batch last handed out, in order."""
        last = self._last
        return [] if last is None else list(zip(last.urls, last.keys, strict=True))

    # -- iteration ----------------------------------------------------------------------

    def __iter__(self) -> DALIImageLoader:
        """Start a pass: the next epoch (the one :meth:`set_epoch` chose, or a loaded
        state's, from where it was)."""
        self._check_open()
        self._stop()
        self._resume = None
        # The epoch the next iteration reads, in this process or in the workers alike.
        epoch = self._stream.epoch
        batches = self._epoch_batches if self._loaded and epoch == self._loaded_epoch else 0
        self._loaded = False
        feed = self._make_feed()
        self._feeder.start(feed)
        feed.start()
        self._feed = feed
        self._meter.new_epoch()
        self._driver.begin(epoch, batches)
        return self

    def _make_feed(self) -> Feed:
        depth = self.prefetch_batches
        if not self.workers:
            return ThreadFeed(self._stream, self._builder, depth=depth, drop_last=self.drop_last)
        if self._workers_loader is None:
            if self._views is None:
                self._views = BufferViews()  # before the workers start (see BufferViews)
            self._workers_loader = make_worker_loader(
                self._stream,
                self._builder,
                workers=self.workers,
                drop_last=self.drop_last,
                prefetch=self.prefetch_batches,
            )
        if self._workers_state is not None:
            self._workers_loader.load_state_dict(self._workers_state)
            self._workers_state = None
        assert self._views is not None  # made with the workers' loader
        return WorkerFeed(self._workers_loader, self._views)

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._feed is None:
            raise StopIteration
        started = self._meter.begin()
        try:
            batch = self._driver.next()
        except BaseException:
            self._meter.end(started)
            self._stop()  # keeps the failed batch's position: resume retries it
            raise
        self._meter.end(started)
        if batch is None:
            self._stop()
            raise StopIteration
        self._last = self._driver.last
        self._watch.check(self._meter, self._counters, self._feed, self._feeder)
        return batch

    def _stop(self) -> None:
        """End the pass, saving the position of the first batch not handed out."""
        feed, self._feed = self._feed, None
        if feed is None:
            return
        self._meter.pause()
        try:
            self._driver.drain()  # DALI is done with what it holds before it is dropped
            self._epoch_batches = self._driver.batches
            self._resume = self._feeder.head_state()
        finally:
            self._counters.feed_seconds += feed.busy_seconds
            self._counters.feed_wait_seconds += feed.wait_seconds
            self._feeder.stop()  # the producer thread has ended: its CPU is all counted
            self._counters.feed_cpu_seconds += feed.cpu_seconds

    # -- epochs and state ---------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch of the next pass (forwarded to the stream).

        Without it each pass reads the epoch after the one before, as the stream does. A
        loaded state is kept when ``epoch`` is its epoch; for another epoch the next pass
        raises :class:`~asyncstream.StateError` (see :meth:`ShardStream.set_epoch`).
        """
        self._check_open()
        self._stop()
        self._stream.set_epoch(epoch)
        self._resume = None
        if not (self._loaded and epoch == self._loaded_epoch):
            self._loaded = False
            self._epoch_batches = 0
            self._workers_state = None

    def state_dict(self) -> dict[str, Any]:
        """Plain JSON data: the position before the first batch not yet handed out."""
        self._check_open()
        batches = self._epoch_batches
        if self._feed is not None:
            batches, position = self._driver.batches, self._feeder.head_state()
        elif self._resume is not None:
            position = self._resume
        elif self._workers_state is not None:
            position = self._workers_state
        else:
            position = self._stream.state_dict()
        return {
            "kind": _STATE_KIND,
            "version": _STATE_VERSION,
            "batches": batches,
            "rank": self._stream.rank,
            "world_size": self._stream.world_size,
            "workers": self.workers
            if isinstance(position, dict) and "version" not in position
            else 0,
            "stream": copy.deepcopy(position),
        }

    def load_state_dict(self, state: dict[str, Any] | list[dict[str, Any]]) -> None:
        """Resume from :meth:`state_dict`: the next pass starts with the batch after it.

        For the same ranks, give this rank's own state. For another number of ranks, give
        the list of every old rank's state (any order): what they all had left is split
        over the new ranks (see :meth:`asyncstream.ShardStream.load_state_dict`), and the
        pass counts its batches from there. A state saved with the same number of workers
        resumes each worker exactly where it was; one saved with another number (0
        included) splits what was left over this loader's readers.

        Raises:
            StateError: the state is not a loader state or does not fit the stream.
        """
        self._check_open()
        entries = _check_entries(state)
        self._stop()
        same = [e for e in entries if (e["rank"], e["world_size"]) == self._position_of_rank()]
        mine = same[0] if len(entries) == 1 or (same and _one_world(entries, self)) else None
        if mine is not None and self.workers and mine["workers"] == self.workers:
            self._stream.load_state_dict(mine["stream"])  # validates; workers get it below
            self._workers_state = mine["stream"]
        else:
            self._stream.load_state_dict([e["stream"] for e in entries])
            self._workers_state = None
            self._close_workers()  # workers started before the load could not receive it
        self._resume = None
        self._loaded = True
        self._loaded_epoch = self._stream.epoch  # the state's: the next pass resumes it
        self._epoch_batches = mine["batches"] if mine is not None else 0

    def _position_of_rank(self) -> tuple[int, int]:
        return self._stream.rank, self._stream.world_size

    def stats(self) -> dict[str, Any]:
        """Counters since construction, the stall meter, and the stream's statistics.

        ``skipped_samples`` lists the last 100 images skipped (``on_error="skip"``) as
        ``(shard URL, key, reason, source)``, ``source`` being the file ``asyncstream
        pack`` recorded in the sample's ``json`` member, or ``None``. ``stall`` is the
        :class:`~asyncstream.StallMeter` report (the training loop's waiting share, this
        epoch and recently) with ``limit``, the stage that holds it back when it waits.
        ``stream`` is the stream's statistics: while a pass reads it, the producer's
        latest snapshot (at most a second old); with workers, ``workers`` holds each
        worker's. ``batch_buffers_bytes``: the memory of the batch buffers the images are
        copied into and DALI reads, kept and reused (a few batches' worth): with workers,
        the shared memory of theirs, besides their rings; without, the feed thread's.
        """
        self._check_open()
        counters = asdict(self._counters)
        feed = self._feed
        if feed is not None:
            counters["feed_seconds"] += feed.busy_seconds
            counters["feed_wait_seconds"] += feed.wait_seconds
            counters["feed_cpu_seconds"] += feed.cpu_seconds
        snapshots = self._feeder.stream_stats
        if self.workers:
            stream: dict[str, Any] = {"workers": {w: snapshots[w] for w in sorted(snapshots)}}
        elif feed is not None:
            stream = snapshots.get(-1, {})
        else:
            stream = self._stream.stats()
        stall = self._meter.report()
        stall["limit"] = self._watch.limit
        return {
            "device": self.device,
            "workers": self.workers,
            **counters,
            "skipped_samples": list(self._skipped),
            "stall": stall,
            "ring_bytes": self._stream.ring_bytes,
            "node_ring_bytes": self._stream.node_ring_bytes(self.workers, check=False),
            "batch_buffers_bytes": (0 if self._views is None else self._views.nbytes())
            + self._builder.pool().nbytes(),
            "stream": stream,
        }

    # -- lifetime -----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this DALIImageLoader is closed")

    def _close_workers(self) -> None:
        loader, self._workers_loader = self._workers_loader, None
        if self._views is not None:
            self._views.forget()
        if loader is not None:
            iterator = getattr(loader, "_iterator", None)
            shutdown = getattr(iterator, "_shutdown_workers", None)
            if callable(shutdown):
                shutdown()
            loader._iterator = None

    def close(self) -> None:
        """Stop the pipeline, the workers and the stream. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._stop()
            self._driver.close()
            self._close_workers()
        finally:
            self._stream.close()

    def __enter__(self) -> DALIImageLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _one_world(entries: list[dict[str, Any]], loader: DALIImageLoader) -> bool:
    return all(e["world_size"] == loader._stream.world_size for e in entries)


def _other_kind(entry: Any) -> str:
    """What saved ``entry``, which is not a DALIImageLoader state, as a user names it."""
    if not isinstance(entry, dict):
        return f"a {type(entry).__name__}, not a state_dict"
    if "_num_yielded" in entry:
        return (
            "a ShardLoader (StatefulDataLoader) state_dict, not a DALIImageLoader's: give it "
            "to the ShardLoader it came from"
        )
    if entry.get("kind") == "asyncstream.ShardStream" or "position" in entry:
        return "a ShardStream state_dict, not a DALIImageLoader's: give it to the stream"
    return f"a state_dict of kind {str(entry.get('kind'))[:80]!r}, not a DALIImageLoader's"


def _check_entries(state: Any) -> list[dict[str, Any]]:
    """The loader states in ``state`` (one, or one per rank), upgraded to this version."""
    entries = state if isinstance(state, list) else [state]
    out = []
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("kind", _STATE_KIND) != _STATE_KIND:
            raise StateError(f"DALIImageLoader.load_state_dict was given {_other_kind(entry)}")
        if "batches" not in entry and ("_num_yielded" in entry or "position" in entry):
            raise StateError(f"DALIImageLoader.load_state_dict was given {_other_kind(entry)}")
        if entry.get("version") not in (1, _STATE_VERSION):
            raise StateError("not a DALIImageLoader state_dict (or another version)")
        batches = entry.get("batches")
        if isinstance(batches, bool) or not isinstance(batches, int) or batches < 0:
            raise StateError("DALIImageLoader state_dict batches is corrupted")
        if entry["version"] == 1:  # the stream's own state, no workers
            try:
                rank, world = entry["stream"]["topology"][:2]
            except (KeyError, TypeError, ValueError):
                raise StateError("DALIImageLoader state_dict stream is corrupted") from None
            entry = {**entry, "rank": rank, "world_size": world, "workers": 0}
        for name in ("rank", "world_size", "workers"):
            value = entry.get(name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise StateError(f"DALIImageLoader state_dict {name} is corrupted")
        out.append(entry)
    return out


def _check_arguments(
    stream: Any,
    batch_size: Any,
    drop_last: Any,
    on_error: Any,
    precheck: Any,
    settings: Any,
    label_key: Any,
    image_keys: Any,
) -> None:
    if not isinstance(stream, ShardStream):
        raise ValueError(f"stream must be a ShardStream, got {type(stream).__name__}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    if not isinstance(drop_last, bool):
        raise ValueError(f"drop_last must be a bool, got {drop_last!r}")
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    if precheck not in ("none", "markers", "header"):
        raise ValueError(f"precheck must be 'none', 'markers' or 'header', got {precheck!r}")
    if settings is not None and not isinstance(settings, PipelineSettings):
        raise ValueError(f"settings must be a PipelineSettings, got {settings!r}")
    if not isinstance(label_key, str) or not label_key:
        raise ValueError(f"label_key must be a non-empty string, got {label_key!r}")
    if (
        isinstance(image_keys, str)
        or not isinstance(image_keys, Sequence)
        or not image_keys
        or not all(isinstance(k, str) and k for k in image_keys)
    ):
        raise ValueError(
            f"image_keys must be a non-empty sequence of non-empty strings, such as "
            f"('jpg', 'png'), got {image_keys!r}"
        )
