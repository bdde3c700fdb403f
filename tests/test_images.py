"""_images: what pack makes of one image file: kept, trimmed, converted, or bad and why."""

from __future__ import annotations

import io
from typing import Any

import pytest
from PIL import Image

from asyncstream.packing._images import BadImage, encode_for_pack, jpeg_end


def _encoded(fmt: str, mode: str = "RGB", **options: Any) -> bytes:
    out = io.BytesIO()
    Image.effect_noise((40, 30), 50).convert(mode).save(out, fmt, **options)
    return out.getvalue()


@pytest.mark.parametrize(
    "options",
    [{}, {"progressive": True}, {"restart_marker_blocks": 1}, {"quality": 40, "optimize": True}],
)
def test_jpeg_end_walks_the_markers(options: dict[str, Any]) -> None:
    jpeg = _encoded("JPEG", **options)
    assert jpeg_end(jpeg) == len(jpeg)
    assert jpeg_end(jpeg + b"\xff\xd9 trailer \xff\xd9" * 8) == len(jpeg)
    assert jpeg_end(jpeg[: len(jpeg) // 2]) is None
    assert jpeg_end(jpeg[:-2]) is None
    assert jpeg_end(b"\x89PNG\r\n\x1a\n") is None


def test_jpeg_end_skips_a_thumbnail_in_exif() -> None:
    thumbnail = _encoded("JPEG")  # a whole JPEG, end marker included, inside APP1
    jpeg = _encoded("JPEG", exif=b"Exif\x00\x00" + thumbnail)
    assert jpeg.find(b"\xff\xd9") < len(jpeg) - 2
    assert jpeg_end(jpeg) == len(jpeg)


@pytest.mark.parametrize(
    ("fmt", "ext"), [("JPEG", "jpg"), ("PNG", "png"), ("WEBP", "webp"), ("BMP", "bmp")]
)
def test_formats_the_loader_reads_are_kept(fmt: str, ext: str) -> None:
    encoded = encode_for_pack(_encoded(fmt), to_jpeg=False, jpeg_quality=95)
    assert (encoded.ext, encoded.data, encoded.converted_from) == (ext, None, None)


@pytest.mark.parametrize(
    ("fmt", "mode"), [("GIF", "P"), ("TIFF", "1"), ("TIFF", "CMYK"), ("PPM", "RGB")]
)
def test_other_formats_become_png_losslessly(fmt: str, mode: str) -> None:
    source = _encoded(fmt, mode)
    encoded = encode_for_pack(source, to_jpeg=False, jpeg_quality=95)
    assert (encoded.ext, encoded.converted_from) == ("png", fmt)
    assert encoded.data is not None
    with Image.open(io.BytesIO(source)) as a, Image.open(io.BytesIO(encoded.data)) as b:
        assert b.format == "PNG"
        assert a.convert("RGB").tobytes() == b.convert("RGB").tobytes()


@pytest.mark.parametrize(("fmt", "mode"), [("PNG", "RGBA"), ("GIF", "P"), ("WEBP", "RGB")])
def test_to_jpeg_converts_all_but_jpegs(fmt: str, mode: str) -> None:
    encoded = encode_for_pack(_encoded(fmt, mode), to_jpeg=True, jpeg_quality=90)
    assert (encoded.ext, encoded.converted_from) == ("jpg", fmt)
    assert encoded.data is not None
    with Image.open(io.BytesIO(encoded.data)) as image:
        assert (image.format, image.mode) == ("JPEG", "RGB")
    jpeg = _encoded("JPEG")
    assert encode_for_pack(jpeg, to_jpeg=True, jpeg_quality=90).data is None  # kept


def _png_with_bad_crc() -> bytes:
    png = bytearray(_encoded("PNG"))
    idat = png.find(b"IDAT")
    png[idat + 8] ^= 0xFF  # a byte of compressed data: its chunk's CRC no longer matches
    return bytes(png)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "empty file"),
        (b"a text file named .jpg\n", "not an image"),
        (_encoded("JPEG")[:300], "does not decode (OSError"),
        (_encoded("PNG")[:200], "does not decode"),
        (_png_with_bad_crc(), "does not decode"),
        (_encoded("WEBP")[:100], "does not decode"),
    ],
)
def test_bad_images_say_why(data: bytes, reason: str) -> None:
    with pytest.raises(BadImage) as caught:
        encode_for_pack(data, to_jpeg=False, jpeg_quality=95)
    assert str(caught.value).startswith(reason)
