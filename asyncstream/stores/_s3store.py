"""The S3 store: byte ranges of objects on any S3-compatible endpoint, HTTP or HTTPS.

Two transports (``stats()["transport"]`` says which ran):

* **direct** (the default, for ``http://`` and ``https://`` endpoints that no HTTP proxy
  sits in front of): the store's own HTTP/1.1 client (:mod:`._http`) sends each ranged GET
  on a kept-alive connection and receives the body straight into the ring slot, over TLS
  too. The SigV4 signature of every request is made by :mod:`._sigv4` (a tenth of
  botocore's ``S3SigV4Auth``'s cost, and checked against it), in headers: some
  S3-compatible stores, moto among them, refuse query-string auth. Error documents are
  parsed here (``<Code>``, ``<Message>``) and mapped by the one table of :mod:`._errors`,
  as botocore's would be. Why not a ``before-send`` hook on botocore's own client, as
  before: it needs the chunk's buffer passed beside the call (a context variable), and
  botocore still builds and parses a response object per chunk.

  botocore decides what it alone knows, through public API: the object's URL where it
  follows AWS's endpoint rules (virtual hosts, AWS's regions: ``generate_presigned_url``,
  once per object, its query string dropped), and the credentials (the standard chain and
  its refresh, or the explicit ones). An endpoint read path-style (MinIO, moto, Ceph, R2,
  nginx) needs no client: the object's URL is the endpoint, the bucket and the key
  encoded as botocore encodes it (:meth:`~._s3.S3Options.path_base`, checked against
  botocore's in ``tests/test_s3_urls.py``); credentials not given come from a plain
  botocore session's chain, their refresh run in a thread. aiobotocore's client is made
  on first need only: in a fresh engine it cost 0.35 to 0.45 s of CPU (aiobotocore's and
  aiohttp's imports, a CA bundle, the service model) on the core where the consumer opens
  the dataset, before the first sample.
* **aiohttp** (an HTTP proxy configured for the endpoint, or ``transport="aiohttp"``):
  botocore's own request on aiobotocore, whose body pieces are copied into the slot.

Checks, on either transport: the response covers exactly the requested range (another
length is a transient ``length`` failure; a ``Content-Range`` missing or naming other
bytes, a permanent ``range`` one: :func:`._errors.check_range`, shared by every store);
and the object is the one that was listed: an ETag other than the listed one (with
``check_etag``), or a ``Content-Range`` total other than the listed size, is a *permanent*
``changed`` failure, raised at once, whether or not the server honoured ``If-Match``
(which makes S3 answer 412 in the first place).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ssl
import time
import urllib.request
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import botocore.exceptions
from botocore.credentials import ReadOnlyCredentials
from botocore.exceptions import NoCredentialsError

from ._errors import ChunkFailure, S3ErrorResponse, check_range
from ._http import PROBE_AFTER, first_byte
from ._httpconn import Reply, Scatter, receive
from ._httpstore import ObjectStore
from ._origin import Origin
from ._retry import Timeouts
from ._s3 import S3Options, chain_credentials, object_url, parse_s3_url, ssl_context
from ._s3rest import error_document
from ._sigv4 import SigV4Signer
from ._store import ChunkRequest, StoreSetup

if TYPE_CHECKING:  # the blocking half is the consumer's: the engine never imports it
    from ._s3objects import S3Objects

__all__ = ["S3Store"]

T = TypeVar("T")
_CREDENTIALS_REUSE = 60.0  # seconds frozen credentials are reused before asking again


def _proxied(origin: Origin) -> bool:
    """Whether an HTTP(S) proxy is configured for this origin (botocore would use it)."""
    return origin.scheme in urllib.request.getproxies() and not urllib.request.proxy_bypass(
        origin.host
    )


def _split(url: str) -> tuple[str, str]:
    bucket, _, key = url[len("s3://") :].partition("/")
    return bucket, key


class S3Store(ObjectStore):
    """Ranged GETs from an S3-compatible endpoint (see the module docstring).

    Args:
        options: how to reach the store (endpoint, credentials, TLS).
        timeouts: the time limits of one attempt.
        check_etag: require every chunk to come from the listed object version.
        connections: the most kept-alive connections per origin.
        transport: ``"auto"`` (direct unless proxied) or ``"aiohttp"``.
    """

    hedgeable = True
    cacheable = True
    lists_folders = True

    def __init__(
        self,
        options: S3Options,
        *,
        timeouts: Timeouts | None = None,
        check_etag: bool = True,
        connections: int = 16,
        transport: Literal["auto", "aiohttp"] = "auto",
    ) -> None:
        super().__init__(timeouts=timeouts, check_etag=check_etag, connections=connections)
        self.options = options
        self._objects: S3Objects | None = None  # the blocking half, on first use
        self.transport = transport
        self._stack = contextlib.AsyncExitStack()
        self._client: Any = None  # aiobotocore's, on first need (_aio_client)
        self._client_lock = asyncio.Lock()
        self._urls: dict[str, str] = {}  # s3:// URL -> the object's HTTP(S) URL
        self._routes: dict[str, tuple[Origin, bool]] = {}  # that URL -> (origin, direct)
        self._credentials: Any = None  # the chain's (refreshable) credentials
        self._frozen: tuple[Any, float] | None = None
        self._signer: SigV4Signer | None = None  # made with the client (its region)
        self._ssl: ssl.SSLContext | None = None
        self._used: set[str] = set()
        self._uploads: ThreadPoolExecutor | None = None

    @classmethod
    def from_setup(cls, setup: StoreSetup) -> S3Store:
        return cls(
            setup.options.resolve(),
            timeouts=setup.timeouts,
            check_etag=setup.check_etag,
            connections=setup.connections,
            transport=setup.transport,
        )

    @classmethod
    def canonical(cls, url: str) -> str:
        parse_s3_url(url)  # a malformed URL or bucket name fails here
        return url

    def is_folder(self, url: str) -> bool:
        key = parse_s3_url(url)[1]
        return not key or key.endswith("/")

    # -- at open: the blocking half (see :mod:`._s3objects`) --------------------------------

    @property
    def objects(self) -> S3Objects:
        if self._objects is None:
            from ._s3objects import S3Objects

            self._objects = S3Objects(self.options)
        return self._objects

    def prepare(self, url: str) -> None:
        self.objects.check_bucket(url)

    def upload(self, url: str, path: Path) -> str | None:
        if self._uploads is None:
            self._uploads = ThreadPoolExecutor(self.connections, "asyncstream-upload")
        from ._s3upload import upload_file

        return upload_file(self.objects, url, path, self._uploads)

    def close(self) -> None:
        if self._uploads is not None:
            self._uploads.shutdown(wait=True)
            self._uploads = None
        if self._objects is not None:
            self._objects.close()

    # -- in the fetch engine ------------------------------------------------------------------

    async def open(self) -> S3Store:
        """Ready to read: the credentials' chain read where none were given (in a thread:
        a chain may ask an instance's metadata service). The botocore client is made on
        first need (:meth:`_aio_client`)."""
        if self.options.credentials is None:
            self._credentials = await asyncio.to_thread(chain_credentials, self.options)
        return self

    async def _aio_client(self) -> Any:
        """aiobotocore's client, made once, on first need: to resolve a URL botocore alone
        can (:meth:`_object_url`) and for the aiohttp transport."""
        async with self._client_lock:
            if self._client is None:
                from aiobotocore.session import AioSession

                t = self.timeouts
                options = dataclasses.replace(
                    self.options,
                    connect_timeout=t.connect,
                    # Our own first-byte and stall timeouts fire first; only a backstop.
                    read_timeout=max(t.first_byte, t.stall) + 5.0,
                    max_pool_connections=self.connections,
                )
                session = AioSession(profile=options.profile)
                self._client = await self._stack.enter_async_context(
                    session.create_client("s3", **options.client_kwargs(retries=False))
                )
        return self._client

    async def aclose(self) -> None:
        self._close_pools()
        await self._stack.aclose()

    def stats(self) -> dict[str, Any]:
        return {"transport": self._transport(), **self._pool_stats()}

    def _transport(self) -> str:
        """The transport reads take (have taken): ``"direct"`` or ``"aiohttp"``."""
        if self._used:
            return "direct" if "direct" in self._used else "aiohttp"
        endpoint = self.options.endpoint_url or "https://s3.amazonaws.com"
        direct = self.transport == "auto" and not _proxied(Origin.of(endpoint))
        return "direct" if direct else "aiohttp"

    # -- reading ---------------------------------------------------------------------------

    async def _get(self, request: ChunkRequest, view: Scatter) -> float:
        url = await self._object_url(request.url)
        route = self._routes.get(url)
        if route is None:  # once per object: the proxy check reads the whole environment
            origin = Origin.of(url)
            route = self._routes[url] = (origin, self.transport == "auto" and not _proxied(origin))
        origin, direct = route
        if direct:
            self._used.add("direct")
            return await self._direct(request, origin, view)
        self._used.add("aiohttp")
        return await self._botocore(request, origin, view)

    async def _object_url(self, url: str) -> str:
        """The object's HTTP(S) URL, as botocore resolves it (once per object)."""
        found = self._urls.get(url)
        if found is None:
            bucket, key = _split(url)
            base = self.options.path_base(bucket)
            if base is not None:
                found = object_url(base, key)
            else:
                client = await self._aio_client()
                presigned = await client.generate_presigned_url(
                    "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=60
                )
                found = str(presigned).partition("?")[0]
            self._urls[url] = found
        return found

    async def _frozen_credentials(self) -> Any:
        now = time.monotonic()
        if self._frozen is not None and now - self._frozen[1] < _CREDENTIALS_REUSE:
            return self._frozen[0]
        explicit = self.options.credentials
        if explicit is not None:
            frozen = ReadOnlyCredentials(
                explicit.access_key_id, explicit.secret_access_key, explicit.session_token
            )
        elif self._credentials is None:
            raise NoCredentialsError()
        else:  # a refresh may ask a service (STS, instance metadata): not on the loop
            frozen = await asyncio.to_thread(self._credentials.get_frozen_credentials)
        self._frozen = (frozen, now)
        return frozen

    async def _signed(self, request: ChunkRequest) -> tuple[str, dict[str, str]]:
        """The chunk's URL and headers, SigV4-signed in headers."""
        url = await self._object_url(request.url)
        credentials = await self._frozen_credentials()  # raises where there are none
        if self._signer is None:
            self._signer = SigV4Signer(self.options.signing_region)
        return url, self._signer.headers(
            url,
            self._headers(request),
            access_key=credentials.access_key,
            secret_key=credentials.secret_key,
            token=credentials.token,
        )

    def _ssl_context(self) -> ssl.SSLContext | None:
        if self._ssl is None:
            self._ssl = ssl_context(self.options)
        return self._ssl

    def _headers(self, request: ChunkRequest) -> dict[str, str]:
        headers = {"Range": f"bytes={request.offset}-{request.offset + request.length - 1}"}
        if self.check_etag and request.etag:
            headers["If-Match"] = request.etag
        return headers

    async def _direct(self, request: ChunkRequest, origin: Origin, out: Scatter) -> float:
        url, headers = await self._signed(request)

        def accept(reply: Reply) -> None:  # before the first slot of the body is handed on
            fields = reply.fields
            self._check(request, reply.status, fields.get("etag"), fields.get("content-range"))

        # The pool's exchange times the response's head itself (first_byte), and the
        # body by the stall and chunk timeouts: not the whole exchange as a first byte.
        reply, headers_at = await self._pool(origin).get(url, headers, out, self.timeouts, accept)
        if reply.status >= 300:
            raise _error_response(reply.status, reply.body)
        return headers_at

    async def _botocore(self, request: ChunkRequest, origin: Origin, out: Scatter) -> float:
        bucket, key = _split(request.url)
        params: dict[str, Any] = {"Bucket": bucket, "Key": key}
        headers = self._headers(request)
        params["Range"] = headers["Range"]
        if "If-Match" in headers:
            params["IfMatch"] = headers["If-Match"]
        client = await self._aio_client()
        response = await first_byte(
            self._unless_mismatched(origin, client.get_object(**params)), self.timeouts
        )
        headers_at = asyncio.get_running_loop().time()
        raw = response["Body"].raw_stream  # the aiohttp ClientResponse
        complete = False
        try:
            status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
            self._check(request, status, response.get("ETag"), response.get("ContentRange"))
            if response.get("ContentLength") != request.length:
                raise ChunkFailure(
                    "length",
                    f"asked for {request.length} bytes at {request.offset}, "
                    f"the response has {response.get('ContentLength')}",
                )
            await _receive_pieces(raw.content, out, self.timeouts)
            complete = True
        finally:
            if complete:
                raw.release()  # back to aiohttp's pool for keep-alive
            else:
                raw.close()  # a half-read connection cannot be reused
        return headers_at

    async def _unless_mismatched(self, origin: Origin, call: Awaitable[T]) -> T:
        """botocore's request, unless its origin's port speaks the other protocol, checked
        by the direct transport's pool (TLSMismatch, at once; once per origin):

        * ``https://`` to a plain-HTTP port: aiohttp waits out its timeouts on a server
          that never answers the handshake, so a first response slower than a second has
          the pool confirm the origin with a handshake of its own;
        * ``http://`` to a TLS port: the server closes or resets the connection, which
          botocore reports as a retryable connection error, so the first one has the pool
          probe the port for TLS.
        """
        pool = self._pool(origin)
        task = asyncio.ensure_future(call)
        check: asyncio.Future[None] | None = None
        try:
            if origin.tls and not pool.probed:
                done, _ = await asyncio.wait({task}, timeout=PROBE_AFTER)
                if not done:
                    check = asyncio.ensure_future(pool.confirm_tls(self.timeouts))
                    await asyncio.wait({task, check}, return_when=asyncio.FIRST_COMPLETED)
                    if check.done():
                        check.result()  # TLSMismatch
            try:
                return await task
            except (botocore.exceptions.HTTPClientError, botocore.exceptions.ConnectionError):
                if not origin.tls:
                    await pool.probe_tls(self.timeouts)
                raise
        finally:
            for pending in (task, check):
                if pending is not None and not pending.done():
                    pending.cancel()
                    await asyncio.wait({pending})

    def _check(
        self, request: ChunkRequest, status: int, etag: str | None, content_range: str | None
    ) -> None:
        """The response is for the listed object version (else: permanent ``changed``)
        and exactly the range asked (else: permanent ``range``: :func:`._errors.check_range`)."""
        if self.check_etag and request.etag and etag not in (None, request.etag):
            raise ChunkFailure("changed", f"its ETag is {etag}, it was {request.etag}")
        check_range(status, content_range, request.offset, request.length, request.size)


def _error_response(status: int, body: bytes) -> S3ErrorResponse:
    """The S3 error document of a failed chunk, as botocore would read it (parsed as the
    open's are: :func:`~._s3rest.error_document`, a DTD refused)."""
    code, detail = error_document(body)
    return S3ErrorResponse(status, code, detail or f"HTTP {status}")


async def _receive_pieces(stream: Any, out: Scatter, timeouts: Timeouts) -> None:
    """aiohttp's body pieces copied into ``out`` (the fallback transport)."""

    async def step() -> int:
        piece = await stream.readany()
        out.write(piece)
        return len(piece)

    await receive(out, step, timeouts)
