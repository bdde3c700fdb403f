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
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from .._exceptions import CorruptTarError
from ._members import decode_name, sample_member
from ._sparse import SparseMap, expand, gnu_extension, gnu_header, map_10
from ._tarheaders import ChainEffects, chain_effects, checksum_error, size_field

__all__ = ["Sample", "ShardReader", "check_not_empty", "looks_compressed"]

_BLOCK = 512
_MAX_META = 1 << 20  # largest PAX / GNU long-name record accepted
_MAX_META_HEADERS = 16  # extended headers allowed in front of one member
_REGULAR = frozenset(b"07\0")
_SPARSE = 0x53  # 'S'
_GLOBAL = 0x67  # 'g'
_NO_DATA = frozenset(b"123456")  # links, devices, directories, fifos: size is not data
_META = frozenset(b"LKxXg")
_EMPTY = memoryview(b"")
_UNBOUNDED = 1 << 62  # the size of a shard whose size is known only at its end
_END = (None, "", 0, 0, -1, None)
# Magic numbers of compressed files, named in the error when a shard starts with one.
_COMPRESSED = (
    (b"\x1f\x8b", "gzip", ".tar.gz"),
    (b"BZh", "bzip2", ".tar.bz2"),
    (b"\xfd7zXZ\0", "xz", ".tar.xz"),
    (b"(\xb5/\xfd", "zstd", ".tar.zst"),
)


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


@dataclass(slots=True)
class _Sparse:
    """A sparse member: its map (``None``: PAX 1.0, at the start of its data) and size."""

    regions: SparseMap | None
    size: int
    name: str


# (key or None to skip, extension, data start, data size, next header or -1, sparse)
_Entry = tuple[str | None, str, int, int, int, _Sparse | None]


def looks_compressed(head: bytes | memoryview) -> str:
    """``"; the shard looks gzip-compressed: ..."`` if ``head`` starts like a compressed
    file, else ``""``: the hint added to the error for a plain-named shard."""
    for magic, kind, suffix in _COMPRESSED:
        if bytes(head[: len(magic)]) == magic:
            return (
                f"; the shard looks {kind}-compressed: name it {suffix} (compression is "
                "read from the name), or decompress it"
            )
    return ""


def _pad(size: int) -> int:
    return (size + _BLOCK - 1) & -_BLOCK


