"""The cache folder: chunk files, their format, the byte ledger and LRU eviction.

One flat folder, shared by every reader and process of the node that is given it::

    <digest>.chunk   a cached chunk: a 64-byte header, then the chunk's bytes
    <digest>.tmp     a chunk being written; renamed to ``.chunk`` once complete
    .ledger          the lock (``fcntl.flock``) and the folder's byte count

**Key.** ``<digest>`` is the SHA-256 of the chunk's URL, the object's version (its
listed ETag, else its listed size) and the range (offset, length): a replaced object has
another ETag and so other files; the old ones age out. A chunk of an object with neither
is not cached.

**Format and verification.** The header holds a magic, the payload's length, its
``zlib.crc32`` and the full key digest. A read checks the file's size, the magic, the
length and the key, and the CRC over every byte; a file that fails (a truncated file, a
flipped byte, a file of another chunk) is dropped and reported ``"bad"``, never served.
Why CRC-32: measured on the development machine (zlib 1.2.13) over 16 MiB buffers,
``zlib.crc32`` runs at 5.5 GB/s, ``zlib.adler32`` at 4.0, ``sha1`` and ``sha256`` at
2.0, ``blake2b`` at 1.1 and ``md5`` at 0.9 (a ``memcpy`` at 15): the fastest in the
standard library is also the better error detector.

Even so, a read with the CRC runs at 3.3 GB/s per core against 9 for the bare
``preadv`` of the local-files store: on two cores, where the consumer takes one, it held
a cached epoch to 0.6 of the local-files stream, short of the 0.9 asked for. So the CRC
runs once per file and process, not on every read: a file this process wrote, or read
and checked, is trusted while its ``stat`` identity (device, inode, size, mtime, ctime)
is unchanged, and is checked again as soon as anything changes it (replacing,
truncating or writing into a file changes the inode, the size or the ctime, which no
user can set). What that gives up: a change made in the milliseconds between this
process's own check of a file and its ``stat`` of it, or within one tick of the kernel's
file clock, goes unseen by this process (not by the next one), and so does corruption
below the file system (the medium), as it would for data in the page cache anyway. The
first epoch a process reads from the cache checks every byte (``bench/RESULTS.md`` has
both figures). The record is in memory, at most 65,536 files.

**Atomic writes.** A chunk is written to ``<digest>.tmp`` (created with ``O_EXCL``, so
two writers of one chunk never interleave: the second skips it) and renamed into place
with ``os.replace``; a crash leaves at most a ``.tmp`` file, which readers never open.
No ``fsync``: after a power loss a renamed file may hold zeros, which the CRC catches.

**The ledger and eviction.** Every process keeps the folder under ``limit`` through the
ledger: under its lock (``flock``, plus a thread lock, since flock does not exclude
threads sharing one descriptor) a writer reserves its file's size, first evicting when
the total would pass the limit; a failed write gives its reservation back. Every change
to the folder's files happens under the lock: creating a temporary file (extended at
once to its full size, so a sweep counts it whole), renaming it into place (a sweep
listing the folder meanwhile could miss it under both names), removing it, evicting.

Eviction sweeps the folder: temporary files untouched for ``stale_after`` seconds (their
writer crashed) are removed, then chunk files least recently used first (a hit sets the
file's mtime: the access time is not reliable, ``noatime`` and ``relatime`` mounts being
the norm) until the folder holds the limit less what is being written less a twentieth
of the limit (so that sweeps, which stat every file, are rare). The sweep also corrects
the count, which can only err high (a crashed writer's reservation, a file removed by
hand), so the folder stays under the limit. A sweep also runs when a store opens the
folder (unless one ran within ``stale_after``: the ledger keeps the time of the last),
so stale files go even when nothing is evicted; and a writer that finds a stale
temporary file in its way removes it.

A reader that opened a file keeps reading it if the file is evicted or replaced
meanwhile (POSIX keeps the inode): readers take no lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from typing import Literal

from ..stores._store import ChunkRequest

__all__ = ["HEADER_BYTES", "CacheDir", "chunk_key"]

_MAGIC = b"ASCACHE1"
_HEADER = struct.Struct("<8sQI4x32s8x")  # magic, length, crc32, key digest: 64 bytes
HEADER_BYTES = _HEADER.size
_COUNT = struct.Struct("<Q")  # the ledger: the folder's bytes, then
_STAMP = struct.Struct("<d")  # the time of its last sweep
_CHUNK = ".chunk"
_TMP = ".tmp"
_LEDGER = ".ledger"
STALE_AFTER = 60.0  # seconds: a temporary file this old lost its writer
_OPEN = os.O_CLOEXEC
_TRUSTED = 1 << 16  # files whose check this process remembers


def chunk_key(request: ChunkRequest) -> bytes | None:
    """The chunk's key digest, or None when the object's version is unknown."""
    if request.etag is not None:
        version = f"etag={request.etag}"
    elif request.size is not None:
        version = f"size={request.size}"
    else:
        return None
    material = f"{request.url}\0{version}\0{request.offset}\0{request.length}"
    return hashlib.sha256(material.encode()).digest()


def _unlink(path: str) -> bool:
    """Remove ``path``; False if it was already gone."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


