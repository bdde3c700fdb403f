"""Tar members and samples in the webdataset layout.

A sample is the group of consecutive tar members sharing a key: the member's path up
to the first dot of its basename (``train/000017.jpg`` and ``train/000017.cls`` form the
sample ``train/000017`` with the fields ``jpg`` and ``cls``).

:class:`ShardReader` indexes a shard incrementally as its byte ranges arrive, in place.

Carry / zero-copy contract:

* ``feed(data, offset)`` returns every sample that is complete after this range. A sample
  whose member data lie entirely inside ``data`` gets ``memoryview`` slices of ``data``
  (no copy); they stay valid only as long as the caller keeps ``data``'s buffer alive.
* When ``feed`` returns, the reader holds no reference into ``data``: the sample still in
  progress (always the last one of a non-final range, whose end is only known from the next
  header) has its fields copied to ``bytes``, and the unparsed tail (a split header, a member
  larger than a range) is copied into a reader-owned ``bytearray`` carry. Samples that were
  carried come back with ``bytes`` fields; only those samples are ever copied.
* :attr:`ShardReader.pending_offset` is a header boundary from which a new reader can resume.

Formats: ustar (with its name prefix), GNU (``L``/``K`` long names, base-256 sizes) and PAX
(``x`` records ``path`` and ``size``; ``g`` is parsed and ignored). Only regular files
(``0``, ``\0``, ``7``) are members; directories, links, devices, fifos and unknown types are
skipped. Checksums are accepted summed unsigned or signed, like ``tarfile``; the byte sums use
``zlib.adler32`` (C speed, and exact: 256 bytes never reach its modulus). Numeric fields that
a sample does not need (mode, uid, mtime, ...) are not parsed. Any malformation is a
:class:`CorruptTarError` naming the shard and the offset of the offending header.
"""

from __future__ import annotations

import posixpath
import zlib
from dataclasses import dataclass
from typing import IO

from ._exceptions import CorruptTarError

__all__ = ["Sample", "ShardReader", "check_not_empty", "count_samples", "split_member_name"]

_BLOCK = 512
_MAX_META = 1 << 20  # largest PAX / GNU long-name record accepted
_MAX_META_HEADERS = 16  # extended headers allowed in front of one member
_REGULAR = frozenset(b"07\0")
_NO_DATA = frozenset(b"123456")  # links, devices, directories, fifos: size is not data
_META = frozenset(b"LKxg")
_GNU_MAGIC = b"ustar  \0"
_HIGH = bytes(range(128, 256))
_EMPTY = memoryview(b"")
_END = (None, "", 0, 0, -1)
# Magic numbers of compressed files, named in the error when a shard starts with one.
_COMPRESSED = (
    (b"\x1f\x8b", "gzip"),
    (b"BZh", "bzip2"),
    (b"\xfd7zXZ\0", "xz"),
    (b"(\xb5/\xfd", "zstd"),
)


@dataclass(slots=True)
class Sample:
    """One webdataset sample.

    Attributes:
        key: member path up to the first dot of the basename.
        fields: extension (``"jpg"``, ``"seg.png"``) to data; ``memoryview`` into the fed
            range when the sample lay inside it, else ``bytes``.
        offset: absolute byte offset in the shard of the sample's first header.
    """

    key: str
    fields: dict[str, memoryview | bytes]
    offset: int


def split_member_name(name: str) -> tuple[str, str]:
    """Split a member name into ``(key, extension)`` by the webdataset convention.

    Example: ``"a/b/000017.seg.png"`` gives ``("a/b/000017", "seg.png")``.
    """
    folder, base = posixpath.split(name)
    stem, dot, ext = base.partition(".")
    key = posixpath.join(folder, stem) if folder else stem
    return key, ext if dot else ""


def _cut(field: bytes) -> bytes:
    end = field.find(0)
    return field if end < 0 else field[:end]


def _octal(field: bytes) -> int:
    """Parse a NUL/space padded octal field; ``ValueError`` if it is not one."""
    digits = _cut(field).strip(b" ")
    if not digits:
        return 0
    if not digits.isdigit():
        raise ValueError(field)
    return int(digits, 8)


def _size_field(h: bytes) -> int:
    """Parse an unusual size field: other octal spellings, or positive base-256."""
    if h[124] == 0x80:
        return int.from_bytes(h[125:136], "big")
    if h[124] & 0x80:
        raise ValueError("negative or bad base-256 size")
    return _octal(h[124:136])


def _pad(size: int) -> int:
    return (size + _BLOCK - 1) & -_BLOCK


