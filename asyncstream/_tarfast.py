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

import re
import struct
import zlib

import numpy as np

__all__ = ["BULK_MIN", "Field", "Names", "Record", "first_bad", "walk"]

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
# A name field webdataset splits at the first dot after its last slash, as _members does
# (no newline, no leading underscore), then up to its first NUL: the key and extension.
_NAME = re.compile(rb"(?!_)((?:[^\0\n]*/)?[^\0\n/.]+)\.([^\0\n/]*)(?:\0|\Z)")
_NEVER = b"/" * 101  # a prefix no 100-byte name field starts with
_SLASH, _NEWLINE = 0x2F, 0x0A
_REMEMBERED = 64  # names remembered per reader and kind: a hostile shard cannot grow them
BULK_MIN = 24  # runs this long are checked by numpy; shorter ones header by header
_OCTAL_WEIGHTS = np.array([8**5, 8**4, 8**3, 8**2, 8, 1], dtype=np.int64)


def _extension(raw: bytes) -> str | None:
    """The field name of an extension's bytes, or None where the general parser decides."""
    ext = raw.decode("utf-8", "surrogateescape").lower()
    return None if ext[:1] == "_" else ext


def _sibling(tail: bytes) -> str | None:
    """The field name of a member whose name field is the current sample's key, a dot and
    ``tail`` (NUL-padded), or None if the name does not split there (a ``/`` or a newline
    after the dot) or is the general parser's to name."""
    cut = tail.find(0)
    raw = tail if cut < 0 else tail[:cut]
    if _SLASH in raw or _NEWLINE in raw:
        return None
    return _extension(raw)


class Names:
    """What a reader's walks remember of names: extensions by their bytes, and by the
    NUL-padded rest of a name field after the current key and its dot (the other members
    of a sample are then named with one comparison and one look-up). Bounded: a shard of
    ever new extensions or key lengths only misses."""

    __slots__ = ("extensions", "siblings")

    def __init__(self) -> None:
        self.extensions: dict[bytes, str | None] = {}
        self.siblings: dict[bytes, str | None] = {}


def walk(
    data: memoryview,
    rel: int,
    limit: int,
    stop: int,
    doff: int,
    pending: tuple[str, int, list[Field]] | None,
    names: Names,
) -> tuple[int, tuple[str, int, list[Field]] | None, list[Record], list[int]]:
    """Read the plain members from ``data[rel:]`` on, as far as they go.

    Args:
        data: the range being fed; ``doff`` is its offset in the shard.
        rel: the next header, relative to ``data``.
        limit: bytes of ``data`` to use: a header or member data past it is not read.
        stop: the shard's end, relative to ``data``.
        pending: the sample in progress (key, first header, fields), or None.
        names: the reader's memory of names, filled as they are met.

    Returns:
        ``(rel, pending, records, heads)``: the header the walk stopped at, the sample then
        in progress, the samples completed and the offsets (relative) of the headers read,
        which :func:`first_bad` must accept before any of it is used.
    """
    records: list[Record] = []
    heads: list[int] = []
    if pending is None:
        key, offset, fields, current, dotted = "", -1, [], None, _NEVER
    else:
        key, offset, fields = pending[0], pending[1], list(pending[2])  # unchanged if rejected
        current = key.encode("utf-8", "surrogateescape")
        dotted = current + b"."
    owned = offset < doff  # a sample carried into this range keeps owning its bytes
    seen = [f[0] for f in fields]
    extensions, siblings = names.extensions, names.siblings
    unpack, match, cut = _HEAD.unpack_from, _NAME.match, len(dotted)
    try:
        while rel + 512 <= limit:
            name, digits, flag, prefix = unpack(data, rel)
            if flag not in _PLAIN:
                break
            size = int(digits, 8)  # anything but digits: ValueError, the walk ends
            start = rel + 512
            after = start + ((size + 511) & -512)
            if start + size > limit or after > stop:
                break
            if prefix:  # ustar's name prefix, joined as tarfile joins it
                name = _joined(data[rel + 345 : rel + 500].tobytes(), name)
            ext = None
            if name.startswith(dotted):  # the next member of the current sample, likely
                tail = name[cut:]
                ext = siblings.get(tail)
                if ext is None and tail not in siblings and len(siblings) < _REMEMBERED:
                    ext = siblings[tail] = _sibling(tail)
            if ext is not None:
                if ext in seen:
                    break  # a duplicate: the general parser names it
            else:
                parts = match(name)
                if parts is None:
                    break
                head, tail = parts.groups()
                ext = extensions.get(tail)
                if ext is None:
                    if tail in extensions:
                        break
                    ext = _extension(tail)
                    if len(extensions) < _REMEMBERED:
                        extensions[tail] = ext
                    if ext is None:
                        break
                if head != current:
                    if current is not None:
                        records.append((key, offset, *fields))
                    key = head.decode("utf-8", "surrogateescape")
                    current, dotted, offset, fields, seen = head, head + b".", doff + rel, [], []
                    cut, owned = len(dotted), False
                elif ext in seen:
                    break
            seen.append(ext)
            if owned:
                fields.append((ext, 0, 0, data[start : start + size].tobytes()))
            else:
                fields.append((ext, start, start + size, None))
            heads.append(rel)
            rel = after
    except ValueError:
        pass
    return rel, (None if current is None else (key, offset, fields)), records, heads


def _joined(prefix: bytes, name: bytes) -> bytes:
    """A ustar name field after its prefix field, each up to its first NUL."""
    cut = prefix.find(0)
    head = prefix if cut < 0 else prefix[:cut]
    cut = name.find(0)
    return head + b"/" + (name if cut < 0 else name[:cut])


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