class CacheDir:
    """A cache folder (see the module docstring); every method is safe from any thread.

    Args:
        path: the folder (created if missing).
        limit: the most bytes its files may take, or None for no limit.
        stale_after: seconds after which an untouched temporary file is a crashed
            writer's and is removed.
    """

    def __init__(self, path: str, limit: int | None, *, stale_after: float = STALE_AFTER):
        self.path = path
        self.limit = limit
        self.stale_after = stale_after
        self.evictions = 0
        self.evicted_bytes = 0
        self.stale_removed = 0
        self.checked = 0  # reads that checked the CRC (the others were trusted)
        self._lock = threading.Lock()
        self._ledger: int | None = None
        self._trusted: dict[str, tuple[int, ...]] = {}  # path -> stat identity, oldest first
        self._trust_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"CacheDir({self.path!r}, limit={self.limit})"

    def open(self) -> None:
        """Create the folder and the ledger if missing; sweep it (stale files, the count)
        unless a sweep ran less than ``stale_after`` ago (engines start often: every
        DataLoader worker of every epoch, and a sweep stats every file)."""
        os.makedirs(self.path, mode=0o700, exist_ok=True)
        self._ledger = os.open(
            os.path.join(self.path, _LEDGER), os.O_RDWR | os.O_CREAT | _OPEN, 0o600
        )
        try:
            with self._locked():
                data = os.pread(self._ledger, _COUNT.size + _STAMP.size, 0)
                fresh = len(data) == _COUNT.size + _STAMP.size and (
                    time.time() - _STAMP.unpack_from(data, _COUNT.size)[0] < self.stale_after
                )
                if not fresh:
                    self._set_total(self._sweep(0))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Close the ledger. Idempotent."""
        with self._lock:
            fd, self._ledger = self._ledger, None
        if fd is not None:
            os.close(fd)

    def file(self, key: bytes, suffix: str = _CHUNK) -> str:
        """The path of the chunk file (or, with ``".tmp"``, its temporary file)."""
        return os.path.join(self.path, key[:16].hex() + suffix)

    # -- reading -----------------------------------------------------------------------

    def read(self, key: bytes, out: memoryview) -> Literal["hit", "miss", "bad"]:
        """Read the chunk ``key`` into ``out`` (exactly its length) and verify it: the
        header always, the CRC unless this process has checked the file as it is.

        Returns:
            ``"hit"``: ``out`` holds the chunk; ``"miss"``: not cached; ``"bad"``: a
            file that failed verification was there, now removed (``out`` holds garbage).
        """
        path = self.file(key)
        try:
            fd = os.open(path, os.O_RDONLY | _OPEN)
        except FileNotFoundError:
            return "miss"
        try:
            st = os.fstat(fd)
            if st.st_size == HEADER_BYTES + len(out):
                check = self._to_check(path, st)
                header = bytearray(HEADER_BYTES)
                try:
                    n = os.preadv(fd, [header, out], 0)
                except OSError:  # an unreadable file (EIO) is as bad as a corrupted one
                    n = -1
                if n == st.st_size and _valid(header, key, out, crc=check):
                    with contextlib.suppress(OSError):  # a read-only folder still serves
                        os.utime(fd)  # the LRU's clock: last use
                    self._trust(path, os.fstat(fd))
                    return "hit"
        finally:
            os.close(fd)
        self._forget(path)
        self._drop(path, st)
        return "bad"

    # -- the record of checked files ---------------------------------------------------

    def _to_check(self, path: str, st: os.stat_result) -> bool:
        """Whether a read of ``path`` must check the CRC (counted if so)."""
        with self._trust_lock:
            check = self._trusted.get(path) != _identity(st)
            self.checked += check
            return check

    def _trust(self, path: str, st: os.stat_result) -> None:
        with self._trust_lock:
            self._trusted.pop(path, None)
            self._trusted[path] = _identity(st)
            if len(self._trusted) > _TRUSTED:
                del self._trusted[next(iter(self._trusted))]

    def _forget(self, path: str) -> None:
        with self._trust_lock:
            self._trusted.pop(path, None)

    def _drop(self, path: str, bad: os.stat_result) -> None:
        """Remove a file that failed verification, unless it was replaced meanwhile."""
        with self._locked():
            try:
                now = os.stat(path)
            except FileNotFoundError:
                return
            if (now.st_dev, now.st_ino) == (bad.st_dev, bad.st_ino) and _unlink(path):
                self._set_total(max(0, self._total() - bad.st_size))

    # -- writing -----------------------------------------------------------------------

    def write(self, key: bytes, data: memoryview) -> bool:
        """Store the chunk ``key`` atomically.

        Returns:
            True if written; False if skipped: larger than the limit, already cached, or
            being written by another reader.

        Raises:
            OSError: the write failed (a full disk, say); nothing of it is left behind.
        """
        size = HEADER_BYTES + len(data)
        if self.limit is not None and size > self.limit:
            return False
        final, tmp = self.file(key), self.file(key, _TMP)
        header = _HEADER.pack(_MAGIC, len(data), zlib.crc32(data), key)
        with self._locked():
            if os.path.exists(final) or not self._tmp_free(tmp):
                return False
            total = self._total()
            if self.limit is not None and total + size > self.limit:
                total = self._sweep(size)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN, 0o600)
            try:
                os.ftruncate(fd, size)  # counted whole by any sweep from now on
                self._set_total(total + size)
            except BaseException:
                os.close(fd)
                _unlink(tmp)
                raise
        done = False
        try:
            written = os.pwritev(fd, [header, data], 0)
            if written != size:
                raise OSError(f"wrote {written} of {size} bytes to {tmp}")
            with self._locked():  # a sweep must never see the file between its two names
                os.replace(tmp, final)
                done = True
            self._trust(final, os.fstat(fd))  # written from the bytes checked by the store
        finally:
            os.close(fd)
            if not done:
                with self._locked():
                    if _unlink(tmp):  # (unless a sweep took it for a dead writer's)
                        self._set_total(max(0, self._total() - size))
        return True

    def _tmp_free(self, tmp: str) -> bool:
        """Whether no live writer holds ``tmp`` (a crashed one's is removed). Locked."""
        try:
            st = os.stat(tmp)
        except FileNotFoundError:
            return True
        if time.time() - st.st_mtime <= self.stale_after:
            return False
        if _unlink(tmp):
            self.stale_removed += 1
            self._set_total(max(0, self._total() - st.st_size))
        return True

    # -- the ledger --------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._lock:
            if self._ledger is None:
                raise OSError(f"the cache {self.path} is closed")
            fcntl.flock(self._ledger, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._ledger, fcntl.LOCK_UN)

    def _total(self) -> int:
        """The folder's bytes as the ledger has them (a sweep counts them when unreadable)."""
        assert self._ledger is not None
        data = os.pread(self._ledger, _COUNT.size, 0)
        if len(data) != _COUNT.size:
            return self._sweep(0)
        (total,) = _COUNT.unpack(data)
        return int(total)

    def _set_total(self, total: int) -> None:
        assert self._ledger is not None
        os.pwrite(self._ledger, _COUNT.pack(total), 0)

    def _sweep(self, need: int) -> int:
        """Remove stale temporary files and, past the limit, the least recently used
        chunks, leaving room for ``need`` more bytes. Locked. Returns the folder's bytes."""
        now = time.time()
        total = 0
        chunks: list[tuple[int, str, int]] = []
        with os.scandir(self.path) as entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if entry.name.endswith(_TMP):
                    if now - st.st_mtime > self.stale_after and _unlink(entry.path):
                        self.stale_removed += 1
                        continue
                elif entry.name.endswith(_CHUNK):
                    chunks.append((st.st_mtime_ns, entry.path, st.st_size))
                else:
                    continue
                total += st.st_size
        if self.limit is not None and total + need > self.limit:
            target = max(0, self.limit - need - self.limit // 20)
            chunks.sort()
            for _, path, size in chunks:
                if total <= target:
                    break
                if _unlink(path):
                    self._forget(path)
                    total -= size
                    self.evictions += 1
                    self.evicted_bytes += size
        assert self._ledger is not None
        os.pwrite(self._ledger, _STAMP.pack(now), _COUNT.size)
        return total


def _identity(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _valid(header: bytearray, key: bytes, payload: memoryview, *, crc: bool) -> bool:
    magic, length, checksum, digest = _HEADER.unpack(header)
    if magic != _MAGIC or length != len(payload) or digest != key:
        return False
    return not crc or bool(checksum == zlib.crc32(payload))
