"""The store interface: the one seam between asyncstream and where shards live.

A :class:`Store` serves the URLs of one scheme (the registry, :mod:`._registry`, says
which: the one place a scheme is read) and has two halves. At open, in the consumer's
process and blocking, a store implements:

* :meth:`~Store.list`: every object under a prefix or in a folder, with its size (and
  ETag or other version tag, where the store has one), sorted by URL;
* :meth:`~Store.head`: one object's size and ETag;
* :meth:`~Store.read`, :meth:`~Store.write`, :meth:`~Store.delete`: whole small objects
  (indexes, manifests); :meth:`~Store.upload` a local file (``pack``'s shards);
* :meth:`~Store.is_folder` and :meth:`~Store.canonical`: what a URL of its scheme names,
  so no other module needs to parse one.

In the fetch engine's event loop: :meth:`~Store.open` (make clients), then
:meth:`~Store.read_into` (one byte range of an object into a caller's buffer, a ring
slot; :meth:`~Store.read_group` for several consecutive ranges at once), :meth:`~Store.stats`
and :meth:`~Store.aclose`. Errors are mapped at the store's edge, as httpx's transports
do: the blocking half raises the exception tree of :mod:`asyncstream._exceptions`
(``NotFoundError``, ``AccessDeniedError``, ``TransientFetchError``, ...), chained ``from``
the third-party error; ``read_into`` raises what the attempt met (a
:class:`~._errors.ChunkFailure` for a short or changed object, or the client's own error),
which the engine classifies by the one table of :mod:`._errors` (transient: retried;
permanent: raised at the consumer). A store is made from a :class:`StoreSetup` by
:meth:`Store.from_setup`.

Two implementations ship: the S3 store (:mod:`._s3store`, its blocking half in
:mod:`._s3objects`: any S3-compatible endpoint, HTTP or HTTPS) and
:class:`~._localstore.LocalStore` (files). With a cache folder, the engine wraps a
store whose :attr:`~Store.cacheable` is set in a :class:`~._cache.CachedStore`, a store
too. This module holds the interface alone, so that every store, and the registry that
picks one, stand on it.
"""

from __future__ import annotations

import abc
import asyncio
import operator
import posixpath
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from ..shards._urls import Shard
from ._retry import Timeouts
from ._s3 import S3Options

__all__ = ["ChunkRequest", "Store", "StoreSetup", "Timing"]


@dataclass(frozen=True, kw_only=True)
class StoreSetup:
    """What a store is made with (:meth:`Store.from_setup`); each store reads what it needs.

    Attributes:
        options: how to reach an S3-compatible endpoint (resolved).
        timeouts: the time limits of one read.
        check_etag: require every chunk to come from the listed object version.
        connections: the most kept-alive connections per origin.
        transport: ``"auto"`` or ``"aiohttp"`` (see :mod:`._s3store`).
        settings: the store's own settings, given per scheme with
            :func:`~._registry.configure_store` (each store says which it reads).
    """

    options: S3Options = field(default_factory=S3Options)
    timeouts: Timeouts = field(default_factory=Timeouts)
    check_etag: bool = True
    connections: int = 16
    transport: Literal["auto", "aiohttp"] = "auto"
    settings: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ChunkRequest:
    """A byte range of a shard.

    Attributes:
        url: the shard, ``s3://bucket/key``, ``file:///path`` or another store's URL.
        offset: first byte of the range.
        length: bytes in the range (at most the slot size).
        etag: the shard's ETag from the listing, if any.
        final: whether this is the shard's last chunk (counts shards in statistics).
        size: the shard's size from the listing, if known (a response naming another
            total size means the object was replaced).
        endpoint: the name of the options that reach the shard's store (``""``: the
            stream's own; else one of ``EngineConfig.endpoints``): with the URL's
            scheme, the :class:`~._registry.StoreKey` of the engine's store.
    """

    url: str
    offset: int
    length: int
    etag: str | None = None
    final: bool = True
    size: int | None = None
    endpoint: str = ""

    def __reduce__(self) -> tuple[type[ChunkRequest], tuple[Any, ...]]:
        # Pickled as its fields (the engine's Fetch messages): a frozen dataclass's own
        # pickling restores each field through object.__setattr__, three times slower.
        return ChunkRequest, _request_fields(self)


# Every field of a ChunkRequest, in order, as one tuple: what it is pickled as.
_request_fields = operator.attrgetter(*(f.name for f in fields(ChunkRequest)))


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
    #: whether reads are local (no connection whose rate a group would hold): a group
    #: then takes as many free slots as ``coalesce_bytes`` allows, not a fair share
    local: bool = False
    #: whether the engine keeps what it reads in its cache folder (remote stores)
    cacheable: bool = False
    #: whether one listing of a folder is cheaper than a HEAD per named object (a
    #: listing of 1,000 keys is one request on S3)
    lists_folders: bool = False
    #: whether objects can be written (``pack``, an index's manifest); a read-only store
    #: refuses in :meth:`prepare`, before any work
    writable: bool = True

    @classmethod
    def from_setup(cls, setup: StoreSetup) -> Store:
        """A store made with ``setup`` (what the registry calls); this default takes none."""
        return cls()

    # -- what a URL of the store's scheme names ---------------------------------------------

    @classmethod
    def canonical(cls, url: str) -> str:
        """The canonical form of ``url`` (this default: as it is).

        Raises:
            ShardURLError: a URL this store cannot read.
        """
        return url

    @classmethod
    def join(cls, folder: str, ref: str) -> str:
        """``ref``, a relative path, resolved against the folder URL ``folder``,
        normalising ``..`` (this default: within the part after ``scheme://host/``)."""
        scheme, _, rest = folder.partition("://")
        root, _, key = rest.partition("/")
        path = posixpath.normpath(posixpath.join("/", key, ref)).lstrip("/")
        return f"{scheme}://{root}/{path}"

    def is_folder(self, url: str) -> bool:
        """Whether ``url`` names a prefix or folder (every object under it), rather than
        one object. This default: it ends with ``/``."""
        return url.endswith("/")

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

    def prepare(self, url: str) -> None:  # noqa: B027 - most stores need nothing
        """Make sure objects can be written under the folder ``url`` (``pack``): a local
        folder is made; a missing bucket is a ``NotFoundError``."""

    def upload(self, url: str, path: Path) -> str | None:
        """Store the local file ``path`` as the object ``url`` (then ``path`` may be gone);
        returns the object's ETag where the store has one. This default reads the file
        and :meth:`write` s it whole."""
        self.write(url, path.read_bytes())
        path.unlink()
        return None

    def close(self) -> None:  # noqa: B027 - stores without resources need nothing
        """Release what the blocking half holds (threads)."""

    # -- in the fetch engine: async ---------------------------------------------------------

    async def open(self) -> Store:
        """Make the clients the engine's reads need (this default: none); returns the
        store."""
        return self

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
