"""The images ``pack`` writes: each decoded before it is packed, in a format the loader reads.

Why a full decode. ``Image.verify()`` reads the headers (and, for PNG, checks every
chunk's CRC) but no pixel data, so a JPEG cut short passes it. Each image is therefore
verified, then opened again and decoded in full with ``load()``: that is what finds a
truncated file (Pillow: "image file is truncated"), a text file named ``.jpg`` (no format
identifies it), bad compressed data and decompression bombs. A check of the header and
the JPEG end marker alone would pass a JPEG whose entropy data stops early but ends in a
stray ``FF D9``, and says nothing about PNG, WebP or BMP bodies. The cost: 1.2 ms for a
93 KB, 356x475 JPEG on the development VM (a JPEG decoded at 1/8 scale with ``draft`` was
only 1.7x faster and skips part of the work, so it is not used), spread over pack's
``workers`` threads, as Pillow lets go of the GIL while it decodes. Flipped bits in JPEG
entropy data still decode, to wrong pixels, in Pillow and DALI alike: nothing catches them.

Formats. Kept byte for byte: JPEG (also MPO, the multi-picture JPEG of many cameras), PNG,
WebP and BMP. DALI 2.4's ``fn.decoders.image`` reads all four (checked on its CPU decoder
here: 8 bit, grey, palette, alpha; animated PNG and WebP give their first frame). From a
JPEG only what follows its end-of-image marker is dropped (a phone's appended video, an
MPO's second picture, padding): no decoder reads it, and the loader's pre-check takes a JPEG
that does not end with that marker for a truncated one. Anything else Pillow reads is
converted to PNG, losslessly: GIF (DALI has no GIF decoder; the first frame is kept), TIFF
(DALI's TIFF parser rejects variants Pillow reads, bilevel ones for instance) and whatever
other format Pillow finds in a file named like an image. With ``to_jpeg`` every image that
is not a JPEG already becomes a JPEG at ``jpeg_quality`` (JPEGs are kept as they are: no
second generation of loss). A converted image is first turned upright by its EXIF
orientation (the tag is not carried over); one that becomes a JPEG loses its alpha channel,
as the loader's RGB decode of the original would drop it too.
"""

from __future__ import annotations

import io
import json
import re
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from PIL import Image, ImageOps, UnidentifiedImageError

__all__ = [
    "KEPT_FORMATS",
    "BadImage",
    "Conversion",
    "Encoded",
    "PackImage",
    "SkippedImage",
    "SourceImage",
    "check_images",
    "encode_for_pack",
    "jpeg_end",
    "listing",
]

KEPT_FORMATS = {"JPEG": "jpg", "MPO": "jpg", "PNG": "png", "WEBP": "webp", "BMP": "bmp"}
"""Pillow's format name -> the member extension, for the formats packed as they are."""

_PNG_MODES = frozenset({"1", "L", "LA", "I", "I;16", "P", "RGB", "RGBA"})
_JPEG_MODES = frozenset({"L", "RGB"})
# In entropy-coded data FF is followed by 00 (a stuffed byte), a restart marker or more FF.
_NEXT_MARKER = re.compile(rb"\xff(?=[^\x00\xd0-\xd7\xff])")
_SHOWN = 10  # bad images named in a message; PackResult.skipped has them all
_T = TypeVar("_T")
_R = TypeVar("_R")


@dataclass(frozen=True)
class SourceImage:
    """A source image as pack's scan found it."""

    path: Path
    label: int
    source: str  # relative to the source folder, "/"-separated


@dataclass(frozen=True)
class PackImage:
    """A checked image, ready to be packed: its bytes are in ``data_path``."""

    data_path: Path  # the source file, or its conversion in the spool
    ext: str
    size: int
    label: int
    meta: bytes  # the .json member


@dataclass(frozen=True)
class Conversion:
    """How images are stored: ``to_jpeg`` or not, and where conversions wait to be packed."""

    to_jpeg: bool
    jpeg_quality: int
    spool: Path


@dataclass(frozen=True)
class SkippedImage:
    """A source image that :func:`~asyncstream.pack` left out.

    Attributes:
        source: its path relative to the source folder, with ``/`` separators.
        reason: why, e.g. ``"does not decode (OSError: image file is truncated ...)"``.
    """

    source: str
    reason: str

    def __str__(self) -> str:
        return f"{self.source}: {self.reason}"


class BadImage(Exception):
    """Raised by :func:`encode_for_pack` for an image that does not decode; ``str`` says why."""


@dataclass(frozen=True)
class Encoded:
    """What goes into the shard for one image.

    Attributes:
        ext: the member's extension (``jpg``, ``png``, ``webp`` or ``bmp``).
        data: the bytes to pack (converted, or a JPEG without what follows its end), or
            ``None`` to pack the file's own bytes.
        converted_from: Pillow's name of the source format when converted (``"GIF"``).
    """

    ext: str
    data: bytes | None = None
    converted_from: str | None = None


