"""The web store: shards at plain ``https://`` and ``http://`` URLs, read by byte range.

Any server that answers ranged GETs: the Hugging Face Hub
(``https://huggingface.co/datasets/ORG/NAME/resolve/main/shard-0000.tar``), a lab's web
server, a CDN, presigned S3, GCS or Azure URLs. Shards are named by brace patterns, lists
or an index file (a wids index, ``asyncstream.json``); a folder (a URL ending in ``/``)
cannot be listed over plain HTTP and is refused. Web URLs are read-only: ``pack`` and
``index`` write elsewhere (a local path, ``s3://``).

At open (:mod:`._webobjects`): a shard's size and version from ``HEAD`` (or the index).
In the fetch engine: each chunk (or run of consecutive chunks: :attr:`coalesces`) is one
ranged GET on the project's own HTTP/1.1 client (:mod:`._http`: kept-alive connections,
TLS, the body received straight into the ring slot), under the engine's retries,
timeouts, adaptive concurrency, hedging and disk cache, as for S3.

Checks, on every response: it is ``206`` for exactly the range asked (its
``Content-Range`` names the start and end asked for, else a permanent ``range`` error:
:func:`._errors.check_range`, shared by every store; a ``200`` with the
whole object from a server that ignores ``Range`` is a permanent ``no_ranges`` error,
naming the server, unless the range was the whole object); the object is the version
that was listed: every request carries ``If-Match`` (a strong ETag) or
``If-Unmodified-Since`` (a ``Last-Modified`` version), and the answer's ETag or date and
its ``Content-Range`` total are compared with the listing whether or not the server
honoured the condition: another is a permanent ``changed`` error.

Redirects are followed (at most ``max_redirects``), credentials (``Authorization``,
``Cookie``) and the headers configured for the store never carried to another origin. A
URL with ``user:password@`` is refused (give credentials with ``token`` or ``headers``).
Where a shard's URL redirected, the final URL is reused for its later chunks (for ten
minutes at most: the Hub's CDN URLs expire); a ``401``, ``403``, ``404`` or ``410``
from it is met by asking the shard's own URL again, once. ``429`` and ``503`` are
throttling (``Retry-After`` honoured), ``5xx`` server errors: both retried. Settings
(token, headers, CA bundle) are in :mod:`._web`.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .._exceptions import FetchError, PermanentFetchError, ShardURLError
from ..shards._urls import Shard
from ._errors import ChunkFailure, check_range
from ._httpconn import Reply, Scatter
from ._httpstore import HTTPStore
from ._origin import Origin, TLSMismatch
from ._retry import Timeouts
from ._store import ChunkRequest, StoreSetup
from ._web import (
    LAST_MODIFIED,
    WebSettings,
    error_for,
    is_redirect,
    next_url,
    refuse_userinfo,
    same_tag,
)
from ._webobjects import WebObjects

__all__ = ["WebStore"]

_RESOLVED_FOR = 600.0  # seconds a redirect's final URL is reused
_STALE = frozenset({401, 403, 404, 410})  # from a reused redirect target: ask again
_HEADERS_KEPT = 4096  # shard URLs whose request headers are kept


class WebStore(HTTPStore):
    """Ranged GETs of ``http(s)://`` URLs (see the module docstring).

    Args:
        settings: token, headers, TLS trust, redirects (:class:`~._web.WebSettings`).
        timeouts: the time limits of one attempt.
        check_etag: require every chunk to come from the listed object version.
        connections: the most kept-alive connections per origin.
    """

    hedgeable = True
    cacheable = True
    writable = False
    lists_folders = False

    def __init__(
        self,
        settings: WebSettings,
        *,
        timeouts: Timeouts | None = None,
        check_etag: bool = True,
        connections: int = 16,
    ) -> None:
        super().__init__(timeouts=timeouts, check_etag=check_etag, connections=connections)
        self.settings = settings
        self.objects = WebObjects(settings, self.timeouts)
        self._resolved: dict[str, tuple[str, float]] = {}  # shard URL -> final URL, when
        self._headers: dict[str, dict[str, str]] = {}  # shard URL -> its headers_for
        self.redirects = 0  # redirects followed by chunk reads
        self.reresolved = 0  # reused redirect targets that failed, asked again

    @classmethod
    def from_setup(cls, setup: StoreSetup) -> WebStore:
        return cls._for("https", setup)

    @classmethod
    def _for(cls, scheme: str, setup: StoreSetup) -> WebStore:
        return cls(
            WebSettings.of(scheme, setup.settings),
            timeouts=setup.timeouts,
            check_etag=setup.check_etag,
            connections=setup.connections,
        )

    # -- what a URL names ---------------------------------------------------------------------

    @classmethod
    def canonical(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ShardURLError(f"{url!r}: a web shard URL is http(s)://HOST/PATH")
        if parts.fragment:
            raise ShardURLError(f"{url!r}: a shard URL has no #fragment")
        refuse_userinfo(url)
        try:
            parts.port  # noqa: B018 - a malformed port raises here
        except ValueError as exc:
            raise ShardURLError(f"{url!r}: {exc}") from None
        return url

    def is_folder(self, url: str) -> bool:
        path = urlsplit(url).path
        return not path or path.endswith("/")

    # -- at open: the blocking half (:mod:`._webobjects`) -----------------------------------

    def list(self, url: str) -> list[Shard]:
        raise ShardURLError(
            f"{url!r}: a web folder cannot be listed (plain HTTP has no listing); name its "
            "shards with a brace pattern (https://host/data/shard-{000..099}.tar), a list "
            "of URLs, or an index file (a wids index or asyncstream.json)"
        )

    def head(self, url: str) -> Shard:
        return self.objects.head(url)

    def read(self, url: str) -> bytes | None:
        return self.objects.read(url)

    def _read_only(self, url: str, what: str) -> ShardURLError:
        return ShardURLError(
            f"{url!r}: web URLs are read-only, so {what} cannot write there; write to a "
            "local path or an s3:// URL (asyncstream index --output, pack's destination)"
        )

    def write(self, url: str, data: bytes) -> None:
        raise self._read_only(url, "an index or manifest")

    def delete(self, urls: Iterable[str]) -> None:
        for url in urls:
            raise self._read_only(url, "a delete")

    def prepare(self, url: str) -> None:
        raise self._read_only(url, "pack or index")

    def upload(self, url: str, path: Path) -> str | None:
        raise self._read_only(url, "an upload")

    # -- in the fetch engine ------------------------------------------------------------------

    async def aclose(self) -> None:
        self._close_pools()

    def stats(self) -> dict[str, Any]:
        return {
            "transport": "direct",
            **self._pool_stats(),
            "redirects": self.redirects,
            "reresolved": self.reresolved,
        }

    def _ssl_context(self) -> ssl.SSLContext | None:
        return self.settings.ssl_context()

    async def _get(self, request: ChunkRequest, view: Scatter) -> float:
        """One ranged GET of ``request``, its redirects followed; the loop time of the
        success's headers. A certificate that does not verify says how to trust it."""
        try:
            return await self._follow(request, view)
        except TLSMismatch as exc:
            hint = f"configure_store({self.settings.scheme!r}, ca_bundle=...) or SSL_CERT_FILE"
            raise PermanentFetchError(
                f"{request.url}: {exc} [for web URLs: {hint}]", url=request.url
            ) from exc

    def _headers_for(self, url: str) -> dict[str, str]:
        """``settings.headers_for(url)``, kept per shard URL (never changed by a caller:
        each request merges it into a dict of its own). Made for each GET it parsed the
        URL twice."""
        headers = self._headers.get(url)
        if headers is None:
            if len(self._headers) >= _HEADERS_KEPT:
                self._headers.clear()
            headers = self._headers[url] = self.settings.headers_for(url)
        return headers

    async def _follow(self, request: ChunkRequest, view: Scatter) -> float:
        loop = asyncio.get_running_loop()
        headers = {**self._headers_for(request.url), **self._conditions(request)}
        cached = self._resolved.get(request.url)
        reused = cached is not None and loop.time() - cached[1] < _RESOLVED_FOR
        url = cached[0] if cached is not None and reused else request.url
        if reused:
            headers = next_url(request.url, url, headers)[1]
        hops = 0
        while True:
            reply, headers_at = await self._pool(Origin.of(url)).get(
                url, headers, view, self.timeouts, lambda reply: self._check(request, reply)
            )
            if reply.status < 300:
                if url != request.url:
                    self._resolved[request.url] = (url, loop.time())
                return headers_at
            if is_redirect(reply.status, reply.fields):
                hops += 1
                self.redirects += 1
                if hops > self.settings.max_redirects:
                    raise PermanentFetchError(
                        f"{request.url}: more than {self.settings.max_redirects} redirects "
                        f"(the last to {url.partition('?')[0]}); a redirect loop?",
                        url=request.url,
                    )
                url, headers = next_url(url, reply.fields["location"], headers)
                continue
            if reused and reply.status in _STALE:
                # The redirect target reused from an earlier chunk has expired: ask again.
                self._resolved.pop(request.url, None)
                self.reresolved += 1
                reused, url, hops = False, request.url, 0
                headers = {**self._headers_for(request.url), **self._conditions(request)}
                continue
            raise self._failure(request, url, reply)

    def _failure(self, request: ChunkRequest, url: str, reply: Reply) -> Exception:
        if reply.status == 412:
            return ChunkFailure("changed", f"{Origin.of(url)} answered 412 to its condition")
        if reply.status == 416:
            total = reply.fields.get("content-range", "").rpartition("/")[2]
            return ChunkFailure("changed", f"the range is past its end (its size is {total})")
        error = error_for(reply.status, request.url, url, self.settings, reply.fields, reply.body)
        if isinstance(error, FetchError):
            self._resolved.pop(request.url, None)
        return error

    def _conditions(self, request: ChunkRequest) -> dict[str, str]:
        end = request.offset + request.length - 1
        headers = {"Range": f"bytes={request.offset}-{end}"}
        tag = request.etag
        if self.check_etag and tag:
            if tag.startswith(LAST_MODIFIED):
                headers["If-Unmodified-Since"] = tag[len(LAST_MODIFIED) :]
            elif not tag.startswith("W/"):  # If-Match compares strongly: a weak one never matches
                headers["If-Match"] = tag
        return headers

    def _check(self, request: ChunkRequest, reply: Reply) -> None:
        """A success is the listed version, and exactly the range asked (else: ``changed``,
        permanent; ``length``, retried)."""
        fields = reply.fields
        tag = request.etag
        if self.check_etag and tag:
            if tag.startswith(LAST_MODIFIED):
                date = fields.get("last-modified")
                if date is not None and date != tag[len(LAST_MODIFIED) :]:
                    raise ChunkFailure("changed", f"its Last-Modified is {date}, it was {tag}")
            elif fields.get("etag") and not same_tag(tag, fields["etag"]):
                raise ChunkFailure("changed", f"its ETag is {fields['etag']}, it was {tag}")
        if reply.status == 200:  # the whole object, which the range covered (see _http)
            length = fields.get("content-length", "")
            if request.size is not None and length != str(request.size):
                raise ChunkFailure("changed", f"its size is {length}, it was {request.size}")
        content_range = fields.get("content-range")
        check_range(reply.status, content_range, request.offset, request.length, request.size)


class HttpStore(WebStore):
    """The web store of ``http://`` URLs (its settings are ``configure_store("http", ...)``)."""

    @classmethod
    def from_setup(cls, setup: StoreSetup) -> WebStore:
        return cls._for("http", setup)
