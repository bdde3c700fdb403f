"""The store interface: the one seam between asyncstream and where shards live.

A :class:`Store` reads a byte range of an object into a caller's buffer (a ring slot) and
says what it did; errors it meets are mapped by the one table of :mod:`._errors`. Two
implementations: the S3 store (:mod:`._s3store`: any S3-compatible endpoint, HTTP or
HTTPS) and :class:`LocalStore` (files). The fetch engine holds one of each and picks by
the URL's scheme (:func:`scheme_of`), so it never builds a client itself; with a cache
folder, the S3 store is wrapped in a :class:`~._cache.CachedStore`, a store too.
"""

from __future__ import annotations

import abc
import asyncio
import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

from ._errors import ChunkFailure

__all__ = ["ChunkRequest", "LocalStore", "Store", "Timing", "scheme_of"]


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
    """

    url: str
    offset: int
    length: int
    etag: str | None = None
    final: bool = True
    size: int | None = None


@dataclass(frozen=True, slots=True)
class Timing:
    """Seconds from the request to the response headers, and to the last byte.

    ``cached``: served from the local cache (:mod:`._cache`), which says nothing about
    how long the store itself takes, so the engine leaves it out of its predictions.
    """

    first_byte: float
    total: float
    cached: bool = False


def scheme_of(url: str) -> str:
    """``"s3"`` or ``"file"``: which store serves ``url``."""
    scheme = urlparse(url).scheme
    if scheme not in ("s3", "file"):
        raise ValueError(f"{url!r}: no store for the scheme {scheme!r}")
    return scheme


class Store(abc.ABC):
    """Reads byte ranges of objects into buffers, in the fetch engine's event loop."""

    #: whether a slow read is worth a second, hedged request
    hedgeable: bool = False

    @abc.abstractmethod
    async def read_into(self, request: ChunkRequest, out: memoryview) -> Timing:
        """Read ``request`` into ``out[:request.length]``: one attempt, no retry.

        Raises:
            ChunkFailure, S3ErrorResponse, OSError, ...: whatever the attempt met; the
                caller classifies it with :func:`._errors.verdict`.
        """

    def stats(self) -> dict[str, Any]:
        """What the store can tell about its reads (transport, connections)."""
        return {}

    async def aclose(self) -> None:  # noqa: B027 - stores without resources need nothing
        """Release connections and clients."""


class LocalStore(Store):
    """Local files, read with ``preadv`` straight into the buffer (in a worker thread)."""

    async def read_into(self, request: ChunkRequest, out: memoryview) -> Timing:
        loop = asyncio.get_running_loop()
        start = loop.time()
        path = unquote(urlparse(request.url).path)

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
