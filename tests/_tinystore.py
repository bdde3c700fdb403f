"""A tiny store, the example of adding one: one module, and one ``register_store`` call
in the test that uses it (tests/test_registry.py).

``tiny:///abs/folder/name.tar`` names a local file, read without the local-file store:
listed with ``os.walk``, sized with ``os.stat``, read by range with ``os.pread`` into the
engine's buffer. Missing files map to :class:`~asyncstream.NotFoundError`, a file that
ends early to a ``truncated`` :class:`ChunkFailure` (retried as transient).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterable

from asyncstream import NotFoundError, Shard
from asyncstream.stores._errors import ChunkFailure
from asyncstream.stores._store import ChunkRequest, Store, Timing

SCHEME = "tiny://"


def _path(url: str) -> str:
    return url[len(SCHEME) :]


class TinyStore(Store):
    """Local files under the ``tiny://`` scheme (module docstring)."""

    def list(self, url: str) -> list[Shard]:
        root = _path(url)
        if not os.path.isdir(root):
            raise NotFoundError(f"{url}: no such folder", url=url)
        found = [
            Shard(SCHEME + os.path.join(folder, name), os.stat(os.path.join(folder, name)).st_size)
            for folder, _, names in os.walk(root)
            for name in names
        ]
        return sorted(found, key=lambda s: s.url)

    def head(self, url: str) -> Shard:
        try:
            return Shard(url, os.stat(_path(url)).st_size)
        except FileNotFoundError:
            raise NotFoundError(f"{url}: no such object", url=url) from None

    def read(self, url: str) -> bytes | None:
        try:
            with open(_path(url), "rb") as f:
                return f.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def write(self, url: str, data: bytes) -> None:
        with open(_path(url), "wb") as f:
            f.write(data)

    def delete(self, urls: Iterable[str]) -> None:
        for url in urls:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(_path(url))

    async def read_into(self, request: ChunkRequest, out: memoryview) -> Timing:
        loop = asyncio.get_running_loop()
        start = loop.time()

        def read() -> int:
            fd = os.open(_path(request.url), os.O_RDONLY)
            try:
                return os.preadv(fd, [out[: request.length]], request.offset)
            finally:
                os.close(fd)

        n = await loop.run_in_executor(None, read)
        if n != request.length:
            raise ChunkFailure("truncated", f"read {n} of {request.length} bytes")
        elapsed = loop.time() - start
        return Timing(elapsed, elapsed)
