"""From samples to fed batches: the pre-check, the batch records and the source callable.

Every batch handed to DALI is a :class:`FedBatch`: its arrays (views of the samples'
``bytes``, kept referenced here), labels, keys, and the stream's ``state_dict()`` taken just
before its first sample was pulled. The :class:`Feeder` is the pipeline's source; it keeps
the batches DALI holds in a FIFO, oldest first, so the loader always knows which batch the
next output belongs to and where the stream stood before it.

Undecodable images. DALI cannot drop one sample from a batch: a failed decode raises
``RuntimeError`` from ``outputs()`` for the failing batch (naming the sample's index only
for some failures, e.g. "nvImageCodec failure: '#4'" for garbage), and the pipeline is
then invalid ("Current pipeline object is no longer valid"); it must be rebuilt. So:

1. :func:`check_image` runs on every image before it is fed: it catches empty, garbage and
   truncated images cheaply (a truncated JPEG otherwise *decodes* in DALI, its missing rows
   grey), and the batch is filled up from the next samples;
2. if DALI still fails (corrupt entropy data, a header only the decoder rejects),
   :meth:`Feeder.triage` decodes each image of the batches DALI held, one at a time, in a
   throwaway pipeline; culprits are dropped (``"skip"``: that batch comes out shorter) or
   become a :class:`~asyncstream.DecodeError` (``"raise"``), and the batches are fed again
   to a fresh pipeline. A failure that no single image explains is raised as is.

Naming a sample. ``asyncstream pack`` renumbers keys, so an error names the sample by shard
URL and key and, where the sample has a ``json`` member with a ``"source"`` (pack writes
one), by its source file too: ``file:///data/shard-000001.tar: sample '000017' (source
'cat/img_0007.png')``. The member is parsed only to build such a message.

Image members. A sample's image is its first member among ``image_keys`` (by default every
extension pack writes, and ``jpeg``, ``tif`` and ``tiff``, which other tools write and DALI
decodes); DALI's decoder tells the format from the bytes, not from the extension. A sample
with none of them is a :class:`~asyncstream.DecodeError` naming the members it has.

Errors never escape into DALI: a sample that fails the pre-check (``on_error="raise"``) or
a stream error becomes a *poisoned* record at the end of the FIFO and the source ends the
epoch; the loader raises the error when that record reaches the head, i.e. after every
earlier batch has been handed out, so no batch is lost and ``state_dict()`` then points at
the failed batch. Corruption that leaves a decodable JPEG (flipped bits in the entropy
data) is not detected by anyone: it decodes to wrong pixels.
"""

from __future__ import annotations

import io
import json
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt
from PIL import Image

from asyncstream import DataError, DecodeError

from ._pipeline import Batch, find_undecodable

if TYPE_CHECKING:
    from asyncstream import ShardStream

__all__ = [
    "IMAGE_KEYS",
    "Counters",
    "FedBatch",
    "Feeder",
    "Precheck",
    "check_image",
    "describe_sample",
    "source_of",
]

Precheck = Literal["none", "markers", "header"]

IMAGE_KEYS = ("jpg", "jpeg", "png", "webp", "bmp", "tif", "tiff")
"""The image members a sample is searched for, in order: all that ``pack`` writes, and more."""

_META_KEY = "json"  # the member in which pack records a sample's source file

# Leading bytes of the formats DALI's decoders.image reads (PNM: P1-P6).
_SIGNATURES = (
    b"\xff\xd8\xff",  # JPEG
    b"\x89PNG\r\n\x1a\n",
    b"II*\x00",  # TIFF, little endian
    b"MM\x00*",  # TIFF, big endian
    b"BM",
    b"\x00\x00\x00\x0cjP  \r\n\x87\n",  # JPEG 2000 (JP2)
    b"\xff\x4f\xff\x51",  # JPEG 2000 code stream
    *(b"P%d" % i for i in range(1, 7)),
)
_PIL_FORMATS = frozenset({"JPEG", "PNG", "TIFF", "BMP", "JPEG2000", "PPM", "WEBP"})
_EOI_WINDOW = 64  # trailing bytes searched for a JPEG's end-of-image marker


