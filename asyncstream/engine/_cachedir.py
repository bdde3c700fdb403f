"""The cache folder: chunk files, their format, the byte ledger and LRU eviction.

One flat folder, shared by every reader and process of one user on the node::

    <name>.chunk   a cached chunk: a 64-byte header, then the chunk's bytes
    <name>.tmp     a chunk being written; renamed to ``.chunk`` once complete
    .ledger        the lock (``fcntl.flock``) and the folder's byte count
    .key           the folder's secret: 32 random bytes, ``0o600``

**Key.** A chunk's identity (:func:`chunk_key`) is the SHA-256 of its URL, the object's
version (its listed ETag, else its listed size) and the range (offset, length): a
replaced object has another ETag and so other files; the old ones age out. A chunk of an
object with neither is not cached. In the folder a chunk goes by its *tag*, the
HMAC-SHA-256 of its identity under the folder's secret: ``<name>`` is the tag's first 16
bytes in hex, and the header holds the whole tag.

**Trust.** Only a private folder is used (:mod:`asyncstream._folders`: owned by this user,
not writable by group or others, checked on the descriptor the folder is opened as, and
every later name resolved against that descriptor, so a folder swapped under the path is
not followed); every file is opened with ``O_NOFOLLOW`` and its owner checked after the
open. A chunk is served only if its header carries its tag, which no one can compute
without the secret (a file only this user can read): another user who could write into
the folder still could not forge a chunk for a URL, nor move one chunk's file over
another's. Why a secret tag rather than a keyed digest of the payload: the tag costs one
HMAC of 32 bytes per chunk (5 us, nothing per byte), while a keyed digest of every byte
would cost, on each first read of a file, 0.8 s per GB (HMAC-SHA-256) to 2.2 (keyed
``blake2b``) where the CRC below costs 0.5 (measured on the 2-core development VM, one
core, 16 MiB buffers); and whoever can read the secret (this user, root) can write the
files anyway. A file
that fails (another user's, a symlink, a forgery) is dropped and refetched, as a
corrupted one is. A secret that others could read (not ``0o600``) or that is cut short is
replaced, which retires every chunk written under the old one.

**Format and verification.** The header holds a magic, the payload's length, its
``zlib.crc32`` and the tag. A read checks the file's size, the magic, the
length and the tag, and the CRC over every byte; a file that fails (a truncated file, a
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
import errno
import fcntl
import hashlib
import hmac
import json
import os
import stat
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from typing import Literal

from .._folders import (
    NOFOLLOW,
    UnsafeFolderError,
    check_folder,
    load_secret,
    open_private,
    private_folder,
)
from ..stores._store import ChunkRequest

__all__ = ["HEADER_BYTES", "CacheDir", "check_cache_folder", "chunk_key"]

_MAGIC = b"ASCACHE2"  # 2: the header holds the keyed tag (1 held the bare identity)
_HEADER = struct.Struct("<8sQI4x32s8x")  # magic, length, crc32, tag: 64 bytes
HEADER_BYTES = _HEADER.size
_COUNT = struct.Struct("<Q")  # the ledger: the folder's bytes, then
_STAMP = struct.Struct("<d")  # the time of its last sweep
_CHUNK = ".chunk"
_TMP = ".tmp"
_LEDGER = ".ledger"
_KEY = ".key"
STALE_AFTER = 60.0  # seconds: a temporary file this old lost its writer
_TRUSTED = 1 << 16  # files whose check this process remembers
_NOWAIT: int = getattr(os, "RWF_NOWAIT", 0)


def chunk_key(request: ChunkRequest) -> bytes | None:
    """The chunk's identity digest, or None when the object's version is unknown."""
    if request.etag is not None:
        version = f"etag={request.etag}"
    elif request.size is not None:
        version = f"size={request.size}"
    else:
        return None
    # JSON, not a separator: a listed name or ETag holding the separator cannot make two
    # chunks one identity.
    material = json.dumps([request.url, version, request.offset, request.length])
    return hashlib.sha256(material.encode()).digest()


def check_cache_folder(path: str) -> None:
    """Create the folder ``path`` (``0o700``) if missing; refuse it unless it is private
    and its ledger and secret, where present, are this user's regular files.

    Raises:
        UnsafeFolderError: with what is wrong and how to fix it.
        OSError: it cannot be created or read.
    """
    private_folder(path, "cache_dir")
    for name in (_LEDGER, _KEY):
        try:
            st = os.lstat(os.path.join(path, name))
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise UnsafeFolderError(
                f"cache_dir {path!r} holds a {name} that is not a file of this user (uid "
                f"{st.st_uid}, mode {st.st_mode:#o}): remove it, or choose another folder"
            )


def _unlink(name: str, folder: int) -> bool:
    """Remove ``name`` from the folder; False if it was already gone."""
    try:
        os.unlink(name, dir_fd=folder)
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
        self.nowait = bool(_NOWAIT)  # read_now may try the page cache (until refused)
        self._lock = threading.Lock()
        self._ledger: int | None = None
        self._dir: int | None = None  # the folder as checked: every name resolves in it
        self._secret = b""
        self._trusted: dict[str, tuple[int, ...]] = {}  # name -> stat identity, oldest first
        self._trust_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"CacheDir({self.path!r}, limit={self.limit})"

    def open(self) -> None:
        """Create the folder, the ledger and the secret if missing (refusing a folder or
        file another user could have written: :class:`UnsafeFolderError`); sweep it
        (stale files, the count) unless a sweep ran less than ``stale_after`` ago
        (engines start often: every DataLoader worker of every epoch, and a sweep stats
        every file)."""
        check_cache_folder(self.path)
        folder = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            check_folder(self.path, os.fstat(folder), "cache_dir")  # the one opened
            ledger = self._shown(_LEDGER)
            self._ledger = open_private(_LEDGER, os.O_RDWR | os.O_CREAT, folder, ledger)
        except BaseException:
            os.close(folder)
            raise
        self._dir = folder
        try:
            with self._locked():
                self._secret = load_secret(_KEY, folder, self._shown(_KEY))
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
        """Close the ledger and the folder. Idempotent."""
        with self._lock:
            fds, self._ledger, self._dir = (self._ledger, self._dir), None, None
        for fd in fds:
            if fd is not None:
                os.close(fd)

    def file(self, key: bytes, suffix: str = _CHUNK) -> str:
        """The path of the chunk file (or, with ``".tmp"``, its temporary file)."""
        return os.path.join(self.path, self._name(self._tag(key), suffix))

    def _tag(self, key: bytes) -> bytes:
        if not self._secret:
            raise OSError(f"the cache {self.path} is not open")
        return hmac.digest(self._secret, key, "sha256")

    @staticmethod
    def _name(tag: bytes, suffix: str = _CHUNK) -> str:
        return tag[:16].hex() + suffix

    def _shown(self, name: str) -> str:
        return os.path.join(self.path, name)

    def _named(self, key: bytes) -> tuple[int, bytes, str]:
        """The folder's descriptor, and the tag and file name of chunk ``key``."""
        tag = self._tag(key)
        return self._folder(), tag, self._name(tag)

    def _folder(self) -> int:
        folder = self._dir
        if folder is None:
            raise OSError(f"the cache {self.path} is closed")
        return folder

    # -- reading -----------------------------------------------------------------------

    def read(self, key: bytes, out: memoryview) -> Literal["hit", "miss", "bad"]:
        """Read the chunk ``key`` into ``out`` (exactly its length) and verify it: the
        owner, the header and its tag always, the CRC unless this process has checked the
        file as it is.

        Returns:
            ``"hit"``: ``out`` holds the chunk; ``"miss"``: not cached; ``"bad"``: a
            file that failed verification was there, now removed (``out`` holds garbage).
        """
        folder, tag, name = self._named(key)
        try:
            fd = os.open(name, os.O_RDONLY | NOFOLLOW, dir_fd=folder)
        except FileNotFoundError:
            return "miss"
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            with contextlib.suppress(FileNotFoundError):  # a symlink: never followed
                self._drop(name, os.stat(name, dir_fd=folder, follow_symlinks=False))
            return "bad"
        try:
            st = os.fstat(fd)
            if _plausible(st, out):
                check = self._to_check(name, st)
                header = bytearray(HEADER_BYTES)
                try:
                    n = os.preadv(fd, [header, out], 0)
                except OSError:  # an unreadable file (EIO) is as bad as a corrupted one
                    n = -1
                if n == st.st_size and _valid(header, tag, out, crc=check):
                    with contextlib.suppress(OSError):  # a read-only folder still serves
                        os.utime(fd)  # the LRU's clock: last use
                    self._trust(name, os.fstat(fd))
                    return "hit"
        finally:
            os.close(fd)
        self._forget(name)
        self._drop(name, st)
        return "bad"

    def read_now(self, key: bytes, out: memoryview) -> Literal["hit", "miss"] | None:
        """:meth:`read`, where it can be answered at once on the caller's thread (the
        engine's event loop): a file this process has checked, as it is, whose bytes are
        all in the page cache (``preadv2`` with ``RWF_NOWAIT``), or no file at all.
        ``None`` for everything else (a file to check, a disk to wait for, anything
        unusual), which :meth:`read` then handles in a thread, as before: this adds no
        way for a file to be served, and does not drop, forget or count a check.

        Why: a hit handed to a thread and back cost about as much CPU as the copy of a
        1 MiB chunk (``python -m bench.localread``: 257 against 159 us a MiB for the
        local-files store, which reads this way since), and a cached epoch fell from
        1.10x to 0.94x of local files once they read without it (bench/RESULTS.md).
        """
        if not self.nowait:
            return None
        folder, tag, name = self._named(key)
        try:
            fd = os.open(name, os.O_RDONLY | NOFOLLOW, dir_fd=folder)
        except FileNotFoundError:
            return "miss"
        except OSError:
            return None  # a symlink (dropped by read), or an error read reports
        try:
            st = os.fstat(fd)
            if not _plausible(st, out):
                return None
            with self._trust_lock:
                if self._trusted.get(name) != _identity(st):
                    return None  # its CRC to check: in a thread
            header = bytearray(HEADER_BYTES)
            try:
                n = os.preadv(fd, [header, out], 0, _NOWAIT)
            except BlockingIOError:
                return None
            except OSError as exc:
                if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):
                    self.nowait = False  # a file system that refuses the flag: threads
                return None
            if n != st.st_size or not _valid(header, tag, out, crc=False):
                return None  # read in part, or bad: read decides, and drops it
            with contextlib.suppress(OSError):
                os.utime(fd)  # the LRU's clock: last use
            self._trust(name, os.fstat(fd))
            return "hit"
        finally:
            os.close(fd)

    # -- the record of checked files ---------------------------------------------------

    def _to_check(self, name: str, st: os.stat_result) -> bool:
        """Whether a read of ``name`` must check the CRC (counted if so)."""
        with self._trust_lock:
            check = self._trusted.get(name) != _identity(st)
            self.checked += check
            return check

    def _trust(self, name: str, st: os.stat_result) -> None:
        with self._trust_lock:
            self._trusted.pop(name, None)
            self._trusted[name] = _identity(st)
            if len(self._trusted) > _TRUSTED:
                del self._trusted[next(iter(self._trusted))]

    def _forget(self, name: str) -> None:
        with self._trust_lock:
            self._trusted.pop(name, None)

    def _drop(self, name: str, bad: os.stat_result) -> None:
        """Remove a file that failed verification, unless it was replaced meanwhile."""
        with self._locked():
            folder = self._folder()
            try:
                now = os.stat(name, dir_fd=folder, follow_symlinks=False)
            except FileNotFoundError:
                return
            if (now.st_dev, now.st_ino) == (bad.st_dev, bad.st_ino) and _unlink(name, folder):
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
        tag = self._tag(key)
        final, tmp = self._name(tag), self._name(tag, _TMP)
        header = _HEADER.pack(_MAGIC, len(data), zlib.crc32(data), tag)
        with self._locked():
            folder = self._folder()
            if _exists(final, folder) or not self._tmp_free(tmp, folder):
                return False
            total = self._total()
            if self.limit is not None and total + size > self.limit:
                total = self._sweep(size)
            fd = open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, folder, self._shown(tmp))
            try:
                os.ftruncate(fd, size)  # counted whole by any sweep from now on
                self._set_total(total + size)
            except BaseException:
                os.close(fd)
                _unlink(tmp, folder)
                raise
        done = False
        try:
            written = os.pwritev(fd, [header, data], 0)
            if written != size:
                raise OSError(f"wrote {written} of {size} bytes to {self._shown(tmp)}")
            with self._locked():  # a sweep must never see the file between its two names
                os.replace(tmp, final, src_dir_fd=folder, dst_dir_fd=folder)
                done = True
            self._trust(final, os.fstat(fd))  # written from the bytes checked by the store
        finally:
            os.close(fd)
            if not done:
                with self._locked():
                    if _unlink(tmp, folder):  # (unless a sweep took it for a dead writer's)
                        self._set_total(max(0, self._total() - size))
        return True

    def _tmp_free(self, tmp: str, folder: int) -> bool:
        """Whether no live writer holds ``tmp`` (a crashed one's is removed). Locked."""
        try:
            st = os.stat(tmp, dir_fd=folder, follow_symlinks=False)
        except FileNotFoundError:
            return True
        if time.time() - st.st_mtime <= self.stale_after:
            return False
        if _unlink(tmp, folder):
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
        folder = self._folder()
        now = time.time()
        total = 0
        chunks: list[tuple[int, str, int]] = []
        with os.scandir(folder) as entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if entry.name.endswith(_TMP):
                    if now - st.st_mtime > self.stale_after and _unlink(entry.name, folder):
                        self.stale_removed += 1
                        continue
                elif entry.name.endswith(_CHUNK):
                    chunks.append((st.st_mtime_ns, entry.name, st.st_size))
                else:
                    continue
                total += st.st_size
        if self.limit is not None and total + need > self.limit:
            target = max(0, self.limit - need - self.limit // 20)
            chunks.sort()
            for _, name, size in chunks:
                if total <= target:
                    break
                if _unlink(name, folder):
                    self._forget(name)
                    total -= size
                    self.evictions += 1
                    self.evicted_bytes += size
        assert self._ledger is not None
        os.pwrite(self._ledger, _STAMP.pack(now), _COUNT.size)
        return total


def _exists(name: str, folder: int) -> bool:
    try:
        os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _identity(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _plausible(st: os.stat_result, out: memoryview) -> bool:
    """Whether an opened chunk file may hold the chunk ``out`` is to receive: a regular
    file of this user, of the header's and the chunk's size."""
    return (
        stat.S_ISREG(st.st_mode)
        and st.st_uid == os.geteuid()
        and st.st_size == HEADER_BYTES + len(out)
    )


def _valid(header: bytearray, tag: bytes, payload: memoryview, *, crc: bool) -> bool:
    magic, length, checksum, digest = _HEADER.unpack(header)
    if magic != _MAGIC or length != len(payload) or not hmac.compare_digest(digest, tag):
        return False
    return not crc or bool(checksum == zlib.crc32(payload))
