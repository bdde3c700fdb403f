"""The consumer's way to every object: one store per URL scheme, made on first use."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import replace

from ._registry import make_store, scheme_of
from ._s3 import S3Options
from ._store import Store, StoreSetup

__all__ = ["Stores"]


class Stores:
    """One store per scheme (:mod:`._registry`), made on first use: the consumer's way to
    every object.

    Args:
        options: how to reach S3.
        connections: the most requests one store makes at once (uploads' parts).
        withhold: web origins (``scheme://host:port``) sent none of the configured
            credentials (those only an index named, :mod:`asyncstream.dataset._trust`).
    """

    def __init__(
        self,
        options: S3Options | None = None,
        *,
        connections: int = 16,
        withhold: Collection[str] = (),
    ) -> None:
        self.options = options
        self.connections = connections
        self.withhold = frozenset(withhold)
        self._stores: dict[str, Store] = {}

    def for_url(self, url: str) -> Store:
        """The store of ``url``'s scheme."""
        scheme = scheme_of(url)
        store = self._stores.get(scheme)
        if store is None:
            setup = replace(StoreSetup(), connections=self.connections)
            if self.options is not None:
                setup = replace(setup, options=self.options)
            store = self._stores[scheme] = make_store(scheme, setup, self.withhold)
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

    def close(self) -> None:
        """Release the stores' blocking resources (upload threads)."""
        for store in self._stores.values():
            store.close()
