"""Cheap checks of an encoded image before DALI sees it, and how a sample is named.

:func:`check_image` catches what DALI would not report, or would report only by failing a
whole batch: empty members, bytes that are not an image, truncated JPEGs (which otherwise
*decode*, their missing rows grey). Whatever slips past is still caught when DALI fails
(:meth:`._feed.Feeder.triage`).

Naming a sample. ``asyncstream pack`` renumbers keys, so an error names the sample by shard
URL and key and, where the sample has a ``json`` member with a ``"source"`` (pack writes
one), by its source file too: ``file:///data/shard-000001.tar: sample '000017' (source
'cat/img_0007.png')``. The member is parsed only to build such a message.

Image members. A sample's image is its first member among ``image_keys`` (by default every
extension pack writes, and ``jpeg``, ``tif`` and ``tiff``, which other tools write and DALI
decodes); DALI's decoder tells the format from the bytes, not from the extension.
"""

from __future__ import annotations

import io
import json
from typing import Literal

from PIL import Image

__all__ = ["IMAGE_KEYS", "Precheck", "check_image", "describe_sample", "source_of"]

Precheck = Literal["none", "markers", "header"]

IMAGE_KEYS = ("jpg", "jpeg", "png", "webp", "bmp", "tif", "tiff")
"""The image members a sample is searched for, in order: all that ``pack`` writes, and more."""

_JPEG_SOI = b"\xff\xd8\xff"
# Leading bytes of the formats DALI's decoders.image reads (PNM: P1-P6).
_SIGNATURES = (
    _JPEG_SOI,
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
_HEAD = 16  # leading bytes the signatures are looked for in (the longest is 12)


def check_image(data: bytes | memoryview, level: Precheck) -> str | None:
    """Why ``data`` cannot be a decodable image, or ``None`` if it passes ``level``.

    ``"markers"`` (well under a microsecond): not empty, starts with the signature of a
    format DALI decodes, and a JPEG ends with its end-of-image marker (truncated JPEGs
    otherwise decode "successfully" with the missing rows grey). ``"header"`` adds
    Pillow's ``Image.open``, which parses the headers only (15-30 us per image).
    ``data`` may be a view (a worker reading the stream's views): only its first and last
    bytes are copied to look at them.
    """
    if level == "none":
        return None
    if not len(data):
        return "empty image"
    # bytes are looked at in place; of a view, only the ends are copied
    head = data if isinstance(data, bytes) else bytes(data[:_HEAD])
    if head[:3] == _JPEG_SOI:  # nearly every image: its one signature, then its end
        tail = data if isinstance(data, bytes) else bytes(data[-_EOI_WINDOW:])
        if tail.rfind(b"\xff\xd9", -_EOI_WINDOW) < 0:
            return "truncated JPEG (no end-of-image marker)"
    elif not (head[:4] == b"RIFF" and head[8:12] == b"WEBP") and not head.startswith(_SIGNATURES):
        return "not an image DALI decodes (unknown signature)"
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
