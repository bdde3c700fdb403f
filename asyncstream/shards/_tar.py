"""Tar members and samples in the webdataset layout.

A sample is the group of consecutive tar members sharing a key: the member's path up
to the first dot of its basename (``train/000017.jpg`` and ``train/000017.cls`` form the
sample ``train/000017`` with the fields ``jpg`` and ``cls``). Which members count and how
they are named is webdataset's rule, exactly (:mod:`._members`): extensions lower-cased,
members without one and ``__x__`` names left out, names decoded with surrogate escapes.

:class:`ShardReader` indexes a shard incrementally as its byte ranges arrive, in place.

Carry / zero-copy contract:

* ``feed(data, offset)`` returns every sample that is complete after this range. A sample
  whose member data lie entirely inside ``data`` gets ``memoryview`` slices of ``data``
  (no copy); they stay valid only as long as the caller keeps ``data``'s buffer alive.
* When ``feed`` returns, the reader holds no reference into ``data``: the sample still in
  progress (always the last one of a non-final range, whose end is only known from the next
  header) has its fields copied to ``bytes``, and the unparsed tail (a split header, a member
  larger than a range) is copied into a reader-owned ``bytearray`` carry. Samples that were
  carried come back with ``bytes`` fields; only those samples are ever copied, and the
  expanded contents of sparse members (:mod:`._sparse`), which are always ``bytes``.
* :attr:`ShardReader.pending_offset` is a header boundary from which a new reader can resume.
* ``records(data, offset)`` is ``feed`` with each sample as a
  :data:`~._tarfast.Record`: its fields as places in ``data`` (or owned ``bytes``), not
  views. The stream keeps those for the samples of its resident chunks: no object per
  field, and nothing the garbage collector keeps scanning.

Parsing: runs of plain members (regular files with no extended header, the usual spelling of
size and checksum, a name webdataset splits at its first dot) are read by a tight loop and
checked in bulk (:mod:`._tarfast`, about a third of the cost per member); every other entry,
and every header that loop cannot vouch for, by the general parser (:mod:`._tarentry`), which
holds every rule below and raises every error.

Formats: ustar (with its name prefix), GNU (``L``/``K`` long names, base-256 sizes, ``S``
sparse members) and PAX (``x``/``X`` records ``path``, ``size`` and GNU's sparse ones; ``g``
globals, see :mod:`._tarheaders`), read as Python's ``tarfile`` reads them. Regular files
(``0``, ``\\0``, ``7``, ``S``) are members; directories (also an old-style ``\\0`` entry
whose name ends in ``/``), links, devices, fifos and unknown types are skipped. Checksums are
accepted summed unsigned or signed, like ``tarfile``; the byte sums use ``zlib.adler32`` (C
speed, and exact: 256 bytes never reach its modulus). Numeric fields that a sample does not
need (mode, uid, mtime, ...) are not parsed. Any malformation is a :class:`CorruptTarError`
naming the shard and the offset of the offending header. A shard that ends inside a header
or a member is truncated, except for a last partial block of zeros (a cut end marker).

Trust (:mod:`._limits`): a member declared larger than ``max_sample_bytes`` (a sparse one
by the size it expands to) is refused at its header, and a sample whose members add up to
more as soon as a range shows it (the sample carried across ranges after each range; the
samples of a range longer than the limit one by one), so a shard makes the reader hold at
most about the limit plus one range, whatever its headers claim. A shard that ends where a
header would begin, without the end-of-archive marker, was cut: by default a
:class:`CorruptTarError` at the byte it ends; under ``on_truncated="warn"`` a
:class:`~asyncstream.TruncatedShardWarning`, and its last sample dropped. The last sample
of a shard is only returned once the marker (or that end) is read.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._exceptions import CorruptTarError, TruncatedShardWarning
from ._limits import ReadLimits
from ._memberorder import MemberOrder
from ._tarentry import BLOCK, EMPTY, EntryParser, looks_compressed
from ._tarfast import (
    Field,
    Member,
    Names,
    Pending,
    RangeWalker,
    Record,
    Records,
    new_member,
    new_records,
)

if TYPE_CHECKING:
    from . import _tarwalk

__all__ = [
    "Record",
    "Records",
    "Sample",
    "ShardReader",
    "byte_view",
    "check_not_empty",
    "looks_compressed",
    "samples",
]

_UNBOUNDED = 1 << 62  # the size of a shard whose size is known only at its end
_LIMITS = ReadLimits()


@dataclass(slots=True)
class Sample:
    """One webdataset sample.

    Attributes:
        key: member path up to the first dot of the basename.
        fields: extension (``"jpg"``, ``"seg.png"``, lower-cased) to data; ``memoryview``
            into the fed range when the sample lay inside it, else ``bytes``.
        offset: absolute byte offset in the shard of the sample's first header.
    """

    key: str
    fields: dict[str, memoryview | bytes]
    offset: int


def byte_view(data: memoryview | bytes | bytearray) -> memoryview:
    """``data`` as a one-dimensional memoryview of bytes (the same view if it is one)."""
    view = data if isinstance(data, memoryview) else memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def samples(view: memoryview, records: Records) -> list[Sample]:
    """The :class:`Sample` of each record of ``view`` (see :meth:`ShardReader.records`)."""
    return [
        Sample(
            record[0],
            {ext: view[a:b] if owned is None else owned for ext, a, b, owned in record[2:]},
            record[1],
        )
        for record in records
    ]


class ShardReader(EntryParser):
    """Incremental, zero-copy reader of one tar shard fed as consecutive byte ranges.

    Args:
        url: the shard, named in errors.
        size: the shard's size in bytes, or ``None`` if it is known only when the final
            range arrives (a decompressed stream).
        start: absolute offset of the first header to read: 0, or a value of
            :attr:`pending_offset` reported by an earlier reader of the same shard.
        limits: the most a sample may hold, and what a shard without its end marker is
            (:mod:`._limits`); default: 16 MiB, an error.
    """

    _fast_path = True  # runs of plain members by ._tarfast; tests turn it off to compare

    def __init__(
        self, url: str, size: int | None, start: int = 0, limits: ReadLimits | None = None
    ) -> None:
        bound = _UNBOUNDED if size is None else size
        if bound < 0 or not 0 <= start <= bound or start % BLOCK:
            raise ValueError(f"{url}: bad start {start} for a shard of {size} bytes")
        # its _carry: shard bytes [_pos, _next) when _pos < _next
        super().__init__(url, bound, limits or _LIMITS)
        self._open_ended = size is None
        self._next = start  # offset the next feed must start at
        self._pos = start  # next header not yet parsed (may lie ahead when skipping data)
        self._pending: Pending | None = None  # sample in progress, fields owned
        self._names = Names()  # what the fast path remembers of names (._tarfast)
        self._skipped = start  # header of the entry whose data _pos skips to
        self._done = False
        self._error: tuple[str, int] | None = None  # (message, offset) once corrupt
        # Members the general parser (._tarentry) read rather than the walk (._tarfast,
        # native or not): what is rare by nature (pax and GNU headers, long names, sparse
        # members, names the walk refuses), and a range's last member, cut by its end, where
        # the walk did not name it (a member after such a header).
        self.general_members = 0
        self._doff = start
        # The first samples of a shard read from its start, for MemberOrderWarning.
        self._order: MemberOrder | None = MemberOrder(url) if start == 0 else None
        # The member cut by the last range's end, its bytes so far (see _Cut).
        self._cut_member: _Cut | None = None

    @property
    def pending_offset(self) -> int:
        """Absolute offset of the first header of the first sample not yet returned.

        It never lies past the bytes fed so far, so a new reader started there is fed
        from within (or at the end of) the data already seen.
        """
        if self._pending is not None:
            return self._pending[1]
        return self._pos if self._pos <= self._next else self._skipped

    @property
    def done(self) -> bool:
        """Whether the end of the archive (marker or end of shard) was reached."""
        return self._done

    def feed(
        self, data: memoryview | bytes | bytearray, offset: int, *, final: bool = False
    ) -> list[Sample]:
        """Index the next byte range of the shard.

        Args:
            data: the shard bytes ``[offset, offset + len(data))``.
            offset: must equal ``start`` first, then the end of the previous range.
            final: this range ends the shard (``offset + len(data) == size``); a range that
                reaches ``size`` is taken as final anyway. After the end-of-archive marker
                (:attr:`done`), further ranges are accepted and ignored.

        Returns:
            The samples completed by this range, in tar order.

        Raises:
            ValueError: the range is not the next one, or ``final`` does not end the shard.
            CorruptTarError: the bytes are not a well-formed webdataset tar.
        """
        view = byte_view(data)
        out = self._index(view, offset, final)
        if out is None:
            del view  # the error raised holds no frame that views `data`
            raise self._sticky_error()
        return samples(view, out)

    def records(
        self, data: memoryview | bytes | bytearray, offset: int, *, final: bool = False
    ) -> Records:
        """:meth:`feed`, with each sample as a :data:`~._tarfast.Record` of its fields'
        places in ``data`` rather than a :class:`Sample` of views: what the stream keeps
        for the samples of a resident chunk, tens of thousands of them, costs neither an
        object per field nor the garbage collector's time. Where the walk is native, one
        table (``_tarwalk.Records``) that reads as the list of records, with no tuple per
        sample until one is asked for."""
        view = byte_view(data)
        out = self._index(view, offset, final)
        if out is None:
            del view
            raise self._sticky_error()
        return out

    def _index(self, view: memoryview, offset: int, final: bool) -> Records | None:
        """The records completed by ``view``; None once the shard is corrupt."""
        end = offset + len(view)
        if final and self._open_ended and offset == self._next:
            self.size = end
        if offset != self._next or end > self.size or (final and end != self.size):
            raise ValueError(
                f"{self.url}: range [{offset}, {end}) does not follow byte {self._next}"
                f" of a {self.size}-byte shard" + (" as its final range" if final else "")
            )
        if self._error is not None:
            return None
        self._next = end
        out = new_records()
        if self._done:
            return out
        self._data, self._doff = view, offset
        try:
            self._run(out, end, final or end == self.size)
        except CorruptTarError as exc:
            # Raised afresh by the caller: this one's traceback holds frames that view data.
            self._error = str(exc), exc.offset
            self._pending, self._carry, self._cut_member = None, bytearray(), None
            return None
        finally:
            self._data = EMPTY
        if self._order is not None and (out or self._done) and self._order.see(out, self._done):
            self._order = None
        return out

    def _sticky_error(self) -> CorruptTarError:
        assert self._error is not None
        return CorruptTarError(self._error[0], url=self.url, offset=self._error[1])

    def _run(self, out: Records, end: int, final: bool) -> None:
        data, doff, pos, pending = self._data, self._doff, self._pos, self._pending
        fast = self._fast_path
        if self._cut_member is not None:
            assert pending is not None  # the cut member's sample
            pos = self._resume_cut(self._cut_member, pending)
        walker = RangeWalker(data, doff, end - doff, self.size - doff, self._names)
        while pos + BLOCK <= end:
            if fast and pos >= doff:
                rel, pending, records, fast, cut = walker.walk(pos - doff, pending)
                out.extend(records)
                pos = rel + doff
                if cut is not None and cut[1] <= self._max and not self._open_ended:
                    # Named by the walk, its sample in progress: its bytes kept (see _Cut).
                    pos = self._gather(cut[0], doff + cut[2], cut[1], end)
                    break
                if pos + BLOCK > end:
                    break
            entry = self._entry(pos, end)
            if entry is None:
                break
            key, ext, start, size, after, sparse = entry
            if key is None:
                if after < 0:
                    self._done = True
                    break
                self._skipped, pos = pos, after
                continue
            if pending is None or pending[0] != key:
                if pending is not None:
                    out.append((pending[0], pending[1], *pending[2]))
                pending = (key, pos, [])
            elif any(field[0] == ext for field in pending[2]):
                raise self._corrupt(pos, f"duplicate field {ext!r} in sample {key!r}")
            if start + size > end:
                if sparse is None and not self._open_ended:
                    # Its bytes so far kept, its header not read again (see _Cut).
                    self.general_members += 1
                    pos = self._gather(ext, start, size, end)
                break
            self.general_members += 1
            if sparse is not None:
                pending[2].append((ext, 0, 0, self._expand(sparse, start, size, pos)))
                self._check(*pending)
            elif pending[1] >= doff:  # the whole sample is in data: zero copy
                pending[2].append((ext, start - doff, start - doff + size, None))
            else:  # a carried sample is all bytes
                pending[2].append((ext, 0, 0, bytes(self._get(start, start + size))))
            pos = after
        if final and not self._done:
            if pos < self.size and (self.size - pos >= BLOCK or any(self._get(pos, self.size))):
                what = "shard ends inside this entry (truncated)"
                if pos == 0:
                    what += looks_compressed(self._get(0, min(8, self.size)))
                raise self._corrupt(pos, what)
            if pos >= self.size:  # no end-of-archive marker: cut where a header would begin
                self._cut(pending)
                pending = None
            self._done = True
        big = end - doff > self._max  # a sample inside this range may pass the limit
        if out and (big or out[0][1] < doff):  # only the first can have been carried
            for record in out if big else [out[0]]:
                self._check(record[0], record[1], record[2:])
        if pending is not None and (big or pending[1] < doff):
            self._check(*pending)
        if self._done:
            if pending is not None:
                out.append((pending[0], pending[1], *pending[2]))
            pending = None
            self._carry = bytearray()
        else:
            if pending is not None:  # owned from now on: data is the caller's
                fields = pending[2]
                for i, (ext, a, b, owned) in enumerate(fields):
                    if owned is None:
                        fields[i] = (ext, 0, 0, data[a:b].tobytes())
            carry = self._carry
            if pos >= end:
                carry.clear()
            elif pos >= doff:
                carry[:] = data[pos - doff :]
            else:
                del carry[: len(carry) - (doff - pos)]
                carry += data
        self._pos, self._pending = pos, pending

    def _gather(self, ext: str, start: int, size: int, end: int) -> int:
        """Keep the bytes so far of the member whose data, at ``start``, this range's end
        cuts (see :class:`_Cut`); returns the header after it."""
        member = new_member(size)
        member.add(self._get(start, end))
        after = start + ((size + BLOCK - 1) & -BLOCK)
        self._cut_member = _Cut(ext, after, member)
        return after

    def _resume_cut(self, cut: _Cut, pending: Pending) -> int:
        """Take the rest of the member cut by the last range's end out of this range: once
        it is whole, a field of ``pending``. Returns where the walk goes on. (This range
        starts where the last one ended: the member's next bytes are its first ones.)"""
        if cut.member.add(self._data[: cut.member.missing]):
            self._cut_member = None
            pending[2].append((cut.ext, 0, 0, cut.member.take()))
        return cut.after

    def _check(self, key: str, offset: int, fields: Iterable[Field]) -> None:
        """Refuse a sample (complete or in progress) holding more than the limit."""
        sizes = [(b - a if owned is None else len(owned), ext) for ext, a, b, owned in fields]
        total = sum(size for size, _ in sizes)
        if total > self._max:
            largest = max(sizes)[1]
            raise self._corrupt(
                offset,
                f"sample {key!r} holds {total} bytes or more (its largest member "
                f"{key + '.' + largest!r}), more than a sample may hold ({self._max} bytes: "
                "max_sample_bytes)",
            )

    def _cut(self, pending: Pending | None) -> None:
        """The shard ends where a header would begin, without the end-of-archive marker."""
        what = (
            f"shard ends at byte {self.size} without the end-of-archive marker (truncated:"
            " cut short, its last sample may lack members)"
        )
        if self.limits.on_truncated == "error":
            raise self._corrupt(self.size, what)
        dropped = "" if pending is None else f"; its last sample {pending[0]!r} is dropped"
        warnings.warn(f"{self.url}: {what}{dropped}", TruncatedShardWarning, stacklevel=5)


@dataclass(slots=True)
class _Cut:
    """A member whose header a range held and whose bytes it cut: the walk named it (or,
    where the walk left it, the general parser read it) once, and its bytes are copied into
    the member as they arrive (:func:`~._tarfast.new_member`), the member's field of the
    sample in progress once they are all in. Before, the range's tail from the header on
    was carried, the header read again from the carry and the member's bytes joined out of
    carry and range: 29 us of the reader's CPU a 1 MiB block's edge, against 20 with the
    general parser reading the header once (``python -m bench.tarblocks``), and less with
    the walk naming it (bench/RESULTS.md).

    Only a shard of known size: there a header's member cannot run past the shard's end
    (the parser and the walk refuse it), so the last range completes it. At most the
    member's size, checked against ``max_sample_bytes`` (a larger one is left to the
    general parser, which refuses it), as the carry held before.
    """

    ext: str
    after: int  # the next header
    member: Member | _tarwalk.Member


def check_not_empty(url: str, size: int) -> None:
    """Refuse a 0-byte shard: no tar writer makes one (an empty archive has its end marker).

    A shard is read as a tar, and :class:`ShardReader` accepts a range that ends without the
    end-of-archive marker, so an empty object would read as a shard of no sample: a failed
    upload or a placeholder would silently drop out of the dataset.

    Raises:
        CorruptTarError: ``size`` is 0.
    """
    if size == 0:
        raise CorruptTarError(
            f"{url}: corrupt tar at byte 0: the object is empty (0 bytes), not a tar shard",
            url=url,
            offset=0,
        )
