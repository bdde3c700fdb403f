"""Runs of plain tar members, read in one tight loop and checked in bulk.

Nearly every header of a webdataset shard is the plain case: a regular file (type ``0``,
``\\0`` or ``7``) with no extended header before it, an 11-digit octal size, the checksum
as ``tarfile`` and GNU tar spell it (``"%06o\\0 "``) and a name that webdataset splits
at its first dot without the help of a regular expression. :class:`~._tar.ShardReader`
spends about 3 µs on each header of that kind in its general parser; :func:`walk` reads
a run of them for a fraction of that, and :func:`first_bad` checks the whole run at once.

Exactness: the walk takes a header only when the general parser would read it the same
way, and stops *before* the first one it cannot vouch for (another type, extended headers,
an odd name, a member past the shard's end or whose data has not arrived): the general
parser then reads that header, with its own errors. What the walk cannot see without
reading all 512 bytes (the checksum, and whether the size is strictly octal) is checked by
:func:`first_bad` over every header of the run in one numpy pass; if a header fails, the
run is walked again up to it, and the general parser reads it, raising the same
:class:`~asyncstream.CorruptTarError` at the same offset as without the fast path.

Names are split in bytes and decoded by parts; UTF-8 with surrogate escapes decodes a name
split at an ASCII byte (``/`` or ``.``) into the decodings of its parts, so the key and the
extension are the general parser's.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

__all__ = ["BULK_MIN", "Field", "Record", "first_bad", "walk"]

# A sample field: (extension, start, stop, None) for the bytes [start, stop) of the range
# fed, or (extension, 0, 0, data) for bytes the reader owns (carried or sparse).
Field = tuple[str, int, int, bytes | None]
# A sample: key, offset of its first header, then its fields in tar order. Two levels of
# tuples of str, int and bytes: the garbage collector stops tracking a field at its first
# collection and the record at its second at the latest, so the tens of thousands of
# samples a window holds never reach the oldest generation (a deeper nesting would, and
# each full collection there costs about 100 ms with PyTorch loaded).
Record = tuple[str, int, *tuple[Field, ...]]

# name, size digits, type flag, first byte of the ustar prefix
_HEAD = struct.Struct("100s24x11s13x8xB188xB")
_PLAIN = frozenset(b"07\0")
_SLASH, _DOT, _UNDERSCORE, _NEWLINE = 0x2F, 0x2E, 0x5F, 0x0A
_MAX_EXTENSIONS = 64  # extensions remembered per reader: a hostile shard cannot grow it
BULK_MIN = 24  # runs this long are checked by numpy; shorter ones header by header
_OCTAL_WEIGHTS = np.array([8**5, 8**4, 8**3, 8**2, 8, 1], dtype=np.int64)


def _extension(raw: bytes) -> str | None:
    """The field name of an extension's bytes, or None where the general parser decides."""
    ext = raw.decode("utf-8", "surrogateescape").lower()
    return None if ext[:1] == "_" else ext


