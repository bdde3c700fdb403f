"""The local disk cache tier: a store that keeps the chunks another store fetched.

:class:`CachedStore` wraps a remote store (the engine wraps its S3 store when the stream
has a ``cache_dir``; local files need no cache). Its :meth:`~CachedStore.read_into`
looks the chunk up in the cache folder (:mod:`._cachedir`: the key, the file format,
atomic writes, the byte ledger and LRU eviction shared by every process on the node) and
reads it with ``preadv`` straight into the ring slot, verifying it; on a miss, or a file
that fails verification (dropped), it reads through the inner store, then writes the
chunk to the cache before the slot is published. Both run in a worker thread, so the
event loop never blocks on the disk.

What is cached is the chunk *grid* of each object, ``[k * chunk, (k + 1) * chunk)``, not
the requests themselves: a stream's chunks are on that grid, except the first chunk of a
piece that starts mid-shard (a rank's or DataLoader worker's share begins at a sample,
and where depends on the epoch's shard permutation). Such a request is served from the
grid chunk that holds it (read whole, verified, and its part moved to the slot's start),
and on a miss the whole grid chunk is fetched, so every epoch of every topology finds
its chunks cached, not only the first epoch's exact ranges. A request that spans two
grid chunks (a resumed lane's first read, for a sample carried across chunks) is read
through and not cached.

Why the write comes before the chunk is handed on, not after: the slot is the only copy
of the chunk, and once published the consumer may release it for the engine to refill,
so a later write would need a copy of every chunk (as much work as the write into the
page cache, and memory outside the ring). The price is the write's time on each missed
chunk's latency: a few milliseconds per 16 MiB against the tens to hundreds a GET takes.

A thread that reads from or writes into a slot is always waited for, even when its
request is cancelled (a lost hedge, the engine stopping): the slot must not be refilled
while the thread still uses it.

Failures of the cache never fail a read: a file that cannot be read is a miss, and a
write that fails (a full disk) is logged (the first of each kind as a warning) and
counted, and the chunk is served from the inner store's read.

Statistics (``stats()["cache"]``, so ``ShardStream.stats()["fetch"]["cache"]``): hits
(``loop_hits`` of them read on the engine's loop from the page cache, the others in a
thread: :meth:`CacheDir.read_now <._cachedir.CacheDir.read_now>`), misses and
``bytes_from_cache``; ``writes`` and ``write_failures``; ``dropped`` (files
that failed verification); ``checked`` (reads that checked every byte's CRC: the first
of each file by this process, see :mod:`._cachedir`); ``evictions``, ``evicted_bytes``
and ``stale_removed`` (a crashed writer's temporary files), the last three by this
process.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Literal, TypeVar

from .._folders import UnsafeFolderError, default_cache_dir
from ..shards._urls import Shard
from ..stores._store import ChunkRequest, Store, Timing
from ._cachedir import STALE_AFTER, CacheDir, check_cache_folder, chunk_key

__all__ = ["CachedStore", "cache_options"]

T = TypeVar("T")
_log = logging.getLogger("asyncstream.cache")


def cache_options(cache_dir: Any, cache_limit: Any) -> tuple[str | None, int | None]:
    """Validate ``ShardStream``'s cache arguments; create the folder.

    Args:
        cache_dir: a folder, ``True`` for the default one (``chunks`` in
            :func:`~asyncstream._folders.default_cache_dir`: per user), or None.
        cache_limit: bytes, or None.

    Returns:
        The folder as an absolute path (or None: no cache) and the limit.

    Raises:
        ValueError: a limit without a folder, a limit that is not a positive integer, a
            folder that is not a path, exists as a file or cannot be created, or that
            another user could write into (owned by another user, writable by group or
            others, a symlinked ledger or secret: the message says how to fix it).
    """
    if cache_dir is None or cache_dir is False:
        if cache_limit is not None:
            raise ValueError(f"cache_limit={cache_limit!r} was given without cache_dir")
        return None, None
    if cache_dir is True:
        cache_dir = default_cache_dir() / "chunks"
    if not isinstance(cache_dir, str | os.PathLike):
        raise ValueError(f"cache_dir must be a path (str or os.PathLike), got {cache_dir!r}")
    path = os.fspath(cache_dir)
    if not isinstance(path, str) or not path:
        raise ValueError(f"cache_dir must be a non-empty str path, got {cache_dir!r}")
    if cache_limit is not None and (
        not isinstance(cache_limit, int) or isinstance(cache_limit, bool) or cache_limit < 1
    ):
        raise ValueError(f"cache_limit must be an integer >= 1 (bytes), got {cache_limit!r}")
    path = os.path.abspath(path)
    try:
        check_cache_folder(path)
    except UnsafeFolderError as exc:
        raise ValueError(str(exc)) from exc
    except OSError as exc:
        raise ValueError(f"cache_dir {path!r} is not a folder that can be used: {exc}") from exc
    return path, cache_limit


class CachedStore(Store):
    """A store that serves chunks from a local cache folder, filling it from ``inner``.

    Args:
        inner: the store that reads what the cache does not hold.
        path: the cache folder (created if missing; several processes may share it).
        grid: the chunk size: what is cached is the chunk ``[k * grid, (k + 1) * grid)``
            of an object (the last one shorter) that holds a request.
        limit: the most bytes the folder's files may take; None for no limit.
        stale_after: seconds after which a temporary file is a crashed writer's.
    """

    def __init__(
        self,
        inner: Store,
        path: str,
        *,
        grid: int,
        limit: int | None = None,
        stale_after: float = STALE_AFTER,
    ) -> None:
        if grid < 1:
            raise ValueError(f"grid must be >= 1, got {grid}")
        self.inner = inner
        self.grid = grid
        # A miss is a read of the inner store, as worth hedging as the store says; hits
        # are not (and their timings stay out of the engine's predictions: Timing.cached).
        self.hedgeable = inner.hedgeable
        self.dir = CacheDir(path, limit, stale_after=stale_after)
        self.hits = 0
        self.misses = 0
        self.bytes_from_cache = 0
        self.writes = 0
        self.write_failures = 0
        self.dropped = 0
        self.loop_hits = 0  # hits read on the event loop, from the page cache
        self._warned: set[str] = set()

    def __repr__(self) -> str:
        return f"CachedStore({self.inner!r}, {self.dir!r})"

    # -- at open: the inner store's (metadata is not cached) ---------------------------------

    def list(self, url: str) -> list[Shard]:
        return self.inner.list(url)

    def head(self, url: str) -> Shard:
        return self.inner.head(url)

    def read(self, url: str) -> bytes | None:
        return self.inner.read(url)

    def write(self, url: str, data: bytes) -> None:
        self.inner.write(url, data)

    def delete(self, urls: Iterable[str]) -> None:
        self.inner.delete(urls)

    async def open(self) -> CachedStore:
        """Open the folder (in a thread: it sweeps it once)."""
        await asyncio.get_running_loop().run_in_executor(None, self.dir.open)
        return self

    def unit(self, request: ChunkRequest) -> ChunkRequest | None:
        """The chunk of the grid that holds ``request``: what is cached and fetched for it.

        None when the request spans two grid chunks (a resumed lane's first read can), or
        is off the grid of an object of unknown size: such a request is read through.
        """
        if request.size is None:  # where the grid ends is unknown: only aligned requests
            return request if request.offset % self.grid == 0 else None
        start = request.offset - request.offset % self.grid
        end = min(start + self.grid, request.size)
        if request.offset + request.length > end:
            return None
        return dataclasses.replace(
            request, offset=start, length=end - start, final=end >= request.size
        )

    async def read_into(
        self,
        request: ChunkRequest,
        out: memoryview,
        fill: Callable[[ChunkRequest, memoryview], Awaitable[Timing]] | None = None,
    ) -> Timing:
        """Serve ``request`` from the folder, or read it (``fill``: how, where not the
        inner store's ``read_into``: the scheduler's reader in parts) and keep it."""
        fill = fill or self.inner.read_into
        unit = self.unit(request)
        key = None if unit is None else chunk_key(unit)
        if unit is None or key is None or unit.length > len(out):  # read through
            timing = await fill(request, out)
            self.misses += 1
            return timing
        loop = asyncio.get_running_loop()
        start = loop.time()
        with out[: unit.length] as view:
            try:
                now = self.dir.read_now(key, view)  # a hit the page cache holds: here
                found: Literal["hit", "miss", "bad"]
                if now is None:
                    found = await _waited(lambda: self.dir.read(key, view))
                else:
                    found = now
                    self.loop_hits += found == "hit"
            except OSError as exc:
                self._warn(f"read:{exc.errno}", f"reading failed ({exc})")
                found = "miss"
            if found == "bad":
                self.dropped += 1
                self._warn("dropped", f"{unit.url} [{unit.offset}, +{unit.length}]")
            if found != "hit":
                timing = await fill(unit, out)
                self.misses += 1
                try:
                    written = await _waited(lambda: self.dir.write(key, view))
                    self.writes += written  # not `+= await`: that would add to a stale value
                except OSError as exc:
                    self.write_failures += 1
                    self._warn(f"write:{exc.errno}", f"writing failed ({exc})")
        if unit.offset != request.offset:  # the request's part to the slot's start (memmove)
            delta = request.offset - unit.offset
            out[: request.length] = out[delta : delta + request.length]
        if found != "hit":
            return timing
        self.hits += 1
        self.bytes_from_cache += request.length
        elapsed = loop.time() - start
        return Timing(elapsed, elapsed, cached=True)

    def _warn(self, kind: str, what: str) -> None:
        """Log what went wrong: the first of each kind as a warning, the rest as debug."""
        level = logging.DEBUG if kind in self._warned else logging.WARNING
        self._warned.add(kind)
        if kind == "dropped":
            message = "asyncstream cache %s: dropped %s, which failed verification; refetched"
        else:
            message = "asyncstream cache %s: %s; the chunk is read from the store"
        _log.log(level, message, self.dir.path, what)

    def stats(self) -> dict[str, Any]:
        return {
            **self.inner.stats(),
            "cache": {
                "dir": self.dir.path,
                "limit": self.dir.limit,
                "hits": self.hits,
                "loop_hits": self.loop_hits,
                "misses": self.misses,
                "bytes_from_cache": self.bytes_from_cache,
                "writes": self.writes,
                "write_failures": self.write_failures,
                "dropped": self.dropped,
                "checked": self.dir.checked,
                "evictions": self.dir.evictions,
                "evicted_bytes": self.dir.evicted_bytes,
                "stale_removed": self.dir.stale_removed,
            },
        }

    async def aclose(self) -> None:
        try:
            await self.inner.aclose()
        finally:
            self.dir.close()


async def _waited(work: Callable[[], T]) -> T:
    """Run ``work`` in a worker thread; if cancelled meanwhile, wait for it to end before
    raising the cancellation, since it uses a ring slot that must not be refilled under it."""
    future = asyncio.get_running_loop().run_in_executor(None, work)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        while not future.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([future])
        raise
