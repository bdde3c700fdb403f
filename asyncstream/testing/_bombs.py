"""Hostile shards of a few kilobytes that claim or expand to gigabytes, for the tests and
the benchmark of the reader's bounds (``tests/test_security_shards.py``,
``python -m bench.bombs``): what a reviewer of the trust boundaries built to show that a
shard's sizes come from whoever wrote it (docs/security.md)."""

from __future__ import annotations

import gzip

import zstandard

__all__ = ["BOMBS", "gzip_bomb", "header", "sparse_bomb", "zstd_bomb"]


def header(
    name: str, size: int, flag: bytes = b"0", extra: dict[int, bytes] | None = None
) -> bytes:
    """A ustar/GNU header (octal size up to 8 GiB, base-256 beyond)."""
    h = bytearray(512)
    h[: len(name)] = name.encode()
    h[100:108] = b"0000644\0"
    h[124:136] = b"%011o\0" % size if size < 8**11 else b"\x80" + size.to_bytes(11, "big")
    h[136:148] = b"00000000000\0"
    h[156:157] = flag
    h[257:265] = b"ustar  \0"
    for at, value in (extra or {}).items():
        h[at : at + len(value)] = value
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def sparse_bomb(real: int) -> bytes:
    """A GNU sparse member of one 512-byte region claiming ``real`` bytes (3 KB in all)."""
    real_field = b"%011o\0" % real if real < 8**11 else b"\x80" + real.to_bytes(11, "big")
    extra = {386: b"%011o\0" % 0 + b"%011o\0" % 512, 482: b"\0", 483: real_field}
    first = header("a.cls", 1) + b"1" + bytes(511)
    return first + header("bomb.bin", 512, b"S", extra) + b"x" * 512 + bytes(1024)


def gzip_bomb(size: int) -> bytes:
    """A tar member of ``size`` zero bytes, gzip-compressed: streams of 16 MiB of zeros
    (about 16 KB each) one after the other, as ``pigz`` writes them."""
    piece = gzip.compress(bytes(16 << 20), 9)
    return gzip.compress(header("bomb.bin", size)) + piece * (size // (16 << 20))


def zstd_bomb(size: int) -> bytes:
    """A tar member of ``size`` zero bytes in one zstd frame of RLE blocks (4 bytes for each
    128 KiB): one decompress call of 256 KiB of it was 8 GiB."""
    blocks = size // (128 << 10)
    rle = ((128 << 10) << 3 | 1 << 1).to_bytes(3, "little") + b"\0"
    last = ((128 << 10) << 3 | 1 << 1 | 1).to_bytes(3, "little") + b"\0"
    frame = b"\x28\xb5\x2f\xfd" + b"\x00\x38" + rle * (blocks - 1) + last
    return zstandard.ZstdCompressor().compress(header("bomb.bin", size)) + frame


#: name -> (builder, the suffix of its shard's URL)
BOMBS = {
    "sparse": (sparse_bomb, ".tar"),
    "gzip": (gzip_bomb, ".tar.gz"),
    "zstd": (zstd_bomb, ".tar.zst"),
}
