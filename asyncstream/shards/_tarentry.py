"""One tar entry, read as Python's :mod:`tarfile` reads it: the general parser.

:class:`EntryParser` is the part of :class:`~._tar.ShardReader` that reads the entry at
one header (its extended headers, GNU sparse headers and long names included) out of the
bytes the reader holds: the range being fed and the carry of earlier ones. Every rule
about what a member is, how it is named and what makes a tar corrupt lives here (with
:mod:`._tarheaders`, :mod:`._sparse` and :mod:`._members`); the reader only groups the
members into samples and keeps the carry. The fast path for runs of plain members
(:mod:`._tarfast`) hands every header it cannot vouch for to :meth:`EntryParser._entry`.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from .._exceptions import CorruptTarError
from ._limits import ReadLimits
from ._members import decode_name, sample_member
from ._sparse import SparseMap, expand, gnu_extension, gnu_header, map_10
from ._tarheaders import ChainEffects, chain_effects, checksum_error, size_field

__all__ = ["BLOCK", "EMPTY", "Entry", "EntryParser", "looks_compressed"]

BLOCK = 512
_MAX_META = 1 << 20  # largest PAX / GNU long-name record accepted
_MAX_META_HEADERS = 16  # extended headers allowed in front of one member
_REGULAR = frozenset(b"07\0")
_SPARSE = 0x53  # 'S'
_GLOBAL = 0x67  # 'g'
_NO_DATA = frozenset(b"123456")  # links, devices, directories, fifos: size is not data
_META = frozenset(b"LKxXg")
EMPTY = memoryview(b"")
_END = (None, "", 0, 0, -1, None)
# Magic numbers of compressed files, named in the error when a shard starts with one.
_COMPRESSED = (
    (b"\x1f\x8b", "gzip", ".tar.gz"),
    (b"BZh", "bzip2", ".tar.bz2"),
    (b"\xfd7zXZ\0", "xz", ".tar.xz"),
    (b"(\xb5/\xfd", "zstd", ".tar.zst"),
)
# Magic numbers of other files that end up named as shards.
_NOT_TAR = (
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"PK\x03\x04", "a zip archive"),
    (b"GIF8", "a GIF image"),
    (b"RIFF", "a RIFF file (WebP, WAV)"),
)


@dataclass(slots=True)
class _Sparse:
    """A sparse member: its map (``None``: PAX 1.0, at the start of its data) and size."""

    regions: SparseMap | None
    size: int
    name: str


# (key or None to skip, extension, data start, data size, next header or -1, sparse)
Entry = tuple[str | None, str, int, int, int, _Sparse | None]


def looks_compressed(head: bytes | memoryview) -> str:
    """``"; the shard looks gzip-compressed: ..."`` if ``head`` starts like a compressed
    file, ``"; not a tar (looks like a JPEG image) ..."`` if like another kind of file
    (an image, a zip), else ``""``: the hint added to the error for a plain-named shard."""
    start = bytes(head[:8])
    for magic, kind, suffix in _COMPRESSED:
        if start.startswith(magic):
            return (
                f"; the shard looks {kind}-compressed: name it {suffix} (compression is "
                "read from the name), or decompress it"
            )
    for magic, kind in _NOT_TAR:
        if start.startswith(magic):
            return f"; not a tar (looks like {kind}): a file named as a shard by mistake?"
    return ""


def _pad(size: int) -> int:
    return (size + BLOCK - 1) & -BLOCK


class EntryParser:
    """Reads one entry of a shard at a time out of ``_carry`` + ``_data``.

    Attributes:
        url: the shard, named in errors.
        size: the shard's size (a very large number while it is not known).
        limits: what a member or sample may hold (:mod:`._limits`): a member declared
            larger than ``limits.max_sample_bytes`` (a sparse one: stored or expanded) is
            refused at its header, before any of its bytes is kept or expanded.
    """

    def __init__(self, url: str, size: int, limits: ReadLimits) -> None:
        self.url = url
        self.size = size
        self.limits = limits
        self._max = limits.max_sample_bytes
        self._carry = bytearray()  # shard bytes before _doff that a later header needs
        self._data = EMPTY  # the range being fed, only while it is
        self._doff = 0  # the offset of _data in the shard

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
            return self._data[pos - doff : pos - doff + BLOCK].tobytes()
        return bytes(self._get(pos, pos + BLOCK))

    def _entry(self, pos: int, end: int) -> Entry | None:
        """Parse the entry at ``pos`` (extended headers included) if its headers are resident.

        Returns:
            ``(key, extension, data_start, data_size, next_header, sparse)``: ``key`` is
            None for an entry to skip, ``next_header`` is -1 at the end-of-archive marker.
            ``None`` when the headers (not the member data) are not all resident yet.
        """
        group = pos
        chain: list[tuple[int, bytes]] | None = None
        while pos + BLOCK <= end:
            doff = self._doff
            if pos >= doff:
                h = self._data[pos - doff : pos - doff + BLOCK].tobytes()
            else:
                h = bytes(self._get(pos, pos + BLOCK))
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
            start = pos + BLOCK
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
                if flag == _GLOBAL and pos - _pad(size) - BLOCK == group:
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
                after = start + ((size + BLOCK - 1) & -BLOCK)
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
                        if size > self._max:
                            raise self._too_large(pos, name, size)
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
    ) -> Entry | None:
        """The entry of the member header ``h`` at ``pos``, after the extended headers
        ``chain`` that begin at ``group``."""
        start = pos + BLOCK
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
                    if start + BLOCK > end:
                        return None
                    more, extended = gnu_extension(self._header(start))
                    sparse += more
                    start += BLOCK
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
        if (real or 0) > self._max:  # refused before a byte of it is expanded
            raise self._too_large(group, name, real or 0, "expands to")
        return key, ext, start, size, after, _Sparse(sparse, real or 0, name)

    def _named(self, name: str, start: int, size: int, after: int, group: int) -> Entry:
        """The entry of a regular member named ``name`` (:func:`._members.sample_member`)."""
        member = sample_member(name)
        if member is None:
            return None, "", start, size, after, None
        key, ext = member
        if ext in ("__key__", "__url__"):
            raise self._corrupt(group, f"member {name!r} is named like the sample's {ext}")
        if size > self._max:
            raise self._too_large(group, name, size)
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

    def _too_large(self, offset: int, name: str, size: int, verb: str = "holds") -> CorruptTarError:
        """The error for a member larger than a sample may be."""
        return self._corrupt(
            offset,
            f"member {name!r} {verb} {size} bytes, more than a sample may hold "
            f"({self._max} bytes: max_sample_bytes)",
        )

    def _corrupt(self, offset: int, what: str) -> CorruptTarError:
        return CorruptTarError(
            f"{self.url}: corrupt tar at byte {offset}: {what}", url=self.url, offset=offset
        )
