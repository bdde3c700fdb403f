"""The plain headers of a whole range, found and checked by numpy at once.

For :mod:`._tarfast`. A range of a webdataset shard holds thousands of headers; reading
each one's size, type and checksum in Python costs about half a microsecond. Here every
block of the range is a candidate header when its bytes 257-261 are the ``ustar`` magic
(POSIX and GNU headers both carry it; a v7 header does not, and is read header by header);
the candidates' blocks are gathered and checked together, and their sizes say which one
follows which. :class:`HeaderTable` keeps, for the walks of that range, each candidate's
offsets and name field and where each run of plain members ends.

A candidate is *plain* when the general parser (:mod:`._tarentry`) would read it as the
walk does: type ``0``, ``\\0`` or ``7``, a size of 11 octal digits then
NUL or space, the checksum spelled ``"%06o\\0 "`` and equal to the unsigned byte sum, no
ustar name prefix, and its data inside the range and the shard. A run of plain candidates
goes on while each one's next header is the next candidate; a block of member data that
happens to hold the magic (a tar inside a member) breaks the run, and the walk goes on
from there header by header.

:func:`first_bad` is the same check for headers found one by one.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from operator import itemgetter

import numpy as np
import numpy.typing as npt

__all__ = ["BULK_MIN", "TABLE_MIN", "HeaderTable", "first_bad"]

BULK_MIN = 24  # headers found one by one are checked by numpy from this many on
TABLE_MIN = 32  # a range with fewer candidates is walked header by header
_NAME = struct.Struct("100s")
_first = itemgetter(0)
# The checksum's digits weighted by their octal place plus one: the stored value plus the
# digits' own sum. The unsigned byte sum less that sum must be 64 (the field's 8 spaces
# count 256 in the sum, its NUL and space 32, and the digits are ASCII: 48 each more).
_CHECKSUM_WEIGHTS = np.array([8**5 + 1, 8**4 + 1, 8**3 + 1, 8**2 + 1, 9, 2], dtype=np.int64)
_CHECKSUM_BIAS = 48 * int(_CHECKSUM_WEIGHTS.sum()) - 64
_SIZE_WEIGHTS = 8 ** np.arange(10, -1, -1, dtype=np.int64)
_SIZE_BIAS = 48 * int(_SIZE_WEIGHTS.sum())
_STAR = int.from_bytes(b"star", "little")  # bytes 258-261: the magic after its "u"
_FOUR = np.arange(4)
_OCTAL4_MASK, _OCTAL4 = 0xF8F8F8F8, 0x30303030  # four octal digits, little-endian
_CHECKSUM_MASK, _CHECKSUM_FORM = 0xFFFFF8F8F8F8F8F8, 0x2000303030303030  # 6 digits, NUL, " "

Rows = npt.NDArray[np.uint8]


def _u32(rows: Rows, at: int) -> npt.NDArray[np.uint32]:
    """Bytes ``[at, at + 4)`` of every row, as a little-endian word."""
    return np.ascontiguousarray(rows[:, at : at + 4]).view("<u4")[:, 0]


def _u64(rows: Rows, at: int) -> npt.NDArray[np.uint64]:
    """Bytes ``[at, at + 8)`` of every row, as a little-endian word."""
    return np.ascontiguousarray(rows[:, at : at + 8]).view("<u8")[:, 0]


def _sums(rows: Rows) -> npt.NDArray[np.int64]:
    """The unsigned byte sum of every row, 256 bytes at a time (which fits ``uint16``)."""
    halves = np.add.reduce(rows.reshape(-1, 256), axis=1, dtype=np.uint16)
    sums: npt.NDArray[np.int64] = halves[0::2].astype(np.int64) + halves[1::2]
    return sums


def _plain(rows: Rows) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.int64]]:
    """Which rows are plain headers (limits aside), and their sizes (where they are)."""
    size_digits = _u64(rows, 124)  # digits 124-131
    size_tail = _u32(rows, 132)  # digits 132-134, then NUL or space
    flag = rows[:, 156]
    ok = (
        ((size_digits & 0xF8F8F8F8F8F8F8F8) == 0x3030303030303030)
        & ((size_tail & 0xDFF8F8F8) == 0x00303030)
        & ((flag == 0x30) | (flag == 0) | (flag == 0x37))
        & (rows[:, 345] == 0)
        & ((_u64(rows, 148) & _CHECKSUM_MASK) == _CHECKSUM_FORM)
        & (rows[:, 148:154] @ _CHECKSUM_WEIGHTS == _sums(rows) + _CHECKSUM_BIAS)
    )
    return ok, rows[:, 124:135] @ _SIZE_WEIGHTS - _SIZE_BIAS


class HeaderTable:
    """The candidate headers of one range and the runs of plain members among them.

    Built by :meth:`of`; holds no reference into the range (its rows are copies).

    Attributes:
        starts, stops: each candidate's data start and end, relative to the range.
    """

    __slots__ = ("_afters", "_blocks", "_names", "_unfit", "_unlinked", "starts", "stops")

    def __init__(
        self,
        blocks: npt.NDArray[np.int64],
        names: bytes,
        starts: npt.NDArray[np.int64],
        sizes: npt.NDArray[np.int64],
        afters: npt.NDArray[np.int64],
        ok: npt.NDArray[np.bool_],
    ) -> None:
        self._blocks = blocks  # each candidate's header, in blocks from the range's first
        self._names = memoryview(names)  # their name fields, 100 bytes each
        self.starts: list[int] = starts.tolist()
        self.stops: list[int] = (starts + sizes).tolist()
        self._afters = afters  # the header after each
        self._unfit = np.flatnonzero(~ok)  # candidates that are not plain headers
        # plain ones whose next header is not the next candidate
        self._unlinked = np.flatnonzero(ok[:-1] & (afters[:-1] != starts[1:] - 512))

    @classmethod
    def of(cls, data: memoryview, rel: int, limit: int, stop: int) -> HeaderTable | None:
        """The table of ``data[:limit]`` from the header at ``rel`` on (``stop``: the
        shard's end, relative to ``data``), or None if the range is too small for it."""
        flat = np.frombuffer(data, dtype=np.uint8)
        skew = rel & 511  # every header of the range lies here modulo 512
        count = (limit - skew) >> 9
        first = (rel - skew) >> 9
        column = flat[skew + 257 : skew + count * 512 : 512]  # byte 257 of every block
        blocks = np.flatnonzero(column[first:] == 0x75) + first  # "u"
        magic = flat[(skew + 258 + (blocks << 9))[:, None] + _FOUR]
        blocks = blocks[np.ascontiguousarray(magic).view("<u4")[:, 0] == _STAR]  # "star"
        if len(blocks) < TABLE_MIN:
            return None
        rows = flat[skew : skew + count * 512].reshape(count, 512)[blocks]
        ok, sizes = _plain(rows)
        starts = skew + 512 + (blocks << 9)
        afters = starts + ((sizes + 511) & -512)
        ok &= (starts + sizes <= limit) & (afters <= stop)
        return cls(blocks, rows[:, :100].tobytes(), starts, sizes, afters, ok)

    def run(self, rel: int) -> tuple[int, int, int]:
        """``(i, j, after)``: the candidates ``i`` to ``j - 1`` are the run of plain
        members whose first header is at ``rel`` (empty if ``rel`` is no plain
        candidate), and ``after`` is the header after the run."""
        block = rel >> 9
        i = int(np.searchsorted(self._blocks, block))
        if i == len(self._blocks) or self._blocks[i] != block:
            return i, i, rel
        j = len(self._blocks)
        k = int(np.searchsorted(self._unfit, i))
        if k < len(self._unfit):
            j = int(self._unfit[k])
        k = int(np.searchsorted(self._unlinked, i))
        if k < len(self._unlinked):
            j = min(j, int(self._unlinked[k]) + 1)
        return i, j, int(self._afters[j - 1]) if j > i else rel

    def name_fields(self, i: int, j: int) -> memoryview:
        """The name fields of candidates ``i`` to ``j - 1``, 100 bytes each, in a row."""
        return self._names[100 * i : 100 * j]

    def names(self, i: int, j: int) -> Iterator[bytes]:
        """The name fields of candidates ``i`` to ``j - 1``."""
        return map(_first, _NAME.iter_unpack(self._names[100 * i : 100 * j]))


def first_bad(data: memoryview, heads: list[int]) -> int:
    """The index in ``heads`` of the first header the general parser might read otherwise
    than as a plain one (checksum not ``"%06o\\0 "`` of the unsigned byte sum, size not 11
    octal digits then NUL or space); ``len(heads)`` if there is none. ``heads``: offsets
    relative to ``data`` of headers known to be of a plain type, without a name prefix."""
    if len(heads) < BULK_MIN:
        for i, rel in enumerate(heads):
            h = data[rel : rel + 512].tobytes()
            total = (zlib.adler32(h[:256]) & 0xFFFF) + (zlib.adler32(h[256:]) & 0xFFFF) - 2
            field = h[148:156]
            if field != b"%06o\0 " % (total - sum(field) + 256):
                return i
            if h[124:135].translate(None, b"01234567") or h[135] not in (0, 0x20):
                return i
        return len(heads)
    flat = np.frombuffer(data, dtype=np.uint8)
    skew = heads[0] & 511
    blocks = flat[skew : skew + (len(flat) - skew) // 512 * 512].reshape(-1, 512)
    rows = blocks[(np.array(heads, dtype=np.int64) - skew) >> 9]
    size_digits, size_tail = _u64(rows, 124), _u32(rows, 132)
    good = (
        ((size_digits & 0xF8F8F8F8F8F8F8F8) == 0x3030303030303030)
        & ((size_tail & 0xDFF8F8F8) == 0x00303030)
        & ((_u64(rows, 148) & _CHECKSUM_MASK) == _CHECKSUM_FORM)
        & (rows[:, 148:154] @ _CHECKSUM_WEIGHTS == _sums(rows) + _CHECKSUM_BIAS)
    )
    bad = np.flatnonzero(~good)
    return int(bad[0]) if len(bad) else len(heads)
