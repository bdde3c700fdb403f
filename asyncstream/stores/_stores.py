"""The consumer's way to every object: one store per URL scheme, made on first use."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..shards._urls import scheme_of
from ._localstore import LocalStore
from ._s3 import S3Options
from ._s3store import S3Store
from ._store import Store

__all__ = ["Stores"]


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
        store = self.for_url("s3://bucket/")
        assert isinstance(store, S3Store)
        return store.objects.client
