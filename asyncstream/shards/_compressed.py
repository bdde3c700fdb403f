"""Compressed shards: ``.tar.gz`` / ``.tgz``, ``.tar.zst``, ``.tar.xz``, ``.tar.bz2``.

A compressed shard is fetched as any shard, chunk by chunk through the ring (and the disk
cache): its chunks are the stored, compressed bytes. :class:`CompressedReader` decompresses
them as a stream on the way into the tar reader (:class:`~._tar.ShardReader`), which sees
the tar's own bytes and offsets. The compression is read from the shard's name
(:func:`compression_of`); which decompressor runs is then decided by the first bytes
(gzip, bzip2, xz, zstd; a plain tar so named is read as it is), as Python's ``tarfile``
(``"r|*"``, webdataset's mode) does. Concatenated streams (``pigz``, ``pbzip2``, ``zstd``
frames, multi-stream ``xz``) are read one after the other; zero bytes after a stream are
padding.

**Resume.** A compressed stream cannot be entered in the middle: a reader that starts at
tar offset ``start > 0`` (a resume, a DataLoader worker's share) fetches the shard from its
first byte again and drops the decompressed bytes before ``start``. So the chunks of a
compressed shard are always numbered from its start, and resuming inside one re-reads it
up to that point (the state saved is the same as for a plain shard).

**Checks.** Every stream is decompressed to its end and its checksum verified (gzip's CRC-32
and length, bzip2's, xz's and zstd's where written), after the tar's end marker too; a
stream that is corrupt or cut short is a :class:`~asyncstream.CorruptTarError` naming the
shard and the compressed offset. What follows the last stream once the tar has ended is
ignored, as ``tarfile`` ignores it.

**Memory.** Decompressed bytes are produced at most 8 MiB per call (zstd's decompressor has
no output limit: its input is cut by its block headers, :mod:`._zstdblocks`), and a member
or sample larger than the reader's limit is refused at its header, before it is
decompressed (:mod:`._limits`); a lane holds its
chunk's decompressed bytes (about the compression ratio times ``chunk_bytes``) in process
memory, not in the ring, while its samples are resident.
"""

from __future__ import annotations

import bz2
import functools
import lzma
import zlib
from collections.abc import Callable, Generator, Iterator
from typing import IO, Any

import zstandard

from .._exceptions import CorruptTarError
from ._limits import ReadLimits
from ._tar import Record, Records, Sample, ShardReader, byte_view, check_not_empty, samples
from ._zstdblocks import ZstdCuts

__all__ = [
    "SHARD_SUFFIXES",
    "CompressedReader",
    "compression_of",
    "count_samples",
    "fetch_start",
    "is_shard_name",
    "open_reader",
    "unread_format",
]

# Shard names read, and the compression each says (None: a plain tar).
SHARD_SUFFIXES: dict[str, str | None] = {
    ".tar": None,
    ".tar.gz": "gzip",
    ".tgz": "gzip",
    ".tar.zst": "zstd",
    ".tar.zstd": "zstd",
    ".tzst": "zstd",
    ".tar.xz": "xz",
    ".txz": "xz",
    ".tar.bz2": "bzip2",
    ".tbz2": "bzip2",
    ".tbz": "bzip2",
}
# Tar archives in formats that are not read: named in a warning when a prefix holds one.
_UNREAD = (".tar.lz4", ".tlz4", ".tar.lz", ".tar.lzma", ".tlz", ".tar.z", ".taz", ".tar.br")
_MAGIC = (
    (b"\x1f\x8b", "gzip"),
    (b"BZh", "bzip2"),
    (b"\xfd7zXZ\0", "xz"),
    (b"(\xb5/\xfd", "zstd"),
)
_MAGIC_BYTES = 6  # enough to tell them apart
_OUT_LIMIT = 8 << 20  # decompressed bytes per call, at most


@functools.lru_cache(maxsize=1 << 16)  # asked for every lane and prefetch round
def compression_of(url: str) -> str | None:
    """The compression a shard's name says (``"gzip"``, ``"zstd"``, ``"xz"``,
    ``"bzip2"``), or ``None`` for a plain ``.tar`` (or any other name)."""
    for suffix, kind in SHARD_SUFFIXES.items():
        if kind is not None and url.endswith(suffix):
            return kind
    return None


def is_shard_name(url: str) -> bool:
    """Whether a listed object is a shard by its name (a tar, plain or compressed)."""
    return url.endswith(tuple(SHARD_SUFFIXES))


def unread_format(url: str) -> str | None:
    """The suffix of a tar archive in a format that is not read (``".tar.lz4"``), else None."""
    lower = url.lower()
    for suffix in _UNREAD:
        if lower.endswith(suffix):
            return suffix
    return None


def open_reader(
    url: str, size: int, start: int = 0, limits: ReadLimits | None = None
) -> ShardReader | CompressedReader:
    """The reader of a shard of ``size`` stored bytes: plain, or decompressing by its name.

    ``start`` is the tar offset to read from (:attr:`ShardReader.pending_offset` of an
    earlier reader); a compressed shard is still fed from its first stored byte.
    ``limits``: what a sample may hold and what a cut shard is (:mod:`._limits`).
    """
    if compression_of(url) is None:
        return ShardReader(url, size, start, limits)
    return CompressedReader(url, size, start, limits)


