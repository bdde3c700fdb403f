"""Local files as a store: listed, read whole, and read by range straight into the slot.

Its URLs are ``file:///abs/path`` and plain paths (absolute, relative or ``~``). A file
it writes (a manifest, an index) gets the mode the umask gives, as the shards ``pack``
moves into place do: a web server in front of the folder serves them alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import secrets
import shutil
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from .._exceptions import NotFoundError, ShardURLError
from ..shards._urls import Shard
from ._errors import ChunkFailure
from ._store import ChunkRequest, Store, Timing

__all__ = ["LocalStore", "local_path", "local_uri"]

_NOWAIT: int = getattr(os, "RWF_NOWAIT", 0)
_INLINE_MOST = 16 << 20  # the largest read tried on the event loop


class LocalStore(Store):
    """Local files; ranges read with ``preadv`` straight into the buffer: on the event loop
    where the page cache holds them, else in a thread (:meth:`_read_inline`)."""

    #: Consecutive chunks of a file are read by one ``preadv`` into their slots (one
    #: hand-off to the thread pool and one system call for the group): with 1 MiB
    #: chunks, the engine's work per chunk, not the copy, bounded local reads.
    coalesces = True
    local = True

    @classmethod
    def canonical(cls, url: str) -> str:
        return local_uri(url)

    @classmethod
    def join(cls, folder: str, ref: str) -> str:
        return Path(os.path.normpath(local_path(folder) / ref)).absolute().as_uri()

    def is_folder(self, url: str) -> bool:
        return _path(url).is_dir()

    def prepare(self, url: str) -> None:
        _path(url).mkdir(parents=True, exist_ok=True)

    def upload(self, url: str, path: Path) -> str | None:
        shutil.move(path, _path(url))  # a rename where ``path`` is in the same file system
        return None

    def list(self, url: str) -> list[Shard]:
        folder = _path(url)
        if not folder.is_dir():
            raise NotFoundError(f"{url}: no such folder {folder}", url=url)
        files = (p for p in folder.rglob("*") if p.is_file())
        return sorted((Shard(p.as_uri(), p.stat().st_size) for p in files), key=lambda s: s.url)

    def head(self, url: str) -> Shard:
        path = _path(url)
        if not path.exists():
            raise NotFoundError(f"{url}: no such file {path}", url=url)
        if not path.is_file():
            raise ShardURLError(f"{url!r}: {path} is neither a file nor a folder")
        return Shard(path.as_uri(), path.stat().st_size)

    def read(self, url: str) -> bytes | None:
        try:
            return _path(url).read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def write(self, url: str, data: bytes) -> None:
        path = _path(url)
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}"
        # mode 0o666 less the umask, as open() gives a new file (mkstemp's 0o600 would not)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def delete(self, urls: Iterable[str]) -> None:
        for url in urls:
            _path(url).unlink(missing_ok=True)

    _read_paths: dict[str, Path] | None = None  # made by the first read_into

    def _read_path(self, url: str) -> Path:
        """:func:`_path` of ``url``, kept per URL (up to 4,096): the engine reads a shard in
        many chunks, and pathlib's parsing for each was 4% of its CPU with 1 MiB chunks
        (cProfile)."""
        paths = self._read_paths
        if paths is None or len(paths) >= 4096:
            paths = self._read_paths = {}
        path = paths.get(url)
        if path is None:
            path = paths[url] = _path(url)
        return path

    async def read_into(self, request: ChunkRequest, out: memoryview) -> Timing:
        return await self.read_group(request, [out[: request.length]], None)

    async def read_group(
        self,
        request: ChunkRequest,
        outs: Sequence[memoryview],
        filled: Callable[[int], None] | None,
    ) -> Timing:
        loop = asyncio.get_running_loop()
        start = loop.time()
        path = self._read_path(request.url)
        n = self._read_inline(path, request, outs) if self._inline else 0
        if n < request.length:  # not in the page cache (or not all of it): in a thread
            self.thread_reads += 1
            rest = _after(outs, n)
            n += await loop.run_in_executor(
                None, _pread, path, request.size, rest, request.offset + n, 0
            )
        whole = 0
        for i, out in enumerate(outs):
            whole += len(out)
            if whole > n:
                break
            if filled is not None:
                filled(i)  # whole: handed over even where a later chunk of the group is not
        if n != request.length:
            raise ChunkFailure("truncated", f"read {n} of {request.length} bytes from {path}")
        elapsed = loop.time() - start
        return Timing(elapsed, elapsed)

    #: whether a read first tries the page cache on the event loop (``RWF_NOWAIT``):
    #: turned off for good once a file system refuses the flag
    _inline = bool(_NOWAIT)

    def _read_inline(self, path: Path, request: ChunkRequest, outs: Sequence[memoryview]) -> int:
        """What of ``request`` the page cache holds, read on the event loop without waiting
        for a disk (``preadv2`` with ``RWF_NOWAIT``): 0 where none of it is there yet, or
        where the group is larger than :data:`_INLINE_MOST`.

        Why: handing a read to the thread pool and its result back to the loop cost 80
        to 100 us of CPU a read beyond the copy itself (about 150 us a MiB), most of the
        engine's cost per 1 MiB chunk of local files (``python -m bench.localread``,
        2 cores, 2026-11-28: 257 us of CPU a 1 MiB read through a thread, 159 on the
        loop; bench/RESULTS.md). A read from the page cache copies at memory speed, so
        the loop is held about 0.15 ms a MiB, 2.4 ms for the largest group read this
        way. A read the page cache cannot answer at once (``EAGAIN``), and the rest of
        one it answers in part, go to the thread as before: a cold disk never holds the
        loop.
        """
        if request.length > _INLINE_MOST:
            return 0
        try:
            n = _pread(path, request.size, outs, request.offset, _NOWAIT)
        except BlockingIOError:
            return 0
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            self._inline = False  # a file system that refuses RWF_NOWAIT: threads from now
            return 0
        self.cached_reads += n == request.length
        return n

    #: reads answered whole on the event loop from the page cache, and reads (or their
    #: rest) done in a thread: ``stats()["fetch"]`` has both
    cached_reads = 0
    thread_reads = 0

    def stats(self) -> dict[str, Any]:
        return {
            "transport": "local",
            "cached_reads": self.cached_reads,
            "thread_reads": self.thread_reads,
        }


def _pread(
    path: Path, size: int | None, outs: Sequence[memoryview], offset: int, flags: int
) -> int:
    """``preadv`` of ``path`` at ``offset`` into ``outs``, once the file's size is checked
    against ``size`` (the size it was listed with, where known)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        actual = os.fstat(fd).st_size
        if size is not None and actual != size:
            raise ChunkFailure("changed", f"its size is {actual}, not {size}")
        return os.preadv(fd, outs, offset, flags)
    finally:
        os.close(fd)


def _after(outs: Sequence[memoryview], n: int) -> list[memoryview]:
    """The buffers of ``outs`` past their first ``n`` bytes."""
    rest: list[memoryview] = []
    for out in outs:
        if n >= len(out):
            n -= len(out)
            continue
        rest.append(out[n:])
        n = 0
    return rest


def _path(url: str) -> Path:
    return local_path(url).expanduser().absolute()


def local_path(url: str) -> Path:
    """The path of a local URL: ``file:///abs/path`` or a plain path (not made absolute).

    Raises:
        ShardURLError: a ``file://`` URL naming another host.
    """
    if url.startswith("file://"):
        parsed = urlparse(url)
        if parsed.netloc not in ("", "localhost"):
            raise ShardURLError(f"{url!r}: file:// URLs must name a local path (file:///...)")
        return Path(unquote(parsed.path))
    return Path(url)


def local_uri(url: str) -> str:
    """The canonical ``file:///abs/path`` URL of a local URL or path."""
    return local_path(url).expanduser().absolute().as_uri()
