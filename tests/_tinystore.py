"""A tiny store, the example of adding one: one module, and one ``register_store`` call
in the test that uses it (tests/test_registry.py).

``tiny:///abs/folder/name.tar`` names a local file, read without the local-file store:
listed with ``os.walk``, sized with ``os.stat``, read by range with ``os.pread`` into the
engine's buffer. A relative path (``tiny://data/name.tar``) is found under the folder
given as the store's one setting, ``configure_store("tiny", root=...)``. Missing files
map to :class:`~asyncstream.NotFoundError`, a file that ends early to a ``truncated``
:class:`ChunkFailure` (retried as transient).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterable
from typing import Any

from asyncstream import NotFoundError, Shard
from asyncstream.stores._errors import ChunkFailure
from asyncstream.stores._store import ChunkRequest, Store, StoreSetup, Timing

SCHEME = "tiny://"


class TinyStore(Store):
    """Local files under the ``tiny://`` scheme (module docstring)."""

    def __init__(self, root: str = "") -> None:
        self.root = root

    @classmethod
    def from_setup(cls, setup: StoreSetup) -> TinyStore:
        settings: dict[str, Any] = dict(setup.settings)
        return cls(root=str(settings.get("root", "")))

    def _path(self, url: str) -> str:
        return os.path.join(self.root, url[len(SCHEME) :])

    def list(self, url: str) -> list[Shard]:
        root = self._path(url)
        if not os.path.isdir(root):
            raise NotFoundError(f"{url}: no such folder", url=url)
        found = [
            Shard(
                url.rstrip("/") + "/" + os.path.relpath(os.path.join(folder, name), root),
                os.stat(os.path.join(folder, name)).st_size,
            )
            for folder, _, names in os.walk(root)
            for name in names
        ]
        return sorted(found, key=lambda s: s.url)

    def head(self, url: str) -> Shard:
        try:
            return Shard(url, os.stat(self._path(url)).st_size)
        except FileNotFoundError:
            raise NotFoundError(f"{url}: no such object", url=url) from None

    def read(self, url: str) -> bytes | None:
        try:
            with open(self._path(url), "rb") as f:
                return f.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def write(self, url: str, data: bytes) -> None:
        with open(self._path(url), "wb") as f:
            f.write(data)

    def delete(self, urls: Iterable[str]) -> None:
        for url in urls:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(url))

    async def read_into(self, request: ChunkRequest, out: memoryview) -> Timing:
        loop = asyncio.get_running_loop()
        start = loop.time()

        def read() -> int:
            fd = os.open(self._path(request.url), os.O_RDONLY)
            try:
                return os.preadv(fd, [out[: request.length]], request.offset)
            finally:
                os.close(fd)

        n = await loop.run_in_executor(None, read)
        if n != request.length:
            raise ChunkFailure("truncated", f"read {n} of {request.length} bytes")
        elapsed = loop.time() - start
        return Timing(elapsed, elapsed)
