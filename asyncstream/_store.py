"""The store interface: the one seam between asyncstream and where shards live.

A :class:`Store` has two halves. At open, in the consumer's process and blocking: list
the objects under a prefix, HEAD one, and read, write or delete a whole small object
(indexes, manifests). In the fetch engine's event loop: read a byte range of an object
into a caller's buffer (a ring slot). Whatever fails is mapped by the one table of
:mod:`._errors`. Two implementations: the S3 store (:mod:`._s3store`, its blocking half
in :mod:`._s3objects`: any S3-compatible endpoint, HTTP or HTTPS) and
:class:`LocalStore` (files). :class:`Stores` picks one by the URL's scheme, parsed in one
place (:func:`~._urls.scheme_of`), so no other module looks at a scheme or builds a
client. With a
cache folder, the engine wraps the S3 store in a :class:`~._cache.CachedStore`, a store
too.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import os
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._errors import ChunkFailure
from ._exceptions import NotFoundError, ShardURLError
from ._urls import Shard, local_path, scheme_of

if TYPE_CHECKING:
    from ._s3 import S3Options

__all__ = ["ChunkRequest", "LocalStore", "Store", "Stores", "Timing", "scheme_of"]


@dataclass(frozen=True, slots=True)
class ChunkRequest:
    """A byte range of a shard.

    Attributes:
        url: the shard, ``s3://bucket/key`` or ``file:///path``.
        offset: first byte of the range.
        length: bytes in the range (at most the slot size).
        etag: the shard's ETag from the listing, if any.
        final: whether this is the shard's last chunk (counts shards in statistics).
        size: the shard's size from the listing, if known (a response naming another
            total size means the object was replaced).
        store: which of the engine's S3 endpoints serves an ``s3://`` URL (0: the
            stream's own; see ``EngineConfig.s3_extra``).
    """

    url: str
    offset: int
    length: int
    etag: str | None = None
    final: bool = True
    size: int | None = None
    store: int = 0


@dataclass(frozen=True, slots=True)
class Timing:
    """Seconds from the request to the response headers, and to the last byte.

    ``cached``: served from the local cache (:mod:`._cache`), which says nothing about
    how long the store itself takes, so the engine leaves it out of its predictions.
    """

    first_byte: float
    total: float
    cached: bool = False


class Store(abc.ABC):
    """Where objects live: listed, read whole or by range, written (module docstring)."""

    #: whether a slow read is worth a second, hedged request
    hedgeable: bool = False
    #: whether consecutive chunks of one object are best read by one request
    #: (:meth:`read_group`): where each request pays a round trip, as on S3
    coalesces: bool = False

    # -- at open: blocking ------------------------------------------------------------------

    @abc.abstractmethod
    def list(self, url: str) -> list[Shard]:
        """Every object under a prefix (or in a folder, recursively), sorted by URL.

        Raises:
            NotFoundError: the bucket or folder does not exist.
            FetchError: the store refused or could not be reached.
        """

    @abc.abstractmethod
    def head(self, url: str) -> Shard:
        """One object's size (and ETag, where the store has them).

        Raises:
            NotFoundError: no such object (the message says whether the bucket exists).
            FetchError: the store refused or could not be reached.
        """

    @abc.abstractmethod
    def read(self, url: str) -> bytes | None:
        """A whole (small) object, or ``None`` where there is no such object."""

    @abc.abstractmethod
    def write(self, url: str, data: bytes) -> None:
        """Write a whole object atomically (one PUT; a local file replaced at once)."""

    @abc.abstractmethod
    def delete(self, urls: Iterable[str]) -> None:
        """Remove objects; missing ones are fine."""

    # -- in the fetch engine: async ---------------------------------------------------------

    @abc.abstractmethod
    async def read_into(self, request: ChunkRequest, out: memoryview) -> Timing:
        """Read ``request`` into ``out[:request.length]``: one attempt, no retry.

        Raises:
            ChunkFailure, S3ErrorResponse, OSError, ...: whatever the attempt met; the
                caller classifies it with :func:`._errors.verdict`.
        """

    async def read_group(
        self,
        request: ChunkRequest,
        outs: Sequence[memoryview],
        filled: Callable[[int], None] | None,
    ) -> Timing:
        """Read ``request`` (a range of consecutive chunks) into ``outs`` (a buffer per
        chunk, in order), calling ``filled(i)`` as soon as ``outs[i]`` is whole: one
        attempt, no retry. This default reads chunk by chunk; stores that coalesce
        (:attr:`coalesces`) make one request of it."""
        loop = asyncio.get_running_loop()
        start, first_byte, offset = loop.time(), None, request.offset
        for i, out in enumerate(outs):
            part = replace(request, offset=offset, length=len(out))
            timing = await self.read_into(part, out)
            first_byte = timing.first_byte if first_byte is None else first_byte
            offset += len(out)
            if filled is not None:
                filled(i)
        return Timing(first_byte or 0.0, loop.time() - start)

    def stats(self) -> dict[str, Any]:
        """What the store can tell about its reads (transport, connections)."""
        return {}

    async def aclose(self) -> None:  # noqa: B027 - stores without resources need nothing
        """Release connections and clients."""


class LocalStore(Store):
    """Local files; ranges read with ``preadv`` straight into the buffer (in a thread)."""

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
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
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

    async def read_into(self, request: ChunkRequest, out: memoryview) -> Timing:
        loop = asyncio.get_running_loop()
        start = loop.time()
        path = _path(request.url)

        def read() -> int:
            fd = os.open(path, os.O_RDONLY)
            try:
                if request.size is not None and os.fstat(fd).st_size != request.size:
                    raise ChunkFailure(
                        "changed", f"its size is {os.fstat(fd).st_size}, not {request.size}"
                    )
                return os.preadv(fd, [out[: request.length]], request.offset)
            finally:
                os.close(fd)

        n = await loop.run_in_executor(None, read)
        if n != request.length:
            raise ChunkFailure("truncated", f"read {n} of {request.length} bytes from {path}")
        elapsed = loop.time() - start
        return Timing(elapsed, elapsed)


def _path(url: str) -> Path:
    return local_path(url).expanduser().absolute()


class Stores:
    """One store per scheme, made on first use: the consumer's way to every object.

    Args:
        options: how to reach S3.
    """

    def __init__(self, options: S3Options | None = None) -> None:
        self.options = options
        self._stores: dict[str, Store] = {}

    def for_url(self, url: str) -> Store:
        """The store of ``url`` (``s3://`` or local)."""
        scheme = scheme_of(url)
        store = self._stores.get(scheme)
        if store is None:
            if scheme == "s3":
                from ._s3 import S3Options
                from ._s3store import S3Store

                store = S3Store((self.options or S3Options()).resolve())
            else:
                store = LocalStore()
            self._stores[scheme] = store
        return store

    def read(self, url: str) -> bytes | None:
        """A whole (small) object, or ``None`` where there is none (see :meth:`Store.read`)."""
        return self.for_url(url).read(url)

    def write(self, url: str, data: bytes) -> None:
        """Write a whole object atomically (see :meth:`Store.write`)."""
        self.for_url(url).write(url, data)

    def delete(self, urls: Iterable[str]) -> None:
        """Remove objects; missing ones are fine (see :meth:`Store.delete`)."""
        for url in urls:
            self.for_url(url).delete([url])

    def s3_client(self) -> Any:
        """The S3 store's blocking botocore client (for what only S3 has: multipart)."""
        from ._s3store import S3Store

        store = self.for_url("s3://bucket/")
        assert isinstance(store, S3Store)
        return store.objects.client
