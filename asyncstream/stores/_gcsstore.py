"""The Google Cloud Storage store: ``gs://bucket/name`` (settings, credentials and errors:
:mod:`._gcs`; listing, uploads and small objects: :mod:`._gcsobjects`).

The engine's ranged reads take the project's own HTTP/1.1 client (:mod:`._http`), as the
S3 store's do: each chunk is one JSON API media download on a kept-alive connection,
``GET {endpoint}/download/storage/v1/b/{bucket}/o/{name}?alt=media&ifGenerationMatch=N``
with ``Range: bytes=a-b`` and a bearer token from ``google-auth`` (none against an
emulator), whose body lands straight in the ring slot, over TLS too.

Every chunk is of the generation that was listed (the shard's ``etag``): Cloud Storage
answers ``412`` where the object was replaced since (``ifGenerationMatch``), and every
response's ``x-goog-generation`` and ``Content-Range`` total are checked against the
listing as well, for servers that ignore the condition (emulators): either is a
permanent ``changed`` failure, raised at once. A ``Content-Range`` that is missing or
names other bytes than those asked is a permanent ``range`` failure
(:func:`._errors.check_range`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._errors import ChunkFailure, check_range
from ._gcs import GCSSettings, GoogleAuth, gcs_error, object_path, parse_gs_url
from ._httpconn import Reply, Scatter
from ._httpstore import ObjectStore
from ._origin import Origin
from ._retry import Timeouts
from ._store import ChunkRequest, StoreSetup

if TYPE_CHECKING:
    from ._gcsobjects import GCSObjects

__all__ = ["GCSStore"]


class GCSStore(ObjectStore):
    """Objects on Google Cloud Storage, or an emulator of it (see the module docstring).

    Args:
        settings: endpoint, credentials, project (:class:`~._gcs.GCSSettings`).
        timeouts: the time limits of one read.
        check_etag: require every chunk to come from the listed generation.
        connections: the most kept-alive connections.
    """

    hedgeable = True
    cacheable = True
    lists_folders = True

    def __init__(
        self,
        settings: GCSSettings,
        *,
        timeouts: Timeouts | None = None,
        check_etag: bool = True,
        connections: int = 16,
    ) -> None:
        super().__init__(timeouts=timeouts, check_etag=check_etag, connections=connections)
        self.settings = settings
        self.auth = GoogleAuth(settings)
        self._objects: GCSObjects | None = None
        self._origin = Origin.of(settings.endpoint)

    @classmethod
    def from_setup(cls, setup: StoreSetup) -> GCSStore:
        return cls(
            GCSSettings.of(setup.settings),
            timeouts=setup.timeouts,
            check_etag=setup.check_etag,
            connections=setup.connections,
        )

    @classmethod
    def canonical(cls, url: str) -> str:
        parse_gs_url(url)  # a malformed URL or bucket name fails here
        return url

    def is_folder(self, url: str) -> bool:
        name = parse_gs_url(url)[1]
        return not name or name.endswith("/")

    # -- at open: the blocking half (see :mod:`._gcsobjects`) -------------------------------

    @property
    def objects(self) -> GCSObjects:
        """The blocking half, made on first use: the engine's process, which only reads
        ranges, never imports it (nor ``requests``)."""
        if self._objects is None:
            from ._gcsobjects import GCSObjects

            self._objects = GCSObjects(self.settings, self.auth)
        return self._objects

    def prepare(self, url: str) -> None:
        self.objects.check_bucket(url)

    def upload(self, url: str, path: Path) -> str | None:
        generation = self.objects.upload(url, path)
        path.unlink()
        return generation

    def close(self) -> None:
        if self._objects is not None:
            self._objects.close()

    # -- in the fetch engine ---------------------------------------------------------------

    async def aclose(self) -> None:
        self._close_pools()

    def stats(self) -> dict[str, Any]:
        return {
            "store": self.settings.describe(),
            "transport": "direct",
            **self._pool_stats(),
            "tls": self._origin.tls,  # the one endpoint's, read or not
            "anonymous": self.settings.anonymous,
        }

    async def _get(self, request: ChunkRequest, out: Scatter) -> float:
        bucket, name = parse_gs_url(request.url)
        target = f"{self.settings.endpoint}/download/storage/v1/{object_path(bucket, name)}"
        target += "?alt=media"
        if self.check_etag and request.etag:
            target += f"&ifGenerationMatch={request.etag}"
        headers = self.auth.ready()
        if headers is None:  # a token to fetch or refresh: blocking, in a thread
            headers = await asyncio.to_thread(self.auth.headers, request.url)
        headers["Range"] = f"bytes={request.offset}-{request.offset + request.length - 1}"

        def accept(reply: Reply) -> None:  # before the first slot of the body is handed on
            self._check(request, reply)

        pool = self._pool(self._origin)
        reply, headers_at = await pool.get(target, headers, out, self.timeouts, accept)
        if reply.status >= 300:
            raise gcs_error(reply.status, reply.body, request.url, self.settings)
        return headers_at

    def _check(self, request: ChunkRequest, reply: Reply) -> None:
        """The response is of the listed generation (else: permanent ``changed``) and
        exactly the range asked (else: permanent ``range``: :func:`._errors.check_range`)."""
        fields = reply.fields
        generation = fields.get("x-goog-generation")
        if self.check_etag and request.etag and generation not in (None, request.etag):
            raise ChunkFailure("changed", f"its generation is {generation}, it was {request.etag}")
        content_range = fields.get("content-range")
        check_range(reply.status, content_range, request.offset, request.length, request.size)