def fetch_start(url: str, start: int) -> int:
    """The stored byte a reader of the shard starting at tar offset ``start`` is fed from."""
    return 0 if compression_of(url) is not None else start


class _Streams:
    """One compression format's decompressor, over every stream of a file in turn."""

    def __init__(self, kind: str, finished: Callable[[], bool]) -> None:
        self.kind = kind
        self.finished = finished  # whether the tar has ended: what follows is not read
        self.ended = False  # the last stream is complete and nothing follows it yet
        self._cuts = ZstdCuts()  # zstd's decompressobj has no output limit: its input is cut
        self._d: Any = self._new()

    def _new(self) -> Any:
        if self.kind == "gzip":
            return zlib.decompressobj(16 + zlib.MAX_WBITS)
        if self.kind == "bzip2":
            return bz2.BZ2Decompressor()
        if self.kind == "xz":
            return lzma.LZMADecompressor()
        self._cuts = ZstdCuts()
        return zstandard.ZstdDecompressor().decompressobj()

    def pieces(self, data: memoryview | bytes) -> Generator[bytes, None, None]:
        """Decompress ``data``, the next stored bytes, in pieces of at most 8 MiB."""
        buf: memoryview | bytes = data
        while len(buf):
            if self.ended:
                if self.finished() or not any(buf):  # after the tar, or zero padding
                    return
                self._d, self.ended = self._new(), False
            rest = yield from self._one(buf)
            if not self._d.eof:
                return
            buf, self.ended = self._d.unused_data + rest, True

    def _one(self, buf: memoryview | bytes) -> Generator[bytes, None, bytes]:
        """Feed ``buf`` to the current stream; returns the input after its ``unused_data``
        once it ended (zstd, fed in slices), else ``b""``."""
        d = self._d
        if self.kind == "gzip":
            while True:
                out = d.decompress(buf, _OUT_LIMIT)
                if out:
                    yield out
                buf = d.unconsumed_tail
                if d.eof or not buf:
                    return b""
        if self.kind == "zstd":
            view, at, cuts = memoryview(buf), 0, self._cuts
            while at < len(view):
                n = cuts.cut(view[at:], _OUT_LIMIT)
                out = d.decompress(view[at : at + n])
                at += n
                if out:
                    yield out
                if d.eof:
                    return bytes(view[at:])  # unused_data holds what the cut let past
            return b""
        out = d.decompress(buf, _OUT_LIMIT)
        while True:
            if out:
                yield out
            if d.eof or d.needs_input:
                return b""
            out = d.decompress(b"", _OUT_LIMIT)


