"""DALIImageLoader: batches of decoded images from a ShardStream, for a PyTorch loop.

Copies. The stream copies each sample out of its shared-memory ring into ``bytes`` (one
copy); the loader feeds DALI ``np.frombuffer`` views of those bytes with ``no_copy=True``,
so DALI's decoder reads the very bytes the stream made: exactly one copy from ring to
DALI. Not zero: the stream hands a ring slot back to its fetch engine as soon as the
chunk's last sample is emitted, so views into the ring would be overwritten while DALI
still reads them; holding slots instead would pin them for ``prefetch_queue_depth``
iterations and more (a chunk's samples are spread over many batches by the shuffle),
starving the window shuffle and the fetch prefetch of their slots. With
``no_copy`` DALI does not own what it reads, so every fed batch stays referenced while in
flight and for ``prefetch_queue_depth + 2`` batches after it is handed out (:mod:`._pass`).
On the way out, DALI's outputs become torch tensors through DLPack, without a copy, as
DALI's own PyTorch iterator does (the dynamic executor never reuses an output buffer).

Exact resume. DALI works ``prefetch_queue_depth`` batches ahead, so the stream's position
is past samples the user has not seen. Each batch records ``stream.state_dict()`` taken
just before its first sample was pulled, and batches sit in a FIFO until handed out;
:meth:`DALIImageLoader.state_dict` returns the state recorded for the oldest batch not yet
handed out (the stream's own position when none is in flight), so a restart continues
with exactly the next batch's samples. The augmentation's random state is not saved: a
pass starting at batch ``b`` of epoch ``e`` seeds DALI with ``seed`` for (0, 0) and with
a hash of (seed, e, b, rebuilds) otherwise.

Undecodable images are caught before DALI by a cheap pre-check where possible; when DALI
itself fails, the batches it held are probed image by image, dealt with per ``on_error``
and fed again to a fresh pipeline (see :mod:`._feed`). Errors are raised when the failing
batch would have been handed out, after every earlier batch.

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

from asyncstream import ShardStream, StateError

from ._device import resolve_device, resolve_device_id
from ._feed import IMAGE_KEYS, Counters, FedBatch, Feeder, Precheck
from ._pass import PipelinePass
from ._pipeline import PipelineSettings

__all__ = ["DALIImageLoader"]

_STATE_VERSION = 1


class DALIImageLoader:
    """Decoded, augmented ``(images, labels)`` batches from a :class:`~asyncstream.ShardStream`.

    ``for images, labels in loader`` reads one pass over an epoch of the stream: images
    NCHW (float32 or float16) and labels int64 ``[B]``, both on the pipeline's device.
    Each pass reads the next epoch; :meth:`set_epoch` chooses one. Last batch: with
    ``drop_last=False`` a final short batch comes with its true size; with ``True`` it is
    dropped. With ``on_error="skip"`` a batch in which DALI itself failed on an image also
    comes out one image short (pre-checked images are replaced by the next samples
    instead).

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
            under 1 us/image), ``"header"`` (adds Pillow's header parse: measured ~90
            us/image in the training process, 9% of a 2-core CPU decode's wall time) or
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

    Raises:
        ValueError: a bad argument, naming it.
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
        overrides: dict[str, Any] = {"image_size": image_size, "train": train}
        self.settings = replace(
            settings or PipelineSettings(), **{k: v for k, v in overrides.items() if v is not None}
        )
        self.device = resolve_device(device)
        self.device_id = resolve_device_id(self.device, device_id)
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.on_error = on_error
        self._stream = stream
        self._counters = Counters()
        self._skipped: deque[tuple[str, str, str, str | None]] = deque(maxlen=100)
        self._feeder = Feeder(
            stream,
            batch_size,
            drop_last=drop_last,
            on_error=on_error,
            precheck=precheck,
            image_keys=tuple(image_keys),
            label_key=label_key,
            stats=self._counters,
            skipped=self._skipped,
        )
        self._pass: PipelinePass | None = None
        self._resume: dict[str, Any] | None = None  # saved position while no pass runs
        self._loaded = False  # load_state_dict since the last pass started
        self._loaded_epoch = -1  # the epoch of the state loaded
        self._epoch_batches = 0  # batches handed out this epoch, while no pass runs
        self._last: FedBatch | None = None
        self._closed = False

    def __repr__(self) -> str:
        return (
            f"DALIImageLoader(batch_size={self.batch_size}, device={self.device!r}, "
            f"drop_last={self.drop_last}, on_error={self.on_error!r}, {self.settings!r})"
        )

    def __len__(self) -> int:
        """Batches in a full epoch of this rank (an upper bound when images are skipped)."""
        samples = len(self._stream)
        return samples // self.batch_size if self.drop_last else -(-samples // self.batch_size)

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
        """Start a pass: the current epoch from its start, or from a loaded state."""
        self._check_open()
        self._stop()
        self._resume = None
        samples = iter(self._stream)  # the loaded state's epoch, or (ended there) the next
        epoch = self._stream.epoch
        batches = self._epoch_batches if self._loaded and epoch == self._loaded_epoch else 0
        self._loaded = False
        self._feeder.start(samples)
        self._pass = PipelinePass(
            self._feeder,
            self.settings,
            batch_size=self.batch_size,
            device=self.device,
            device_id=self.device_id,
            epoch=epoch,
            batches=batches,
            counters=self._counters,
        )
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        current = self._pass
        if current is None:
            raise StopIteration
        try:
            batch = current.next()
        except BaseException:
            self._stop()  # keeps the failed batch's position: resume retries it
            raise
        if batch is None:
            self._stop()
            raise StopIteration
        self._last = current.last
        return batch

    def _stop(self) -> None:
        """End the pass, saving the position of the first batch not handed out."""
        current, self._pass = self._pass, None
        if current is not None:
            try:
                self._epoch_batches = current.batches
                self._resume = current.head_state()
            finally:
                current.close()

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

    def state_dict(self) -> dict[str, Any]:
        """Plain JSON data: the position before the first batch not yet handed out."""
        self._check_open()
        batches = self._epoch_batches
        if self._pass is not None:
            batches, stream_state = self._pass.batches, self._pass.head_state()
        elif self._resume is not None:
            stream_state = self._resume
        else:
            stream_state = self._stream.state_dict()
        return {
            "version": _STATE_VERSION,
            "batches": batches,
            "stream": copy.deepcopy(stream_state),
        }

    def load_state_dict(self, state: dict[str, Any] | list[dict[str, Any]]) -> None:
        """Resume from :meth:`state_dict`: the next pass starts with the batch after it.

        For the same ranks, give this rank's own state. For another number of ranks, give
        the list of every old rank's state (any order): what they all had left is split
        over the new ranks (see :meth:`asyncstream.ShardStream.load_state_dict`), and the
        pass counts its batches from there.

        Raises:
            StateError: the state is not a loader state or does not fit the stream.
        """
        self._check_open()
        entries = state if isinstance(state, list) else [state]
        for entry in entries:
            if not isinstance(entry, dict) or entry.get("version") != _STATE_VERSION:
                raise StateError("not a DALIImageLoader state_dict (or another version)")
            batches = entry.get("batches")
            if isinstance(batches, bool) or not isinstance(batches, int) or batches < 0:
                raise StateError("DALIImageLoader state_dict batches is corrupted")
        self._stop()
        self._stream.load_state_dict([entry.get("stream") for entry in entries])
        self._resume = None
        self._loaded = True
        self._loaded_epoch = self._stream.epoch  # the state's: the next pass resumes it
        mine = [
            e["batches"]
            for e in entries
            if e["stream"]["topology"][:2] == [self._stream.rank, self._stream.world_size]
        ]
        same = all(e["stream"]["topology"][1] == self._stream.world_size for e in entries)
        self._epoch_batches = mine[0] if mine and same else 0  # else a new count from here

    def stats(self) -> dict[str, Any]:
        """Counters since construction, plus the stream's statistics of its epoch.

        ``skipped_samples`` lists the last 100 images skipped (``on_error="skip"``) as
        ``(shard URL, key, reason, source)``, ``source`` being the file ``asyncstream
        pack`` recorded in the sample's ``json`` member, or ``None``.
        """
        self._check_open()
        return {
            "device": self.device,
            **asdict(self._counters),
            "skipped_samples": list(self._skipped),
            "stream": self._stream.stats(),
        }

    # -- lifetime -----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this DALIImageLoader is closed")

    def close(self) -> None:
        """Stop the pipeline and close the stream. Idempotent."""
        if self._closed:
            return
        self._closed = True
        current, self._pass = self._pass, None
        if current is not None:
            current.close()
        self._stream.close()

    def __enter__(self) -> DALIImageLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
