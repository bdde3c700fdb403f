"""The store interface: the one seam between asyncstream and where shards live.

A :class:`Store` has two halves. At open, in the consumer's process and blocking: list
the objects under a prefix, HEAD one, and read, write or delete a whole small object
(indexes, manifests). In the fetch engine's event loop: read a byte range of an object
into a caller's buffer (a ring slot). Whatever fails is mapped by the one table of
:mod:`._errors`. Two implementations: the S3 store (:mod:`._s3store`, its blocking half
in :mod:`._s3objects`: any S3-compatible endpoint, HTTP or HTTPS) and
:class:`~._localstore.LocalStore` (files). :class:`~._stores.Stores` picks one by the
URL's scheme, parsed in one place (:func:`~._urls.scheme_of`), so no other module looks at
a scheme or builds a client. With a cache folder, the engine wraps the S3 store in a
:class:`~._cache.CachedStore`, a store too. This module holds the interface alone, so that
every store, and what picks one, stand on it.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..shards._urls import Shard

__all__ = ["ChunkRequest", "Store", "Timing"]


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