class CompressedReader:
    """A :class:`~._tar.ShardReader` over a compressed shard's stored bytes.

    Fed the stored (compressed) bytes in order from the first, it hands their decompressed
    bytes to a tar reader that starts at tar offset ``start``; :attr:`pending_offset` and
    :attr:`done` are the tar reader's.

    Args:
        url: the shard, named in errors; its name gives the compression.
        size: the stored size in bytes.
        start: the tar offset to read from (bytes before it are decompressed and dropped).
        limits: what a sample may hold and what a cut shard is (:mod:`._limits`).
    """

    def __init__(
        self, url: str, size: int, start: int = 0, limits: ReadLimits | None = None
    ) -> None:
        if size < 0 or start < 0 or start % 512:
            raise ValueError(f"{url}: bad start {start} for a compressed shard")
        self.url = url
        self.size = size
        self.kind = compression_of(url) or "gzip"
        self._tar = ShardReader(url, None, start, limits)
        self._skip = start  # tar bytes before this are dropped
        self._out = 0  # tar bytes decompressed so far
        self._next = 0  # the next stored byte expected
        self._head = b""  # the first stored bytes, until the format is known
        self._streams: _Streams | None = None
        self._plain = False  # no known magic: a plain tar under a compressed name
        self._error: tuple[str, int] | None = None  # (message, offset) once corrupt

    @property
    def general_members(self) -> int:
        """:attr:`ShardReader.general_members` of the decompressed tar."""
        return self._tar.general_members

    @property
    def pending_offset(self) -> int:
        """The tar reader's :attr:`~._tar.ShardReader.pending_offset` (a tar offset)."""
        return self._tar.pending_offset

    @property
    def done(self) -> bool:
        """Whether the tar's end was reached and every stream read to its end."""
        streams = self._streams
        return self._tar.done and (self._plain or (streams is not None and streams.ended))

    def feed(
        self, data: memoryview | bytes | bytearray, offset: int, *, final: bool = False
    ) -> list[Sample]:
        """Decompress the next stored bytes and index them (see :meth:`ShardReader.feed`).

        Raises:
            ValueError: the range is not the next one.
            CorruptTarError: a corrupt or truncated compressed stream, or a corrupt tar.
        """
        return [
            s for view, records in self._parts(data, offset, final) for s in samples(view, records)
        ]

    def records(
        self, data: memoryview | bytes | bytearray, offset: int, *, final: bool = False
    ) -> list[Record]:
        """:meth:`feed` as :meth:`ShardReader.records` returns it, every field owned: the
        decompressed pieces the fields lay in are not kept."""
        return [
            (
                record[0],
                record[1],
                *[
                    (e, 0, 0, view[a:b].tobytes()) if o is None else (e, a, b, o)
                    for e, a, b, o in record[2:]
                ],
            )
            for view, records in self._parts(data, offset, final)
            for record in records
        ]

    def _parts(
        self, data: memoryview | bytes | bytearray, offset: int, final: bool
    ) -> list[tuple[memoryview, Records]]:
        """The records completed by ``data``, with the decompressed piece each lies in."""
        view = byte_view(data)
        end = offset + len(view)
        final = final or end == self.size
        if offset != self._next or end > self.size or (final and end != self.size):
            raise ValueError(
                f"{self.url}: range [{offset}, {end}) does not follow byte {self._next}"
                f" of a {self.size}-byte shard" + (" as its final range" if final else "")
            )
        if self._error is None:
            self._next = end
            try:
                return self._feed(view, offset, final)
            except CorruptTarError as exc:
                self._error = str(exc), exc.offset
        # A fresh error, not the first one: its traceback holds frames whose locals view
        # ``data`` (a ring slot, which could then not be released); the decompressor's own
        # error is named in the message.
        del view
        raise CorruptTarError(self._error[0], url=self.url, offset=self._error[1])

    def _feed(self, view: memoryview, offset: int, final: bool) -> list[tuple[memoryview, Records]]:
        out: list[tuple[memoryview, Records]] = []
        if self._streams is None and not self._plain:
            self._head += view.tobytes()
            if len(self._head) < _MAGIC_BYTES and not final:
                return out
            view, offset = memoryview(self._head), offset + len(view) - len(self._head)
            self._head = b""
            kind = next((k for magic, k in _MAGIC if view[: len(magic)] == magic), None)
            if kind is None:
                self._plain = True
            else:
                self.kind, self._streams = kind, _Streams(kind, lambda: self._tar.done)
        pieces: Iterator[bytes | memoryview] = iter((view,))
        if self._streams is not None:
            if self._tar.done and self._streams.ended:
                return out  # what follows the archive is not read
            pieces = self._decompress(self._streams, view, offset)
        for piece in pieces:
            self._to_tar(out, piece)
        if final:
            if self._streams is not None and not self._streams.ended:
                raise CorruptTarError(
                    f"{self.url}: the {self.kind} stream is cut short (truncated shard) at "
                    f"compressed byte {self.size}",
                    url=self.url,
                    offset=self.size,
                )
            if not self._tar.done:
                self._to_tar(out, b"", final=True)
        return out

    def _decompress(self, streams: _Streams, view: memoryview, offset: int) -> Iterator[bytes]:
        try:
            yield from streams.pieces(view)
        except (zlib.error, OSError, EOFError, lzma.LZMAError, zstandard.ZstdError) as exc:
            raise CorruptTarError(
                f"{self.url}: corrupt {self.kind} stream in compressed bytes "
                f"[{offset}, {offset + len(view)}): {exc}",
                url=self.url,
                offset=offset,
            ) from None

    def _to_tar(
        self,
        out: list[tuple[memoryview, Records]],
        piece: bytes | memoryview,
        final: bool = False,
    ) -> None:
        """Hand decompressed bytes to the tar reader, dropping those before its start."""
        at, self._out = self._out, self._out + len(piece)
        if self._out < self._skip or (self._out == self._skip and not final):
            if final:  # the tar ends before the resume point
                raise CorruptTarError(
                    f"{self.url}: the shard's tar ends at byte {self._out}, before the "
                    f"resume point {self._skip}",
                    url=self.url,
                    offset=self._out,
                )
            return
        if at < self._skip:
            piece, at = memoryview(piece)[self._skip - at :], self._skip
        if not self._tar.done:
            view = byte_view(piece)
            records = self._tar.records(view, at, final=final)
            if records:
                out.append((view, records))


def count_samples(
    fileobj: IO[bytes],
    url: str,
    size: int,
    *,
    block: int = 8 << 20,
    limits: ReadLimits | None = None,
) -> int:
    """Count the samples of a shard read front to back, with the same reader as the stream.

    A compressed shard (by its name) is decompressed on the way: this module's reader.

    Args:
        fileobj: the shard's bytes as stored, e.g. an S3 response body.
        url: the shard, named in errors.
        size: the shard's size in bytes, as stored.
        block: bytes read at a time.
        limits: what a sample may hold and what a cut shard is (:mod:`._limits`).

    Raises:
        CorruptTarError: the bytes are not a well-formed tar (with the offset), the
            stream ends before ``size`` bytes, or the shard is empty (0 bytes).
    """
    check_not_empty(url, size)
    reader = open_reader(url, size, limits=limits)
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
