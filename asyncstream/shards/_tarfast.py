"""Runs of plain tar members, read in tight loops and checked in bulk.

Nearly every header of a webdataset shard is the plain case: a regular file (type ``0``,
``\\0`` or ``7``) with no extended header before it, an 11-digit octal size, the checksum
as ``tarfile`` and GNU tar spell it (``"%06o\\0 "``) and a name that webdataset splits
at its first dot. :class:`~._tar.ShardReader` spends about 3 µs on each header in its
general parser (:mod:`._tarentry`); :class:`RangeWalker` reads a run of plain members for
a fraction of that, in two steps:

1. **find**: the run's headers, their data and their name fields. From a table of the
   whole range built by numpy (:mod:`._tarbulk`), or, where there is none (a small range,
   v7 headers, a run the table cannot follow), header by header, checked afterwards by
   :func:`~._tarbulk.first_bad` all at once;
2. **group**: each member named (a sample's next member by one comparison with its key
   and one look-up) and grouped into samples.

Exactness: a header is taken only when the general parser would read it the same way;
the walk stops *before* the first one it cannot vouch for (another type, extended
headers, a name prefix or an odd name, an unusual spelling of a number, a bad checksum, a
member past the shard's end, a duplicate field), and the general parser reads that header,
with its own errors: the same :class:`~asyncstream.CorruptTarError` at the same offset as
without the fast path. After a header the check refused, the rest of the range is left to
the general parser, so a shard of unusual headers costs at most one wasted walk per range.
A plain member whose data the range's end cuts (inside the shard) ends the walk too, named
as the sample's next member and returned as the *cut*: the reader gathers its bytes from
the next ranges (``_tar._Cut``) without the general parser reading its header again, 6 µs
of each block's edge.

Names are split in bytes and decoded by parts; UTF-8 with surrogate escapes decodes a name
split at an ASCII byte (``/`` or ``.``) into the decodings of its parts, so the key and the
extension are the general parser's.

Native: where the extension :mod:`._tarwalk` is built (every install builds it),
:meth:`RangeWalker.walk` is its ``walk``, the same find, check and group in C with the GIL
released for the loop over the headers' bytes, its records one ``_tarwalk.Records`` table
(no tuple per sample or field; it reads as the list, see :func:`new_records`). The Python
walk here stays as its
reference: ``ASYNCSTREAM_NATIVE=0`` in the environment (read once, at import) or
:data:`NATIVE` set to ``False`` selects it; the tests read every input both ways.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeAlias

from . import _targroup
from ._tarbulk import HeaderTable, first_bad
from ._tarheaders import pax_records

if TYPE_CHECKING:
    from . import _tarwalk

__all__ = [
    "NATIVE",
    "Field",
    "Member",
    "Names",
    "RangeWalker",
    "Record",
    "Records",
    "native_deliver",
    "new_member",
    "new_records",
]

# A sample field: (extension, start, stop, None) for the bytes [start, stop) of the range
# fed, or (extension, 0, 0, data) for bytes the reader owns (carried or sparse).
Field = tuple[str, int, int, bytes | None]
# A sample: key, offset of its first header, then its fields in tar order. Two levels of
# tuples of str, int and bytes: the garbage collector stops tracking a field at its first
# collection and the record at its second at the latest, so the tens of thousands of
# samples a window holds never reach the oldest generation (a deeper nesting would, and
# each full collection there costs about 100 ms with PyTorch loaded).
Record = tuple[str, int, *tuple[Field, ...]]
# The sample in progress: (key, offset of its first header, fields so far).
Pending = tuple[str, int, list[Field]]

# name, size digits, type flag, first byte of the ustar prefix
_HEAD = struct.Struct("100s24x11s13x8xB188xB")
_PLAIN = frozenset(b"07\0")
# A name field webdataset splits at the first dot after its last slash, as _members does
# (no newline, no leading underscore), then up to its first NUL: the key and extension.
_NAME = re.compile(rb"(?!_)((?:[^\0\n]*/)?[^\0\n/.]+)\.([^\0\n/]*)(?:\0|\Z)")
_NEVER = b"/" * 101  # a prefix no 100-byte name field starts with
_SLASH, _NEWLINE = 0x2F, 0x0A
_REMEMBERED = 64  # names remembered per reader and kind: a hostile shard cannot grow them
_PAX = 0x78  # 'x'
# PAX keywords that name nothing a sample holds: a header of only these changes nothing
# (._tarheaders.chain_effects), as tarfile (and so webdataset's TarWriter) writes one for
# a fractional mtime, and GNU tar's posix format for its times.
_NOOP_KEYWORDS = frozenset((b"mtime", b"atime", b"ctime", b"uid", b"gid", b"uname", b"gname"))
_PROBE = 32  # members read header by header before a range is judged
_DENSE = 4096  # bytes per member, on average, under which a range gets a table
_UNBOUNDED = 1 << 62

# A chunk's records: the native walk's compact table (``_tarwalk.Records``, which reads as
# the list of tuples it replaces), or that list where the walk is the Python one.
Records: TypeAlias = "list[Record] | _tarwalk.Records"
# The member a range's end cuts, named by the walk: its field name, its size and where its
# data begins (relative to the range).
Cut = tuple[str, int, int]
Walked = tuple[int, Pending | None, Records, bool, Cut | None]


def _native() -> ModuleType | None:
    """The extension, or None where it was not built (a source tree never installed: the
    Python walk then reads every range, as exactly and more slowly)."""
    try:
        # Not `from ._tarwalk import walk`: with no .py to find, grimp reads it as `asyncstream`.
        from . import _tarwalk
    except ImportError:
        return None
    return _tarwalk


_TARWALK = _native()
_NATIVE_WALK: Callable[[memoryview, int, int, int, int, Pending | None], Walked] | None = (
    None if _TARWALK is None else _TARWALK.walk
)
# Whether RangeWalker.walk is the native one (and a chunk's records its table); tests set
# it to compare the two.
NATIVE = _NATIVE_WALK is not None and os.environ.get("ASYNCSTREAM_NATIVE", "1") != "0"


def new_records() -> Records:
    """An empty collection of a chunk's records: the native table where the walk is native
    (the walk's records are added to it with no tuple per sample), else a list."""
    if NATIVE and _TARWALK is not None:
        records: _tarwalk.Records = _TARWALK.Records()
        return records
    return []


class Member:
    """A member's bytes gathered across ranges: the reference of ``_tarwalk.Member``
    (``_member.c``), which copies each part into the bytes object it hands out, where
    this keeps the parts and joins them."""

    __slots__ = ("_parts", "_size", "missing")

    def __init__(self, size: int) -> None:
        if size < 0:
            raise ValueError(f"a member of {size} bytes")
        self._parts: list[bytes] | None = []
        self._size = size
        self.missing = size  # bytes the member still lacks

    def add(self, data: memoryview | bytes) -> bool:
        """Copy ``data`` in after the bytes added so far; True once the member is full."""
        if self._parts is None:
            raise ValueError("the member was taken")
        if len(data) > self.missing:
            raise ValueError(f"{len(data)} bytes for a member with {self.missing} left")
        self._parts.append(bytes(data))
        self.missing -= len(data)
        return self.missing == 0

    def take(self) -> bytes:
        """The member's bytes, once full; it holds nothing after."""
        if self._parts is None:
            raise ValueError("the member was taken")
        if self.missing:
            raise ValueError(
                f"the member has {self._size - self.missing} of its {self._size} bytes"
            )
        parts, self._parts = self._parts, None
        return b"".join(parts)


def new_member(size: int) -> Member | _tarwalk.Member:
    """A member of ``size`` bytes to gather across ranges: native where the walk is."""
    if NATIVE and _TARWALK is not None:
        member: _tarwalk.Member = _TARWALK.Member(size)
        return member
    return Member(size)


def native_deliver() -> Callable[..., tuple[int, bool, BaseException | None]] | None:
    """``_tarwalk.deliver``, ``take``'s loop in C (see ``_records.c``), where the walk is
    native; None where the Python loop is to run."""
    if NATIVE and _TARWALK is not None:
        deliver: Callable[..., tuple[int, bool, BaseException | None]] = _TARWALK.deliver
        return deliver
    return None


def native_dicts() -> Callable[..., list[dict[str, Any]]] | None:
    """``_tarwalk.dicts``, ``Emit.run``'s loop in C (see ``_records.c``), where the walk is
    native; None where the Python loop is to run."""
    if NATIVE and _TARWALK is not None:
        dicts: Callable[..., list[dict[str, Any]]] = _TARWALK.dicts
        return dicts
    return None


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


def _joined(prefix: bytes, name: bytes) -> bytes:
    """A ustar name field after its prefix field, each up to its first NUL."""
    cut = prefix.find(0)
    head = prefix if cut < 0 else prefix[:cut]
    cut = name.find(0)
    return head + b"/" + (name if cut < 0 else name[:cut])


class RangeWalker:
    """The walks of one range fed: :meth:`walk` from each header the general parser
    leaves off at. Made per range; it holds the range only while the range is fed.

    Args:
        data: the range; ``doff`` is its offset in the shard.
        limit: bytes of ``data`` to use (a header or member data past it is not read).
        stop: the shard's end, relative to ``data``.
        names: the reader's memory of names, filled as they are met.
    """

    def __init__(self, data: memoryview, doff: int, limit: int, stop: int, names: Names) -> None:
        self.data, self.doff, self.limit, self.stop, self.names = data, doff, limit, stop, names
        self._table: HeaderTable | None = None
        self._judged = False  # whether the range was judged dense enough for a table

    def walk(self, rel: int, pending: Pending | None) -> Walked:
        """Read the run of plain members at ``rel`` (relative to the range).

        Returns:
            ``(rel, pending, records, again, cut)``: the header the walk stopped at, the
            sample then in progress, the samples completed, whether to walk again in this
            range (not after a header the check refused), and ``(field name, size, data
            start)`` where the entry at ``rel`` is a plain member whose data the range's end
            cuts inside the shard: its sample is then the one in progress (without its
            field).
        """
        if NATIVE and _NATIVE_WALK is not None:
            return _NATIVE_WALK(self.data, rel, self.limit, self.stop, self.doff, pending)
        rel, pending, records, again = self._walk(rel, pending)
        found = self._cut_at(rel) if again else None
        if found is not None:
            name, size, start = found
            after, named, more = self._group([(name, start, start, rel)], start, pending)
            if after == start and named is not None:  # named as an empty member: taken off
                return rel, named, records + more, True, (named[2].pop()[0], size, start)
        return rel, pending, records, again, None

    def _cut_at(self, rel: int) -> tuple[bytes, int, int] | None:
        """The name field, the size and the data's start of the member whose entry begins
        at ``rel``, where its header is plain (after a no-op PAX header or none) and the
        range's end cuts its data inside the shard."""
        data = self.data
        head = self._own_header(rel) if rel + 512 <= self.limit else None
        if head is None:
            return None
        name, digits, flag, prefix = _HEAD.unpack_from(data, head)
        if flag not in _PLAIN or first_bad(data, [head]) == 0:
            return None
        size = int(digits, 8)  # first_bad: 11 octal digits
        start = head + 512
        if start + size <= self.limit or start + ((size + 511) & -512) > self.stop:
            return None
        if prefix:
            name = _joined(data[head + 345 : head + 500].tobytes(), name)
        return name, size, start

    def _walk(
        self, rel: int, pending: Pending | None
    ) -> tuple[int, Pending | None, list[Record], bool]:
        """:meth:`walk` but the cut."""
        table = self._table
        if table is None:
            if self._judged:
                return self._scanned(rel, pending, _UNBOUNDED)
            return self._probe(rel, pending)
        i, j, after = table.run(rel)
        if i == j:
            return self._scanned(rel, pending, _UNBOUNDED)
        if j - i >= _targroup.VECTOR_MIN:
            grouped = _targroup.group_run(
                table.name_fields(i, j),
                table.starts[i:j],
                table.stops[i:j],
                self.doff,
                after,
                pending,
                self._group,
                _extension,
            )
            if grouped is not None:
                return (*grouped, True)
        starts = table.starts[i:j]
        members = zip(
            table.names(i, j), starts, table.stops[i:j], [s - 512 for s in starts], strict=True
        )
        return (*self._group(members, after, pending), True)

    def _probe(
        self, rel: int, pending: Pending | None
    ) -> tuple[int, Pending | None, list[Record], bool]:
        """The first members of the range header by header; then, if they show a range of
        small members, the rest by the range's table (:mod:`._tarbulk`), whose cost goes
        with the range's size: it pays where members average under 8 blocks. Otherwise
        the scan goes on, and the whole run is checked at once."""
        names, starts, stops, heads, entries, after = self._scan(rel, _PROBE)
        if len(heads) == _PROBE:  # else the scan stopped early: a later walk judges
            self._judged = True
            if after - rel > _PROBE * _DENSE:
                more = self._scan(after, _UNBOUNDED)
                names, starts, stops = names + more[0], starts + more[1], stops + more[2]
                heads, entries = heads + more[3], entries + more[4]
                after = more[5]
            else:
                rel, pending, records, again = self._checked(
                    names, starts, stops, heads, entries, after, pending
                )
                if again and rel == after and rel + 512 <= self.limit:
                    self._table = HeaderTable.of(self.data, rel, self.limit, self.stop)
                    if self._table is not None:
                        rel, pending, more_records, again = self._walk(rel, pending)
                        records += more_records
                return rel, pending, records, again
        return self._checked(names, starts, stops, heads, entries, after, pending)

    def _scanned(
        self, rel: int, pending: Pending | None, most: int
    ) -> tuple[int, Pending | None, list[Record], bool]:
        """:meth:`walk` header by header, for ``most`` members at most."""
        return self._checked(*self._scan(rel, most), pending)

    def _checked(
        self,
        names: list[bytes],
        starts: list[int],
        stops: list[int],
        heads: list[int],
        entries: list[int],
        after: int,
        pending: Pending | None,
    ) -> tuple[int, Pending | None, list[Record], bool]:
        """The members :meth:`_scan` found, up to the first that the check refuses,
        grouped; returns as :meth:`walk` does."""
        bad = first_bad(self.data, heads)
        if bad < len(heads):
            after = entries[bad]
        members = zip(names[:bad], starts[:bad], stops[:bad], entries[:bad], strict=True)
        return (*self._group(members, after, pending), bad == len(heads))

    def _scan(
        self, rel: int, most: int
    ) -> tuple[list[bytes], list[int], list[int], list[int], list[int], int]:
        """The run of plain-looking headers from ``rel``, one by one and ``most`` at most:
        name fields (with their prefix), data starts and stops, the headers (which
        :func:`~._tarbulk.first_bad` must accept), where each entry begins (its header,
        or a no-op PAX header before it: :meth:`_pax_member`) and the entry after the run."""
        data, limit, stop = self.data, self.limit, self.stop
        names: list[bytes] = []
        starts: list[int] = []
        stops: list[int] = []
        heads: list[int] = []
        entries: list[int] = []
        unpack = _HEAD.unpack_from
        try:
            for _ in range(most):
                if rel + 512 > limit:
                    break
                head = self._own_header(rel)
                if head is None:
                    break
                name, digits, flag, prefix = unpack(data, head)
                if flag not in _PLAIN:
                    break
                size = int(digits, 8)  # anything but digits: ValueError, the scan ends
                start = head + 512
                after = start + ((size + 511) & -512)
                if start + size > limit or after > stop:
                    break
                if prefix:  # ustar's name prefix, joined as tarfile joins it
                    name = _joined(data[head + 345 : head + 500].tobytes(), name)
                names.append(name)
                starts.append(start)
                stops.append(start + size)
                heads.append(head)
                entries.append(rel)
                rel = after
        except ValueError:
            pass
        return names, starts, stops, heads, entries, rel

    def _own_header(self, rel: int) -> int | None:
        """The header of the member whose entry begins at ``rel`` (inside the range): the
        header there, or the one after a no-op PAX header (:meth:`_pax_member`); ``None``
        where the general parser reads the entry."""
        return self._pax_member(rel) if self.data[rel + 156] == _PAX else rel

    def _pax_member(self, rel: int) -> int | None:
        """The header of the member after the PAX header at ``rel``, where that header is
        plain (:func:`~._tarbulk.first_bad`), holds one block of records at most, all of
        keywords that change nothing a sample holds (:data:`_NOOP_KEYWORDS`, as
        :func:`~._tarheaders.pax_records` reads them), and the member's header is in the
        range: the member is then read as if the PAX header were not there, its entry
        (and so its sample) beginning at ``rel``. ``None``: the general parser reads it."""
        data = self.data
        if first_bad(data, [rel]) == 0:
            return None
        size = int(bytes(data[rel + 124 : rel + 135]), 8)
        head = rel + 512 + ((size + 511) & -512)
        if size > 512 or head + 512 > self.limit:
            return None
        try:
            records = pax_records(data[rel + 512 : rel + 512 + size].tobytes())
        except ValueError:
            return None
        keywords = {k.encode("utf-8", "surrogateescape") for k, _ in records}
        return head if keywords <= _NOOP_KEYWORDS else None

    def _group(
        self,
        members: Iterable[tuple[bytes, int, int, int]],
        after: int,
        pending: Pending | None,
    ) -> tuple[int, Pending | None, list[Record]]:
        """Name and group ``members`` (name field, data start and stop, where its entry
        begins; ``after``: the entry after the last) as far as they are plain; returns as
        :meth:`walk` does."""
        data, doff = self.data, self.doff
        records: list[Record] = []
        if pending is None:
            key, offset, fields, current, dotted = "", -1, [], None, _NEVER
        else:
            key, offset, fields = pending[0], pending[1], list(pending[2])  # kept if refused
            current = key.encode("utf-8", "surrogateescape")
            dotted = current + b"."
        owned = offset < doff  # a sample carried into this range keeps owning its bytes
        seen = [f[0] for f in fields]
        extensions, siblings = self.names.extensions, self.names.siblings
        match, cut = _NAME.match, len(dotted)
        for name, start, end, entry in members:
            ext = None
            if name.startswith(dotted):  # the next member of the current sample, likely
                tail = name[cut:]
                ext = siblings.get(tail)
                if ext is None and tail not in siblings and len(siblings) < _REMEMBERED:
                    ext = siblings[tail] = _sibling(tail)
            if ext is not None:
                if ext in seen:
                    return entry, _pending(current, key, offset, fields), records
            else:
                parts = match(name)
                if parts is None:
                    return entry, _pending(current, key, offset, fields), records
                head, tail = parts.groups()
                ext = extensions.get(tail)
                if ext is None:
                    if tail not in extensions:
                        ext = _extension(tail)
                        if len(extensions) < _REMEMBERED:
                            extensions[tail] = ext
                    if ext is None:
                        return entry, _pending(current, key, offset, fields), records
                if head != current:
                    if current is not None:
                        records.append((key, offset, *fields))
                    key = head.decode("utf-8", "surrogateescape")
                    current, dotted, offset, fields, seen = (
                        head,
                        head + b".",
                        doff + entry,
                        [],
                        [],
                    )
                    cut, owned = len(dotted), False
                elif ext in seen:  # a duplicate: the general parser names it
                    return entry, _pending(current, key, offset, fields), records
            seen.append(ext)
            if owned:
                fields.append((ext, 0, 0, data[start:end].tobytes()))
            else:
                fields.append((ext, start, end, None))
        return after, _pending(current, key, offset, fields), records


def _pending(current: bytes | None, key: str, offset: int, fields: list[Field]) -> Pending | None:
    return None if current is None else (key, offset, fields)
