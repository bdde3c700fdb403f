"""The blocking half of the web store (:mod:`._webstore`): sizes and whole small objects,
at open, in the consumer's process, with :mod:`http.client`.

A shard's size and version come from a ``HEAD`` (redirects followed: the Hub answers
``302`` to its CDN); where ``HEAD`` is refused (a presigned URL signed for ``GET`` answers
``403``; some servers answer ``405``) or says no length, from a one-byte ranged ``GET``
whose ``Content-Range`` gives the total. Whole small objects (index files) are one
``GET``; a missing one (``404``, ``410``) is ``None``, and so is one the server refuses
with ``403``: static hosting on S3 or GCS answers ``403`` for a file it does not have, and
a presigned shard URL's signature does not cover the index files probed beside it (a
``401``, asking for credentials, is an error). Throttling, server errors, resets
and timeouts are retried (:func:`~._retry.retrying_sync`, a server's ``Retry-After``
honoured); the rest is raised at once, naming the URL and the server that answered.

Bounds (:mod:`._limits`): a body read whole is at most ``max_open_bytes`` (refused from
its ``Content-Length``, or once that many bytes came: memory never holds more), and one
call (its attempts and redirects) ends within ``open_deadline`` seconds: a watchdog shuts
the socket of a request still running then, however slowly its server trickles bytes.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from .._exceptions import PermanentFetchError
from ..shards._urls import Shard
from ._errors import ChunkFailure
from ._limits import too_large
from ._origin import Origin, tls_failure
from ._retry import RetryPolicy, Timeouts, retrying_sync
from ._web import WebSettings, error_for, is_redirect, next_url, refuse_userinfo, version_of

__all__ = ["WebObjects"]

_HEAD_REFUSED = frozenset({400, 403, 405, 501})  # HEAD not allowed, or not signed for


@dataclass(frozen=True)
class _Answer:
    status: int
    fields: Mapping[str, str]
    body: bytes
    url: str  # the URL that answered (after redirects)


class WebObjects:
    """Sizes and whole objects of ``http(s)://`` URLs (module docstring)."""

    def __init__(self, settings: WebSettings, timeouts: Timeouts) -> None:
        self.settings = settings
        self.timeouts = timeouts
        self._policy = RetryPolicy(max_attempts=5, base_delay=0.1, max_delay=5.0)
        self._ssl: ssl.SSLContext | None = None

    def head(self, url: str) -> Shard:
        """The size and version of ``url``.

        Raises:
            NotFoundError, AccessDeniedError, PermanentFetchError, TransientFetchError.
        """
        answer = self._retried("HEAD", url)
        length = answer.fields.get("content-length", "")
        if answer.status in _HEAD_REFUSED or (answer.status < 300 and not length.isdigit()):
            answer = self._retried("GET", url, {"Range": "bytes=0-0"}, ok=(206, 416))
            length = answer.fields.get("content-length", "")
            if answer.status in (206, 416):  # 416: an empty object ("bytes */0")
                length = answer.fields.get("content-range", "").rpartition("/")[2]
        if answer.status >= 300 and answer.status != 416:
            raise self._error(answer, url)
        if not length.isdigit():
            raise PermanentFetchError(
                f"{url}: {Origin.of(answer.url)} gives no size for it (no Content-Length "
                "or Content-Range total)",
                url=url,
            )
        return Shard(url, int(length), version_of(answer.fields))

    def read(self, url: str) -> bytes | None:
        """The whole object, or ``None`` where there is none (404, 410) or it is refused
        (403: see the module docstring)."""
        answer = self._retried("GET", url, body=True)
        if answer.status in (403, 404, 410):
            return None
        if answer.status >= 300:
            raise self._error(answer, url)
        return answer.body

    def _error(self, answer: _Answer, url: str) -> Exception:
        return error_for(answer.status, url, answer.url, self.settings, answer.fields, answer.body)

    def _retried(
        self,
        method: str,
        url: str,
        extra: Mapping[str, str] | None = None,
        *,
        body: bool = False,
        ok: tuple[int, ...] = (),
    ) -> _Answer:
        until = time.monotonic() + self.settings.open_deadline

        def attempt() -> _Answer:
            answer = self._once(method, url, extra or {}, body=body, until=until)
            if answer.status not in ok:
                error = self._error(answer, url) if answer.status >= 300 else None
                if error is not None and not isinstance(error, PermanentFetchError):
                    raise error  # throttling, a server error: retried
            return answer

        return retrying_sync(attempt, url=url, policy=self._policy)

    def _once(
        self, method: str, url: str, extra: Mapping[str, str], *, body: bool, until: float
    ) -> _Answer:
        """One request, its redirects followed (credentials kept to the first origin),
        ended by ``until`` (a :func:`time.monotonic` time)."""
        refuse_userinfo(url)
        headers = {**self.settings.headers_for(url), **extra}
        current = url
        for _ in range(self.settings.max_redirects + 1):
            status, fields, data = self._request(method, current, headers, body=body, until=until)
            if not is_redirect(status, fields):
                return _Answer(status, fields, data, current)
            current, headers = next_url(current, fields["location"], headers)
        raise PermanentFetchError(
            f"{url}: more than {self.settings.max_redirects} redirects (the last to "
            f"{current.partition('?')[0]}); a redirect loop? (configure_store("
            f"{self.settings.scheme!r}, max_redirects=...) allows more)",
            url=url,
        )

    def _request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        *,
        body: bool,
        until: float,
    ) -> tuple[int, dict[str, str], bytes]:
        parts = urlsplit(url)
        origin = Origin.of(url)
        left = until - time.monotonic()
        if left <= 0:
            raise self._expired()
        timeout = min(max(self.timeouts.connect, self.timeouts.first_byte), left)
        conn: http.client.HTTPConnection
        if origin.tls:
            if self._ssl is None:
                self._ssl = self.settings.ssl_context()
            conn = http.client.HTTPSConnection(
                origin.host, origin.port, timeout=timeout, context=self._ssl
            )
        else:
            conn = http.client.HTTPConnection(origin.host, origin.port, timeout=timeout)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        expired = threading.Event()

        def expire() -> None:  # the deadline: end the request however far it got
            expired.set()
            sock = conn.sock
            if sock is not None:
                with contextlib.suppress(OSError):
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)  # under TLS too

        watchdog = threading.Timer(left, expire)
        watchdog.daemon = True
        watchdog.start()
        try:
            conn.request(method, target, headers=dict(headers))
            response = conn.getresponse()
            fields = {k.lower(): v for k, v in response.getheaders()}
            data = b""  # a HEAD, or a size probe (the connection is closed unread)
            if method == "GET" and response.status >= 300:
                data = response.read(64 << 10)  # an error document
            elif body:
                data = self._body(url, response, fields)
            if expired.is_set():
                raise self._expired()
            return response.status, fields, data
        except (OSError, http.client.HTTPException) as exc:
            if expired.is_set():
                raise self._expired() from exc
            if isinstance(exc, ssl.SSLError):
                raise self._tls(url, origin, exc) from exc
            if isinstance(exc, http.client.HTTPException | socket.gaierror):
                raise ConnectionError(f"{origin}: {type(exc).__name__}: {exc}") from exc
            raise
        finally:
            watchdog.cancel()
            conn.close()

    def _body(
        self, url: str, response: http.client.HTTPResponse, fields: Mapping[str, str]
    ) -> bytes:
        """A success's body, at most ``max_open_bytes`` of it held at any time."""
        cap = self.settings.max_open_bytes
        declared = fields.get("content-length", "")
        if declared.isdigit() and int(declared) > cap:
            raise too_large(url, cap, int(declared))
        data = response.read(cap + 1)
        if len(data) > cap:
            raise too_large(url, cap)
        return data

    def _expired(self) -> ChunkFailure:
        return ChunkFailure(
            "open_deadline",
            f"no complete answer within {self.settings.open_deadline:g} s, retries and "
            "redirects included (the web store's setting open_deadline)",
        )

    def _tls(self, url: str, origin: Origin, exc: ssl.SSLError) -> Exception:
        if isinstance(exc, ssl.SSLCertVerificationError) or "WRONG_VERSION" in str(exc):
            message = str(tls_failure(origin, exc))
            return PermanentFetchError(f"{url}: {message}", url=url)
        return ConnectionError(f"{origin}: TLS failed: {exc}")