def check_image(data: bytes, level: Precheck) -> str | None:
    """Why ``data`` cannot be a decodable image, or ``None`` if it passes ``level``.

    ``"markers"`` (well under a microsecond): not empty, starts with the signature of a
    format DALI decodes, and a JPEG ends with its end-of-image marker (truncated JPEGs
    otherwise decode "successfully" with the missing rows grey). ``"header"`` adds
    Pillow's ``Image.open``, which parses the headers only (15-30 us per image).
    """
    if level == "none":
        return None
    if not data:
        return "empty image"
    is_webp = data[:4] == b"RIFF" and data[8:12] == b"WEBP"
    if not (is_webp or data.startswith(_SIGNATURES)):
        return "not an image DALI decodes (unknown signature)"
    if data.startswith(b"\xff\xd8\xff") and data.rfind(b"\xff\xd9", -_EOI_WINDOW) < 0:
        return "truncated JPEG (no end-of-image marker)"
    if level == "header":
        try:
            with Image.open(io.BytesIO(data)) as image:
                found = image.format
        except Exception as exc:  # Pillow raises many types for bad headers
            return f"bad image header ({type(exc).__name__}: {exc})"
        if found not in _PIL_FORMATS:
            return f"{found} images are not decoded by DALI"
    return None


def source_of(meta: object) -> str | None:
    """The ``"source"`` recorded in a sample's ``json`` member, if it holds one."""
    if not isinstance(meta, bytes):
        return None
    try:
        parsed = json.loads(meta)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, nested too deep: not ours
        return None
    source = parsed.get("source") if isinstance(parsed, dict) else None
    return source if isinstance(source, str) else None


def describe_sample(url: str, key: str, meta: object = None) -> str:
    """``"URL: sample 'KEY'"``, with ``" (source 'PATH')"`` when ``meta`` records one."""
    source = source_of(meta)
    return f"{url}: sample {key!r}" + (f" (source {source!r})" if source is not None else "")


@dataclass
class FedBatch:
    """One batch given to DALI (or, with ``error`` set, one that failed before it)."""

    state: dict[str, Any]
    keys: list[str]
    urls: list[str]
    arrays: list[npt.NDArray[np.uint8]]
    labels: list[int]
    metas: list[bytes | None] = field(default_factory=list)  # json members, for messages
    error: BaseException | None = None

    def source_batch(self) -> Batch:
        return self.arrays, np.asarray(self.labels, dtype=np.int64)

    def describe(self, index: int) -> str:
        """Shard, key and source of the sample at ``index``, for a message."""
        return describe_sample(self.urls[index], self.keys[index], self.metas[index])

    def remove(self, indices: set[int]) -> None:
        """Drop the samples at ``indices``."""
        keep = [i for i in range(len(self.keys)) if i not in indices]
        self.keys = [self.keys[i] for i in keep]
        self.urls = [self.urls[i] for i in keep]
        self.arrays = [self.arrays[i] for i in keep]
        self.labels = [self.labels[i] for i in keep]
        self.metas = [self.metas[i] for i in keep]


@dataclass
class Counters:
    """What the loader counts since it was made (see ``DALIImageLoader.stats``)."""

    batches: int = 0
    images: int = 0
    skipped: int = 0
    dropped_last: int = 0
    rebuilds: int = 0
    decode_wait_seconds: float = 0.0
    feed_seconds: float = 0.0
    probe_seconds: float = 0.0