def encode_for_pack(data: bytes, *, to_jpeg: bool, jpeg_quality: int) -> Encoded:
    """Decode ``data`` in full and say what to pack for it (see the module docstring).

    Raises:
        BadImage: empty, not an image, or an image that does not decode; the message says
            which, with Pillow's own words.
    """
    if not data:
        raise BadImage("empty file")
    try:
        with Image.open(io.BytesIO(data)) as image:
            found = image.format or "unknown"
            image.verify()
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            ext = KEPT_FORMATS.get(found)
            if ext == "jpg":
                end = jpeg_end(data)
                return Encoded(ext, data[:end] if end is not None and end < len(data) else None)
            if ext is not None and not to_jpeg:
                return Encoded(ext)
            target = "JPEG" if to_jpeg else "PNG"
            return Encoded(target_ext(target), _convert(image, target, jpeg_quality), found)
    except MemoryError:
        raise
    except UnidentifiedImageError:
        raise BadImage("not an image (no format Pillow knows matches its bytes)") from None
    except Exception as exc:  # Pillow raises OSError, SyntaxError, ValueError, EOFError...
        raise BadImage(f"does not decode ({type(exc).__name__}: {exc})") from None


def jpeg_end(data: bytes) -> int | None:
    """The offset just past the end-of-image marker of the JPEG that ``data`` starts with.

    Walks the marker segments (and, after each start of scan, the entropy-coded data, in
    which ``FF`` is followed only by ``00``, a restart marker or more ``FF``), so an ``FF
    D9`` inside an EXIF thumbnail or a trailer is never taken for the end. ``None`` where
    the structure is not what it should be: the bytes are then packed as they are.
    """
    size = len(data)
    if not data.startswith(b"\xff\xd8"):
        return None
    pos = 2
    while pos + 1 < size:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte before a marker
            pos += 1
        elif marker == 0xD9:
            return pos + 2
        elif marker == 0x01 or 0xD0 <= marker <= 0xD7:  # markers without a length
            pos += 2
        else:
            if pos + 4 > size:
                return None
            pos += 2 + int.from_bytes(data[pos + 2 : pos + 4], "big")
            if marker == 0xDA:  # entropy-coded data up to the next marker
                found = _NEXT_MARKER.search(data, pos)
                if found is None:
                    return None
                pos = found.start()
    return None


def target_ext(fmt: str) -> str:
    """The member extension of a format pack converts to."""
    return "jpg" if fmt == "JPEG" else "png"


def _convert(image: Image.Image, fmt: str, quality: int) -> bytes:
    upright = ImageOps.exif_transpose(image)
    modes = _JPEG_MODES if fmt == "JPEG" else _PNG_MODES
    if upright.mode not in modes:
        if upright.mode == "P" and "transparency" in upright.info:
            upright = upright.convert("RGBA")  # Pillow warns on a direct P -> RGB here
        bands = upright.getbands()
        alpha = "A" in bands or "a" in bands
        upright = upright.convert("RGBA" if alpha and fmt == "PNG" else "RGB")
    out = io.BytesIO()
    if fmt == "JPEG":
        upright.save(out, "JPEG", quality=quality)
    else:
        upright.save(out, "PNG")
    return out.getvalue()


def check_images(
    found: Sequence[SourceImage],
    classes: Sequence[str],
    conversion: Conversion,
    workers: int,
    progress: Callable[[int, int], None] | None,
) -> tuple[list[PackImage], list[SkippedImage]]:
    """Decode every image in ``workers`` threads; the good ones and the bad, in source order.

    A converted image is written to ``conversion.spool`` (memory holds a few images at
    most, whatever the dataset's size). ``progress(checked, total)`` after each image.

    Raises:
        OSError: a file that cannot be read: the pack fails, as this is no bad image.
    """

    def one(item: tuple[int, SourceImage]) -> PackImage | SkippedImage:
        index, found_image = item
        data = found_image.path.read_bytes()
        try:
            encoded = encode_for_pack(
                data, to_jpeg=conversion.to_jpeg, jpeg_quality=conversion.jpeg_quality
            )
        except BadImage as exc:
            return SkippedImage(found_image.source, str(exc))
        label = found_image.label
        meta: dict[str, Any] = {"source": found_image.source, "class": classes[label]}
        meta["label"] = label
        data_path, size = found_image.path, len(data)
        if encoded.converted_from is not None:
            meta["converted_from"] = encoded.converted_from
        if encoded.data is not None:
            data_path, size = conversion.spool / f"{index}.{encoded.ext}", len(encoded.data)
            data_path.write_bytes(encoded.data)
        meta_bytes = json.dumps(meta, separators=(",", ":")).encode()
        return PackImage(data_path, encoded.ext, size, label, meta_bytes)

    good: list[PackImage] = []
    bad: list[SkippedImage] = []
    with ThreadPoolExecutor(workers) as pool:
        for done, result in enumerate(_in_order(pool, one, enumerate(found), 4 * workers), 1):
            if isinstance(result, SkippedImage):
                bad.append(result)
            else:
                good.append(result)
            if progress is not None:
                progress(done, len(found))
    return good, bad


def listing(bad: Sequence[SkippedImage]) -> str:
    """``"path: reason; ..."`` for the first few bad images, and how many more."""
    shown = "; ".join(str(b) for b in bad[:_SHOWN])
    return shown + (f"; ... and {len(bad) - _SHOWN} more" if len(bad) > _SHOWN else "")


def _in_order(
    pool: ThreadPoolExecutor, fn: Callable[[_T], _R], items: Iterable[_T], ahead: int
) -> Iterator[_R]:
    """``pool.map`` with at most ``ahead`` calls submitted and not yet consumed."""
    pending: deque[Future[_R]] = deque()
    try:
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) >= ahead:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for fut in pending:
            fut.cancel()