class ShardReader:
    """Incremental, zero-copy reader of one tar shard fed as consecutive byte ranges.

    Args:
        url: the shard, named in errors.
        size: the shard's size in bytes.
        start: absolute offset of the first header to read: 0, or a value of
            :attr:`pending_offset` reported by an earlier reader of the same shard.
    """

    def __init__(self, url: str, size: int, start: int = 0) -> None:
        if size < 0 or not 0 <= start <= size or start % _BLOCK:
            raise ValueError(f"{url}: bad start {start} for a shard of {size} bytes")
        self.url = url
        self.size = size
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
            key, ext, start, size, after = entry
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
            if pending.offset >= doff:  # the whole sample is in data: zero copy
                pending.fields[ext] = data[start - doff : start - doff + size]
            else:  # a carried sample is all bytes
                pending.fields[ext] = bytes(self._get(start, start + size))
            pos = after
        if final and not self._done:
            if pos < self.size:
                raise self._corrupt(pos, "shard ends inside this entry (truncated)")
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

    def _entry(self, pos: int, end: int) -> tuple[str | None, str, int, int, int] | None:
        """Parse the entry at ``pos`` (extended headers included) if its headers are resident.

        Returns:
            ``(key, extension, data_start, data_size, next_header)``: ``key`` is None for an
            entry to skip, ``next_header`` is -1 at the end-of-archive marker. ``None`` when
            the headers (not the member data) are not all resident yet.
        """
        group, long_name, pax_path, pax_size, metas = pos, b"", "", -1, 0
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
                self._check(h, unsigned, pos)
            flag, digits = h[156], h[124:135]
            try:
                size = int(digits, 8) if h[135] == 0 and digits.isdigit() else _size_field(h)
            except ValueError:
                raise self._corrupt(pos, f"bad size field {h[124:136]!r}") from None
            start = pos + _BLOCK
            if flag in _META:
                if size > _MAX_META or start + _pad(size) > self.size:
                    raise self._corrupt(pos, f"bad extended header size {size} (limit 1 MiB)")
                metas += 1
                if metas > _MAX_META_HEADERS:
                    raise self._corrupt(group, "too many extended headers in a row")
                if start + size > end:
                    return None
                payload = bytes(self._get(start, start + size))
                if flag == 0x4C:  # 'L': GNU long name
                    long_name = _cut(payload)
                elif flag != 0x4B:  # 'x' or 'g' PAX ('K', a long link name, is ignored)
                    path, psize = self._pax(payload, pos)
                    if flag == 0x78:
                        pax_path = path or pax_path
                        pax_size = psize if psize >= 0 else pax_size
                if flag == 0x67 and pos == group:  # a lone global header is an entry of its own
                    return None, "", start, 0, start + _pad(size)
                pos = start + _pad(size)
                continue
            if flag in _NO_DATA:
                return None, "", start, 0, start
            if pax_size >= 0:
                size = pax_size
            after = start + ((size + _BLOCK - 1) & -_BLOCK)
            if after > self.size:
                raise self._corrupt(pos, f"member of {size} bytes runs past the end of the shard")
            if flag not in _REGULAR:
                return None, "", start, size, after
            if pax_path:
                name = pax_path
            else:
                if long_name:
                    raw = long_name
                else:
                    cut = h.find(0, 0, 100)
                    raw = h[:cut] if cut >= 0 else h[:100]
                    if h[345] and h[257:265] != _GNU_MAGIC:  # ustar prefix
                        raw = _cut(h[345:500]) + b"/" + raw
                try:
                    name = raw.decode()
                except UnicodeDecodeError:
                    raise self._corrupt(group, f"member name {raw!r} is not valid UTF-8") from None
            if flag == 0 and name.endswith("/"):
                return None, "", start, 0, start  # old-style directory
            if "//" in name:
                return (*split_member_name(name), start, size, after)
            dot = name.find(".", name.rfind("/") + 1)
            if dot < 0:
                return name, "", start, size, after
            return name[:dot], name[dot + 1 :], start, size, after
        return None

    def _check(self, h: bytes, unsigned: int, pos: int) -> None:
        """Raise unless the stored checksum matches the unsigned or signed sum."""
        field = h[148:156]
        try:
            stored = _octal(field)
        except ValueError:
            stored = -1
        if stored == unsigned:
            return
        high = len(h) - len(h.translate(None, _HIGH)) - 8 + len(field.translate(None, _HIGH))
        if stored != unsigned - 256 * high:
            what = f"header checksum mismatch (stored {field!r})"
            for magic, kind in _COMPRESSED if pos == 0 else ():
                if h.startswith(magic):
                    what += f"; the shard looks {kind}-compressed, only plain tars are read"
            raise self._corrupt(pos, what)

    def _pax(self, payload: bytes, pos: int) -> tuple[str, int]:
        """Parse PAX records; return their ``path`` ("" if none) and ``size`` (-1 if none)."""
        path, size, i, n = "", -1, 0, len(payload)
        while i < n and payload[i]:
            space = payload.find(b" ", i, i + 21)
            length = payload[i:space]
            if space < 0 or not length.isdigit() or i + int(length) > n:
                raise self._corrupt(pos, "malformed PAX record")
            stop = i + int(length)
            equal = payload.find(b"=", space + 1, stop)
            if equal <= space + 1 or payload[stop - 1] != 0x0A:
                raise self._corrupt(pos, "malformed PAX record")
            keyword, value = payload[space + 1 : equal], payload[equal + 1 : stop - 1]
            if keyword == b"path":
                try:
                    path = value.decode()
                except UnicodeDecodeError:
                    raise self._corrupt(pos, f"PAX path {value!r} is not valid UTF-8") from None
            elif keyword == b"size":
                if not value.isdigit() or len(value) > 20:
                    raise self._corrupt(pos, f"bad PAX size {value!r}")
                size = int(value)
            i = stop
        return path, size

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


def count_samples(fileobj: IO[bytes], url: str, size: int, *, block: int = 8 << 20) -> int:
    """Count the samples of a shard read front to back, with the same reader as the stream.

    Args:
        fileobj: the tar bytes, e.g. an S3 response body.
        url: the shard, named in errors.
        size: the shard's size in bytes.
        block: bytes read at a time.

    Raises:
        CorruptTarError: the bytes are not a well-formed tar (with the offset), the
            stream ends before ``size`` bytes, or the shard is empty (0 bytes).
    """
    check_not_empty(url, size)
    reader = ShardReader(url, size)
    count = offset = 0
    while offset < size:
        data = fileobj.read(min(block, size - offset))
        if not data:
            raise CorruptTarError(
                f"{url}: the shard ended after {offset} of {size} bytes", url=url, offset=offset
            )
        count += len(reader.feed(data, offset, final=offset + len(data) == size))
        offset += len(data)
        if reader.done:
            break
    return count
