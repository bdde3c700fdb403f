"""Sparse tar members, as GNU tar writes them with ``--sparse``: their maps, expanded.

A sparse member stores only the data regions of a file that is mostly holes, and a
*map* of ``(offset, length)`` regions in the file; the holes read as zeros. Four
spellings, all read by Python's :mod:`tarfile` (so by webdataset) and here:

* **GNU** (``--format=gnu``): type ``S``; four map entries in the header (byte 386), more
  in extension blocks after it (21 each) while their "is extended" byte is set; the
  file's real size at byte 483.
* **PAX 0.0**: a regular member whose ``x`` header repeats ``GNU.sparse.offset`` /
  ``GNU.sparse.numbytes`` records, with ``GNU.sparse.size`` the real size.
* **PAX 0.1**: ``GNU.sparse.map`` (``"off,len,off,len,..."``) and ``GNU.sparse.name``.
* **PAX 1.0**: ``GNU.sparse.major=1``, ``GNU.sparse.minor=0``, ``GNU.sparse.realsize``
  and ``GNU.sparse.name``; the map is at the start of the member's data, decimal numbers
  each ending in a newline (count, then pairs), padded to a 512-byte block.

The stored regions follow one another. GNU tar pads each region to a block and tarfile
reads them back to back: the two agree when every region but the last is a multiple of
512 bytes, which is what GNU tar writes (it finds holes by blocks). A map that is out of
order, overlapping, past the real size, or with a region where the two readings would
differ is refused, as is one whose regions need more bytes than are stored: the reader
raises :class:`~asyncstream.CorruptTarError` naming the member rather than guess.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["SparseMap", "expand", "gnu_extension", "gnu_header", "map_01", "map_10", "tar_number"]

SparseMap = list[tuple[int, int]]
_BLOCK = 512
_OFFSETS_00 = re.compile(rb"\d+ GNU.sparse.offset=(\d+)\n")
_NUMBYTES_00 = re.compile(rb"\d+ GNU.sparse.numbytes=(\d+)\n")


def tar_number(field: bytes) -> int:
    """A numeric header field as tarfile's ``nti`` reads it; ``ValueError`` if it is not one."""
    if field[0] in (0x80, 0xFF):
        n = int.from_bytes(field[1:], "big")
        return n - 256 ** (len(field) - 1) if field[0] == 0xFF else n
    cut = field.find(0)
    text = (field if cut < 0 else field[:cut]).decode("ascii")
    return int(text.strip() or "0", 8)


def _structs(block: bytes, at: int, count: int, *, both: bool) -> SparseMap:
    out: SparseMap = []
    for i in range(count):
        pos = at + 24 * i
        offset, length = tar_number(block[pos : pos + 12]), tar_number(block[pos + 12 : pos + 24])
        if not both or (offset and length):
            out.append((offset, length))
    return out


def gnu_header(header: bytes) -> tuple[SparseMap, bool, int]:
    """``(map entries, extension blocks follow, real size)`` of a GNU ``S`` header."""
    return _structs(header, 386, 4, both=False), bool(header[482]), tar_number(header[483:495])


def gnu_extension(block: bytes) -> tuple[SparseMap, bool]:
    """``(map entries, another extension block follows)`` of a GNU sparse extension block."""
    return _structs(block, 0, 21, both=True), bool(block[504])


def map_00(records: bytes) -> SparseMap:
    """The map of a PAX 0.0 sparse member, from its ``x`` header's records."""
    offsets = [int(m.group(1)) for m in _OFFSETS_00.finditer(records)]
    lengths = [int(m.group(1)) for m in _NUMBYTES_00.finditer(records)]
    return list(zip(offsets, lengths, strict=False))


def map_01(value: str) -> SparseMap:
    """The map of a PAX 0.1 sparse member, from ``GNU.sparse.map``."""
    numbers = [int(x) for x in value.split(",")]
    return list(zip(numbers[::2], numbers[1::2], strict=False))


def map_10(stored: bytes | memoryview) -> tuple[SparseMap, int]:
    """The map at the start of a PAX 1.0 sparse member's data, and the bytes it takes
    (whole blocks, read one at a time as tarfile does).

    Raises:
        ValueError: the map does not parse, or runs past ``stored``.
    """
    blocks = 1
    buf = bytes(stored[:_BLOCK])
    if b"\n" not in buf:
        raise ValueError("no map count in its first block")
    head, buf = buf.split(b"\n", 1)
    fields = int(head)
    numbers: list[int] = []
    while len(numbers) < 2 * fields:
        if b"\n" not in buf:
            if (blocks + 1) * _BLOCK > len(stored):
                raise ValueError("the map runs past the member's data")
            buf += bytes(stored[blocks * _BLOCK : (blocks + 1) * _BLOCK])
            blocks += 1
        number, buf = buf.split(b"\n", 1)
        numbers.append(int(number))
    return list(zip(numbers[::2], numbers[1::2], strict=True)), blocks * _BLOCK


def expand(stored: bytes | memoryview, regions: Sequence[tuple[int, int]], size: int) -> bytes:
    """The file's contents: ``regions`` filled from ``stored`` back to back, zeros between.

    Raises:
        ValueError: the map is one of those the module docstring says are refused.
    """
    data = [(offset, length) for offset, length in regions if length]
    end = 0
    for i, (offset, length) in enumerate(data):
        if offset < end or length < 0 or offset + length > size:
            raise ValueError(
                f"sparse map region ({offset}, {length}) is out of order, overlaps "
                f"or runs past the file's {size} bytes"
            )
        if length % _BLOCK and i < len(data) - 1:
            raise ValueError(
                f"sparse map region ({offset}, {length}) is not a whole number of blocks "
                "and not the last: GNU tar and Python's tarfile read it differently"
            )
        end = offset + length
    need = sum(length for _, length in data)
    if need > len(stored):
        raise ValueError(f"sparse map needs {need} stored bytes, the member has {len(stored)}")
    if size < 0:
        raise ValueError(f"negative real size {size}")
    out = bytearray(size)
    at = 0
    for offset, length in data:
        out[offset : offset + length] = stored[at : at + length]
        at += length
    return bytes(out)