def walk(
    data: memoryview,
    rel: int,
    limit: int,
    stop: int,
    doff: int,
    pending: tuple[str, int, list[Field]] | None,
    extensions: dict[bytes, str],
) -> tuple[int, tuple[str, int, list[Field]] | None, list[Record], list[int]]:
    """Read the plain members from ``data[rel:]`` on, as far as they go.

    Args:
        data: the range being fed; ``doff`` is its offset in the shard.
        rel: the next header, relative to ``data``.
        limit: bytes of ``data`` to use: a header or member data past it is not read.
        stop: the shard's end, relative to ``data``.
        pending: the sample in progress (key, first header, fields), or None.
        extensions: extension bytes to field names, filled as they are met.

    Returns:
        ``(rel, pending, records, heads)``: the header the walk stopped at, the sample then
        in progress, the samples completed and the offsets (relative) of the headers read,
        which :func:`first_bad` must accept before any of it is used.
    """
    records: list[Record] = []
    heads: list[int] = []
    if pending is None:
        key, offset, fields = "", -1, []
        current = None
    else:
        key, offset, fields = pending[0], pending[1], list(pending[2])  # unchanged if rejected
        current = key.encode("utf-8", "surrogateescape")
    owned = offset < doff  # a sample carried into this range keeps owning its bytes
    seen = [f[0] for f in fields]
    unpack = _HEAD.unpack_from
    try:
        while rel + 512 <= limit:
            name, digits, flag, prefix = unpack(data, rel)
            if flag not in _PLAIN:
                break
            size = int(digits, 8)  # anything but digits: ValueError, the walk ends
            start = rel + 512
            if start + size > limit or start + ((size + 511) & -512) > stop:
                break
            cut = name.find(0)
            if cut >= 0:
                name = name[:cut]
            if prefix:  # ustar's name prefix, joined as tarfile joins it
                head = data[rel + 345 : rel + 500].tobytes()
                cut = head.find(0)
                name = (head if cut < 0 else head[:cut]) + b"/" + name
            slash = name.rfind(_SLASH)
            dot = name.find(_DOT, slash + 1)
            if dot <= slash + 1 or name[0] == _UNDERSCORE or _NEWLINE in name:
                break
            tail = name[dot + 1 :]
            ext = extensions.get(tail)
            if ext is None:
                ext = _extension(tail)
                if ext is None:
                    break
                if len(extensions) < _MAX_EXTENSIONS:
                    extensions[tail] = ext
            head = name[:dot]
            if head != current:
                if current is not None:
                    records.append((key, offset, *fields))
                current, key, offset, fields, seen = head, "", doff + rel, [], []
                key = head.decode("utf-8", "surrogateescape")
                owned = False
            elif ext in seen:
                break  # a duplicate: the general parser names it
            seen.append(ext)
            if owned:
                fields.append((ext, 0, 0, data[start : start + size].tobytes()))
            else:
                fields.append((ext, start, start + size, None))
            heads.append(rel)
            rel = start + ((size + 511) & -512)
    except ValueError:
        pass
    return rel, (None if current is None else (key, offset, fields)), records, heads


def first_bad(data: memoryview, heads: list[int]) -> int:
    """The index in ``heads`` of the first header the general parser might read otherwise
    than :func:`walk` did (checksum not ``"%06o\\0 "`` of the unsigned byte sum, size not
    11 octal digits then NUL or space); ``len(heads)`` if there is none."""
    if len(heads) < BULK_MIN:
        return _first_bad_each(data, heads)
    return _first_bad_bulk(data, heads)


def _first_bad_each(data: memoryview, heads: list[int]) -> int:
    for i, rel in enumerate(heads):
        h = data[rel : rel + 512].tobytes()
        total = (zlib.adler32(h[:256]) & 0xFFFF) + (zlib.adler32(h[256:]) & 0xFFFF) - 2
        field = h[148:156]
        if field != b"%06o\0 " % (total - sum(field) + 256):
            return i
        if h[124:135].translate(None, b"01234567") or h[135] not in (0, 0x20):
            return i
    return len(heads)


def _first_bad_bulk(data: memoryview, heads: list[int]) -> int:
    """:func:`_first_bad_each` over all headers at once: their blocks are gathered (every
    header of a range lies at the same offset modulo 512) and summed 256 bytes at a time,
    which fits ``uint16``."""
    flat = np.frombuffer(data, dtype=np.uint8)
    skew = heads[0] & 511
    blocks = flat[skew : skew + (len(flat) - skew) // 512 * 512].reshape(-1, 512)
    rows = blocks[(np.array(heads, dtype=np.int64) - skew) >> 9]
    halves = np.add.reduce(rows.reshape(-1, 256), axis=1, dtype=np.uint16)
    total = halves[0::2].astype(np.int64) + halves[1::2]
    field = rows[:, 148:156]
    digits = field[:, :6].astype(np.int64) - 0x30
    size = rows[:, 124:135]
    good = (
        ((digits >= 0) & (digits <= 7)).all(axis=1)
        & (field[:, 6] == 0)
        & (field[:, 7] == 0x20)
        & (digits @ _OCTAL_WEIGHTS == total - field.sum(axis=1, dtype=np.int64) + 256)
        & ((size >= 0x30) & (size <= 0x37)).all(axis=1)
        & ((rows[:, 135] == 0) | (rows[:, 135] == 0x20))
    )
    bad = np.flatnonzero(~good)
    return int(bad[0]) if len(bad) else len(heads)
