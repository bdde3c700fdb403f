"""What every store read over HTTP shares: the blocking half as one object of its own, and
one ranged GET per read under the chunk's deadline.

S3, Google Cloud Storage, Azure Blob and web URLs are read alike: the engine's reads are
one ranged GET each, received straight into the ring's slots (:mod:`._http`), a group of
consecutive chunks by one GET (``coalesces``), the whole of it within
:attr:`~._retry.Timeouts.chunk`: a store says how to make its GET
(:meth:`HTTPStore._get`), this module does the rest once. The object stores' blocking half
(listing, sizes, small objects, uploads) is an object each makes
(:attr:`ObjectStore.objects`), which :class:`ObjectStore` hands those calls to.
"""

from __future__ import annotations

import abc
import asyncio
import ssl
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from ..shards._urls import Shard
from ._errors import ChunkFailure
from ._http import ConnectionPool
from ._httpconn import Scatter
from ._origin import Origin
from ._retry import Timeouts
from ._store import ChunkRequest, Store, Timing

__all__ = ["BlockingObjects", "HTTPStore", "ObjectStore"]


class BlockingObjects(Protocol):
    """A store's blocking half: what :class:`HTTPStore` hands its calls to."""

    def list(self, url: str) -> list[Shard]: ...

    def head(self, url: str) -> Shard: ...

    def read(self, url: str) -> bytes | None: ...

    def write(self, url: str, data: bytes) -> object: ...

    def delete(self, urls: Iterable[str]) -> None: ...


class HTTPStore(Store):
    """A store whose reads are ranged GETs (module docstring), over kept-alive connections
    pooled by origin. Subclasses implement :meth:`_get` (and :meth:`_ssl_context` for
    HTTPS origins of their own trust).

    Args:
        timeouts: the time limits of one read.
        check_etag: require every chunk to come from the listed object version.
        connections: the most kept-alive connections per origin.
    """

    coalesces = True

    def __init__(
        self, *, timeouts: Timeouts | None = None, check_etag: bool = True, connections: int = 16
    ) -> None:
        self.timeouts = timeouts or Timeouts()
        self.check_etag = check_etag
        self.connections = connections
        self._pools: dict[Origin, ConnectionPool] = {}

    def _ssl_context(self) -> ssl.SSLContext | None:
        """The TLS trust of HTTPS origins (``None``: the system's)."""
        return None

    def _pool(self, origin: Origin) -> ConnectionPool:
        """The connections to ``origin``, made at its first read."""
        pool = self._pools.get(origin)
        if pool is None:
            context = self._ssl_context() if origin.tls else None
            pool = self._pools[origin] = ConnectionPool(
                origin, ssl_context=context, limit=self.connections
            )
        return pool

    def _close_pools(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()

    def _pool_stats(self) -> dict[str, Any]:
        """``tls``, ``connections_opened`` and ``connections_reused`` over every origin."""
        pools = self._pools.values()
        return {
            "tls": any(origin.tls for origin in self._pools),
            "connections_opened": sum(p.opened for p in pools),
            "connections_reused": sum(p.reused for p in pools),
        }

    # -- in the fetch engine ------------------------------------------------------------

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
        try:
            async with asyncio.timeout(self.timeouts.chunk) as whole:
                headers_at = await self._get(request, Scatter(outs, filled))
        except TimeoutError:
            if whole.expired():
                raise ChunkFailure(
                    "chunk_timeout", f"chunk not complete within {self.timeouts.chunk:g} s"
                ) from None
            raise
        return Timing(headers_at - start, loop.time() - start)

    @abc.abstractmethod
    async def _get(self, request: ChunkRequest, view: Scatter) -> float:
        """One ranged GET of ``request`` into ``view`` (one attempt, no retry); returns
        the loop time its response's headers arrived.

        Raises:
            What the attempt met, for :func:`._errors.verdict`.
        """


class ObjectStore(HTTPStore):
    """An :class:`HTTPStore` whose blocking half is one object (:attr:`objects`), which
    lists, sizes, reads, writes and deletes for it."""

    @property
    @abc.abstractmethod
    def objects(self) -> BlockingObjects:
        """The blocking half (made when first needed, or with the store)."""

    def list(self, url: str) -> list[Shard]:
        return self.objects.list(url)

    def head(self, url: str) -> Shard:
        return self.objects.head(url)

    def read(self, url: str) -> bytes | None:
        return self.objects.read(url)

    def write(self, url: str, data: bytes) -> None:
        self.objects.write(url, data)

    def delete(self, urls: Iterable[str]) -> None:
        self.objects.delete(urls)