class Feeder:
    """The pipeline's source: pulls samples, checks them, records batches in a FIFO."""

    def __init__(
        self,
        stream: ShardStream,
        batch_size: int,
        *,
        drop_last: bool,
        on_error: Literal["raise", "skip"],
        precheck: Precheck,
        image_keys: tuple[str, ...],
        label_key: str,
        stats: Counters,
        skipped: deque[tuple[str, str, str, str | None]],
    ) -> None:
        self.stream = stream
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.on_error = on_error
        self.precheck: Precheck = precheck
        self.image_keys = image_keys
        self.label_key = label_key
        self.stats = stats
        self.skipped = skipped  # (url, key, reason, source), most recent last
        self.in_flight: deque[FedBatch] = deque()  # given to DALI, oldest first
        self.refeed: deque[FedBatch] = deque()  # to give again to a rebuilt pipeline
        self.samples: Iterator[dict[str, Any]] | None = None
        self.done = False

    def start(self, samples: Iterator[dict[str, Any]]) -> None:
        self.samples = samples
        self.in_flight.clear()
        self.refeed.clear()
        self.done = False

    def head(self) -> FedBatch | None:
        """The batch the pipeline's next output belongs to."""
        if self.in_flight:
            return self.in_flight[0]
        return self.refeed[0] if self.refeed else None

    def __call__(self) -> Batch:
        if self.refeed:
            batch = self.refeed.popleft()
        elif self.done:
            raise StopIteration
        else:
            started = time.perf_counter()
            try:
                batch = self._collect()
            finally:
                self.stats.feed_seconds += time.perf_counter() - started
        self.in_flight.append(batch)
        if batch.error is not None:
            raise StopIteration  # the loader raises batch.error in its turn
        return batch.source_batch()

    def _collect(self) -> FedBatch:
        assert self.samples is not None
        batch = FedBatch(self.stream.state_dict(), [], [], [], [])
        try:
            while len(batch.keys) < self.batch_size:
                sample = next(self.samples, None)
                if sample is None:
                    self.done = True
                    break
                self._add(batch, sample)
        except Exception as exc:  # stream errors too: raised in order, never into DALI
            batch.error = exc
            self.done = True
            return batch
        if not batch.keys or (self.drop_last and len(batch.keys) < self.batch_size):
            self.stats.dropped_last += len(batch.keys)
            raise StopIteration
        return batch

    def _add(self, batch: FedBatch, sample: dict[str, Any]) -> None:
        url, key = str(sample.get("__url__")), str(sample.get("__key__"))
        meta = sample.get(_META_KEY)
        meta = meta if isinstance(meta, bytes) else None
        try:
            label = int(sample[self.label_key])
        except (KeyError, ValueError, TypeError) as exc:
            raise DataError(
                f"{describe_sample(url, key, meta)}: no integer label in {self.label_key!r} ({exc})"
            ) from None
        data = next((d for k in self.image_keys if isinstance(d := sample.get(k), bytes)), None)
        if data is None:
            members = ", ".join(repr(k) for k in sorted(sample) if not k.startswith("__"))
            wanted = ", ".join(repr(k) for k in self.image_keys)
            problem: str | None = (
                f"no image member: it has {members or 'no member'}, the loader looks for "
                f"{wanted} (DALIImageLoader's image_keys)"
            )
        else:
            problem = check_image(data, self.precheck)
        if problem is not None:
            if self.on_error == "raise":
                raise DecodeError(f"{describe_sample(url, key, meta)}: {problem}")
            self.skip(url, key, problem, meta)
            return
        assert data is not None
        batch.keys.append(key)
        batch.urls.append(url)
        batch.arrays.append(np.frombuffer(data, dtype=np.uint8))  # a view: no copy
        batch.labels.append(label)
        batch.metas.append(meta)

    def skip(self, url: str, key: str, reason: str, meta: bytes | None = None) -> None:
        self.stats.skipped += 1
        self.skipped.append((url, key, reason, source_of(meta)))

    def triage(self, device: Literal["cpu", "mixed"], device_id: int | None) -> bool:
        """After DALI failed: probe the batches it held, apply ``on_error``, queue a refeed.

        Every batch DALI held is decoded image by image. ``"skip"`` drops the culprits
        (a batch left empty is dropped); ``"raise"`` turns the first batch with one into a
        poisoned record, and nothing after it is fed. Returns whether an image was to blame.
        """
        batches = [*self.in_flight, *self.refeed]
        self.in_flight.clear()
        self.refeed.clear()
        blamed = False
        for batch in batches:
            bad = {}
            if batch.error is None:
                bad = find_undecodable(batch.arrays, device=device, device_id=device_id)
            blamed = blamed or bool(bad)
            if bad and self.on_error == "raise":
                i = min(bad)
                batch.error = DecodeError(f"{batch.describe(i)}: DALI cannot decode it: {bad[i]}")
            elif bad:
                for i, reason in bad.items():
                    self.skip(batch.urls[i], batch.keys[i], f"DALI: {reason}", batch.metas[i])
                batch.remove(set(bad))
            if batch.keys or batch.error:
                self.refeed.append(batch)
            if batch.error:
                self.done = True  # nothing after a failed batch is fed
                break
        return blamed