class ShardReader:
    """Incremental, zero-copy reader of one tar shard fed as consecutive byte ranges.

    Args:
        url: the shard, named in errors.
        size: the shard's size in bytes, or ``None`` if it is known only when the final
            range arrives (a decompressed stream).
        start: absolute offset of the first header to read: 0, or a value of
            :attr:`pending_offset` reported by an earlier reader of the same shard.
    """

    def __init__(self, url: str, size: int | None, start: int = 0) -> None:
        bound = _UNBOUNDED if size is None else size
        if bound < 0 or not 0 <= start <= bound or start % _BLOCK:
            raise ValueError(f"{url}: bad start {start} for a shard of {size} bytes")
        self.url = url
        self.size = bound
        self._open_ended = size is None
        self._next = start  # offset the next feed must start at
        self._pos = start  # next header not yet parsed (may lie ahead when skipping data)
        self._carry = bytearray()  # shard bytes [_pos, _next) when _pos < _next
        self._pending: Sample | None = None  # sample in progress, fields owned
        self._skipped = start  # header of the entry whose data _pos skips to
        self._done = False
        self._error: tuple[str, int] | None = None  # (message, offset) once corrupt
        self._data = _EMPTY  # the range being fed, only during feed()
        self._doff = start

    @property
    def pending_offset(self) -> int:
        """Absolute offset of the first header of the first sample not yet returned.

        It never lies past the bytes fed so far, so a new reader started there is fed
        from within (or at the end of) the data already seen.
        """
        if self._pending is not None:
            return self._pending.offset
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
        view = data if isinstance(data, memoryview) else memoryview(data)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        end = offset + len(view)
        if final and self._open_ended and offset == self._next:
            self.size = end
        if offset != self._next or end > self.size or (final and end != self.size):
            raise ValueError(
                f"{self.url}: range [{offset}, {end}) does not follow byte {self._next}"
                f" of a {self.size}-byte shard" + (" as its final range" if final else "")
            )
        if self._error is None:
            self._next = end
            out: list[Sample] = []
            if self._done:
                return out
            self._data, self._doff = view, offset
            try:
                self._run(out, end, final or end == self.size)
            except CorruptTarError as exc:
                self._error = str(exc), exc.offset
            finally:
                self._data = _EMPTY
            if self._error is None:
                return out
            # A fresh error: the first one's traceback holds frames whose locals view `data`.
            out.clear()
            self._pending, self._carry = None, bytearray()
        del view
        raise CorruptTarError(self._error[0], url=self.url, offset=self._error[1])

    def _run(self, out: list[Sample], end: int, final: bool) -> None:
        data, doff, pos, pending = self._data, self._doff, self._pos, self._pending
        while pos + _BLOCK <= end:
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
            if pending is None or pending.key != key:
                if pending is not None:
                    out.append(pending)
                pending = Sample(key, {}, pos)
            elif ext in pending.fields:
                raise self._corrupt(pos, f"duplicate field {ext!r} in sample {key!r}")
            if start + size > end:
                break
            if sparse is not None:
                pending.fields[ext] = self._expand(sparse, start, size, pos)
            elif pending.offset >= doff:  # the whole sample is in data: zero copy
                pending.fields[ext] = data[start - doff : start - doff + size]
            else:  # a carried sample is all bytes
                pending.fields[ext] = bytes(self._get(start, start + size))
            pos = after
        if final and not self._done:
            if pos < self.size and (self.size - pos >= _BLOCK or any(self._get(pos, self.size))):
                what = "shard ends inside this entry (truncated)"
                if pos == 0:
                    what += looks_compressed(self._get(0, min(8, self.size)))
                raise self._corrupt(pos, what)
            self._done = True
        if self._done:
            if pending is not None:
                out.append(pending)
            pending = None
            self._carry = bytearray()
        else:
            if pending is not None:
                for ext, value in pending.fields.items():
                    if isinstance(value, memoryview):
                        pending.fields[ext] = value.tobytes()
                        value.release()
            carry = self._carry
            if pos >= end:
                carry.clear()
            elif pos >= doff:
                carry[:] = data[pos - doff :]
            else:
                del carry[: len(carry) - (doff - pos)]
                carry += data
        self._pos, self._pending = pos, pending

    def _get(self, start: int, stop: int) -> memoryview | bytes:
        """Shard bytes ``[start, stop)`` out of carry + data: a view of data, else a copy."""
        doff = self._doff
        if start >= doff:
            return self._data[start - doff : stop - doff]
        carry = memoryview(self._carry)[start - doff + len(self._carry) :]
        if stop <= doff:
            return carry[: stop - start].tobytes()
        return b"".join((carry, self._data[: stop - doff]))

    def _header(self, pos: int) -> bytes:
        doff = self._doff
        if pos >= doff:
            return self._data[pos - doff : pos - doff + _BLOCK].tobytes()
        return bytes(self._get(pos, pos + _BLOCK))

    def _entry(self, pos: int, end: int) -> _Entry | None:
        """Parse the entry at ``pos`` (extended headers included) if its headers are resident.

        Returns:
            ``(key, extension, data_start, data_size, next_header, sparse)``: ``key`` is
            None for an entry to skip, ``next_header`` is -1 at the end-of-archive marker.
            ``None`` when the headers (not the member data) are not all resident yet.
        """
        group = pos
        chain: list[tuple[int, bytes]] | None = None
        while pos + _BLOCK <= end:
            doff = self._doff
            if pos >= doff:
                h = self._data[pos - doff : pos - doff + _BLOCK].tobytes()
            else:
                h = bytes(self._get(pos, pos + _BLOCK))
            total = (zlib.adler32(h[:256]) & 0xFFFF) + (zlib.adler32(h[256:]) & 0xFFFF) - 2
            if total == 0:
                if pos != group:
                    raise self._corrupt(pos, "extended header not followed by a member")
                return _END
            field = h[148:156]
            unsigned = total - sum(field) + 256
            if b"%06o\0 " % unsigned != field:  # not the usual spelling: parse it
                what = checksum_error(h, unsigned)
                if what is not None:
                    raise self._corrupt(pos, what + (looks_compressed(h) if pos == 0 else ""))
            flag, digits = h[156], h[124:135]
            try:
                size = int(digits, 8) if h[135] == 0 and digits.isdigit() else size_field(h)
            except ValueError:
                raise self._corrupt(pos, f"bad size field {h[124:136]!r}") from None
            start = pos + _BLOCK
            if flag in _META:
                if size > _MAX_META or start + _pad(size) > self.size:
                    raise self._corrupt(pos, f"bad extended header size {size} (limit 1 MiB)")
                if chain is None:
                    chain = []
                if len(chain) >= _MAX_META_HEADERS:
                    raise self._corrupt(group, "too many extended headers in a row")
                if start + size > end:
                    return None
                payload = bytes(self._get(start, start + size))
                pos = start + _pad(size)
                if flag == _GLOBAL and pos - _pad(size) - _BLOCK == group:
                    # A global header first in its entry is an entry of its own: what it
                    # may hold changes no member (see chain_effects), so it is checked only.
                    self._effects([(flag, payload)], group)
                    return None, "", start, 0, pos, None
                chain.append((flag, payload))
                continue
            if chain is None and flag in _REGULAR:  # the usual member: inline, for speed
                cut = h.find(0, 0, 100)
                raw = h[:cut] if cut >= 0 else h[:100]
                if flag == 0 and raw.endswith(b"/"):  # an old-style directory
                    return None, "", start, 0, start, None
                after = start + ((size + _BLOCK - 1) & -_BLOCK)
                if after > self.size:
                    raise self._corrupt(
                        pos, f"member of {size} bytes runs past the end of the shard"
                    )
                try:
                    name = raw.decode()
                except UnicodeDecodeError:
                    name = decode_name(raw)
                if h[345]:  # ustar prefix
                    cut = h.find(0, 345, 500)
                    name = (
                        h[345 : cut if cut >= 0 else 500].decode("utf-8", "surrogateescape")
                        + "/"
                        + name
                    )
                slash = name.rfind("/")
                dot = name.find(".", slash + 1)
                if dot > slash + 1 and name[0] != "_" and "\n" not in name:
                    ext = name[dot + 1 :].lower()
                    if ext[:1] != "_":
                        return name[:dot], ext, start, size, after, None
                return self._named(name, start, size, after, pos)
            return self._member(h, flag, size, pos, chain, group, end)
        return None

    def _member(
        self,
        h: bytes,
        flag: int,
        size: int,
        pos: int,
        chain: list[tuple[int, bytes]] | None,
        group: int,
        end: int,
    ) -> _Entry | None:
        """The entry of the member header ``h`` at ``pos``, after the extended headers
        ``chain`` that begin at ``group``."""
        start = pos + _BLOCK
        cut = h.find(0, 0, 100)
        raw = h[:cut] if cut >= 0 else h[:100]
        if flag in _NO_DATA or (flag == 0 and raw.endswith(b"/")):  # old-style directory
            return None, "", start, 0, start, None
        name = real = sparse = pax_size = None
        in_data = False
        if chain is not None:
            effects = self._effects(chain, group)
            name, real, sparse = effects.name, effects.real_size, effects.sparse
            in_data = effects.map_in_data
            pax_size = effects.size
            if pax_size is not None:
                size = pax_size
        if flag == _SPARSE:
            if sparse is not None or in_data or real is not None or pax_size is not None:
                raise self._corrupt(group, "a GNU sparse member with PAX size or sparse records")
            try:
                sparse, extended, real = gnu_header(h)
                while extended:
                    if start + _BLOCK > end:
                        return None
                    more, extended = gnu_extension(self._header(start))
                    sparse += more
                    start += _BLOCK
            except ValueError as exc:
                raise self._corrupt(group, f"bad GNU sparse header: {exc}") from None
        after = start + _pad(size)
        if after > self.size:
            raise self._corrupt(pos, f"member of {size} bytes runs past the end of the shard")
        if flag not in _REGULAR and flag != _SPARSE:
            return None, "", start, size, after, None  # unknown type: its data are skipped
        if name is None:
            name = decode_name(raw)
            if h[345] and flag != _SPARSE:  # ustar prefix (GNU sparse data there)
                cut = h.find(0, 345, 500)
                name = decode_name(h[345 : cut if cut >= 0 else 500]) + "/" + name
        if sparse is None and not in_data:
            return self._named(name, start, size, after, group)
        key, ext, *_ = self._named(name, start, size, after, group)
        if key is None:
            return None, "", start, size, after, None
        return key, ext, start, size, after, _Sparse(sparse, real or 0, name)

    def _named(self, name: str, start: int, size: int, after: int, group: int) -> _Entry:
        """The entry of a regular member named ``name`` (:func:`._members.sample_member`)."""
        member = sample_member(name)
        if member is None:
            return None, "", start, size, after, None
        key, ext = member
        if ext in ("__key__", "__url__"):
            raise self._corrupt(group, f"member {name!r} is named like the sample's {ext}")
        return key, ext, start, size, after, None

    def _effects(self, chain: list[tuple[int, bytes]], group: int) -> ChainEffects:
        try:
            return chain_effects(chain)
        except ValueError as exc:
            raise self._corrupt(group, str(exc)) from None

    def _expand(self, sparse: _Sparse, start: int, size: int, pos: int) -> bytes:
        """A sparse member's contents from its stored bytes ``[start, start + size)``."""
        stored = self._get(start, start + size)
        try:
            regions = sparse.regions
            if regions is None:
                regions, length = map_10(stored)
                stored = stored[length:]
            return expand(stored, regions, sparse.size)
        except ValueError as exc:
            raise self._corrupt(pos, f"sparse member {sparse.name!r}: {exc}") from None

    def _corrupt(self, offset: int, what: str) -> CorruptTarError:
        return CorruptTarError(
            f"{self.url}: corrupt tar at byte {offset}: {what}", url=self.url, offset=offset
        )


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
