"""A static-file web server on loopback, for tests of ``http://`` and ``https://`` shard URLs.

:class:`WebServer` serves a folder over HTTP/1.1 (or HTTPS, with certificates from
:func:`~asyncstream.testing.make_test_certificates`) on a free loopback port, as nginx or
a CDN would: ``GET`` and ``HEAD``, single byte ranges (``206`` with ``Content-Range``,
``416`` past the end), ``ETag`` and ``Last-Modified``, ``If-Match``,
``If-Unmodified-Since`` (``412``) and ``If-Range``, keep-alive connections. Switches, for
the failures a real server shows (settable while it runs):

* ``ranges=False``: ``Range`` is ignored, every ``GET`` answers ``200`` with the whole file;
* ``etags=False``: no ``ETag`` (the ``Last-Modified`` date alone versions a file);
* ``token="..."``: every request needs ``Authorization: Bearer <token>`` (``401`` without,
  ``403`` with another);
* :meth:`WebServer.redirect`: paths under a prefix answer ``302`` to another prefix, on
  this server (``"/other/"``) or another (``"http://127.0.0.1:PORT/cdn/"``);
* :meth:`WebServer.inject`: the next matching requests answer a status of choice, with
  ``Retry-After`` (``429``, ``503``) or not.

Every request is logged (:meth:`WebServer.requests`: method, path, header fields, the
status answered), so a test can count retries and see which headers arrived. It runs its
own event loop in a thread; :meth:`WebServer.close` closes every connection and ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import os
import posixpath
import ssl
import threading
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from ._served import Served

__all__ = ["ServedRequest", "WebServer"]

_START_TIMEOUT = 10.0
_PIECE = 64 << 10
_HEAD_LIMIT = 64 << 10
_REASONS = {
    200: "OK",
    206: "Partial Content",
    302: "Found",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    412: "Precondition Failed",
    416: "Range Not Satisfiable",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


@dataclass(frozen=True)
class ServedRequest:
    """One request the server answered: its method, path (no query), header fields (names
    in lower case) and the status answered; where the server logs them (:class:`Nginx`),
    the client's address and the server's serial number of the connection it came on
    (else ``""`` and ``0``)."""

    method: str
    path: str
    headers: dict[str, str]
    status: int
    client: str = ""
    connection: int = 0


@dataclass
class _Injection:
    status: int
    count: int
    match: str
    retry_after: float | None


@dataclass
class _Reply:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    file: Path | None = None
    start: int = 0
    length: int = 0
    body: bytes = b""


class WebServer(Served):
    """A static-file HTTP/1.1 server of ``root`` on a free loopback port (module docstring).

    Use it as a context manager, or call :meth:`start` and :meth:`close`.

    Example::

        with WebServer(folder) as web:
            stream = ShardStream(web.url + "/shard-{0..3}.tar")

    Args:
        root: the folder served (``/name`` is ``root/name``; folders are not listed).
        tls: ``(cert_pem, key_pem)``: serve HTTPS (see :func:`make_test_certificates`).
        ranges: honour ``Range`` (``False``: answer ``200`` with the whole file).
        etags: send ``ETag`` (``False``: ``Last-Modified`` only).
        token: the bearer token every request must carry (``None``: none needed).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        tls: tuple[str, str] | None = None,
        ranges: bool = True,
        etags: bool = True,
        token: str | None = None,
    ) -> None:
        self.root = Path(root).absolute()
        self.ranges = ranges
        self.etags = etags
        self.token = token
        self._ssl: ssl.SSLContext | None = None
        if tls is not None:
            self._ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self._ssl.load_cert_chain(*tls)
        self._lock = threading.Lock()
        self._log: list[ServedRequest] = []
        self._injections: list[_Injection] = []
        self._redirects: dict[str, str] = {}
        self._url: str | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._closed = False
        self._error: BaseException | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    def __repr__(self) -> str:
        return f"WebServer({str(self.root)!r}, {self._url or 'not started'})"

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (``https://`` with ``tls``); ``RuntimeError`` unless
        running."""
        if self._url is None or self._closed:
            raise RuntimeError("WebServer is not running; call start() or use it with 'with'")
        return self._url

    # -- switches and the log ---------------------------------------------------------------

    def redirect(self, prefix: str, target: str) -> None:
        """Answer ``302`` to requests whose path starts with ``prefix`` (``"/hub/"``), to
        ``target`` (a path on this server, or an absolute URL) followed by the rest of
        the path."""
        with self._lock:
            self._redirects[prefix] = target

    def inject(
        self, status: int, *, count: int = 1, match: str = "", retry_after: float | None = None
    ) -> None:
        """Answer the next ``count`` requests whose path contains ``match`` with
        ``status`` (and ``Retry-After: retry_after`` seconds, if given), unserved."""
        with self._lock:
            self._injections.append(_Injection(status, count, match, retry_after))

    def requests(self) -> list[ServedRequest]:
        """Every request answered so far, in order."""
        with self._lock:
            return list(self._log)

    def clear(self) -> None:
        """Forget the log, the pending injections and the redirects."""
        with self._lock:
            self._log.clear()
            self._injections.clear()
            self._redirects.clear()

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> WebServer:
        """Serve, in a thread of its own, once it listens; returns ``self``.

        Raises:
            RuntimeError: the server was closed, or could not start.
        """
        if self._closed:
            raise RuntimeError("this WebServer was closed; make a new one")
        if self._thread is not None:
            return self
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name="asyncstream-webserver", daemon=True
        )
        self._thread.start()
        if not ready.wait(_START_TIMEOUT) or self._error is not None:
            self.close()
            raise RuntimeError(f"WebServer could not start: {self._error!r}")
        return self

    def close(self) -> None:
        """Close every connection and end the thread (waited for)."""
        self._closed = True
        loop, stop, thread = self._loop, self._stop, self._thread
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop has just ended
                loop.call_soon_threadsafe(stop.set)
        if thread is not None:
            thread.join(_START_TIMEOUT)

    def _run(self, ready: threading.Event) -> None:
        loop = self._loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._main(ready))
        except BaseException as exc:  # reported by start()
            self._error = exc
        finally:
            ready.set()
            loop.close()

    async def _main(self, ready: threading.Event) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(
            self._serve, "127.0.0.1", 0, ssl=self._ssl, limit=_HEAD_LIMIT
        )
        port = server.sockets[0].getsockname()[1]
        self._url = f"{'https' if self._ssl else 'http'}://127.0.0.1:{port}"
        ready.set()
        try:
            await self._stop.wait()
        finally:
            server.close()
            for writer in list(self._writers):
                writer.transport.abort()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), _START_TIMEOUT)
            await asyncio.sleep(0.05)  # let the aborted transports close their sockets

    # -- serving ------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
                    break
                method, target, headers = _parse(head)
                length = headers.get("content-length", "0")
                if length.isdigit() and int(length):
                    await reader.readexactly(int(length))
                path = urllib.parse.unquote(urllib.parse.urlsplit(target).path)
                reply = self._answer(method, path, headers)
                with self._lock:
                    self._log.append(ServedRequest(method, path, headers, reply.status))
                await self._send(writer, method, reply)
                if "close" in headers.get("connection", "").lower():
                    break
        except (OSError, asyncio.IncompleteReadError):
            pass  # the client went away
        finally:
            self._writers.discard(writer)
            writer.transport.abort()

    async def _send(self, writer: asyncio.StreamWriter, method: str, reply: _Reply) -> None:
        size = reply.length if reply.file is not None else len(reply.body)
        reply.headers.setdefault("Content-Length", str(size))
        lines = [f"HTTP/1.1 {reply.status} {_REASONS.get(reply.status, 'Unknown')}"]
        lines += [f"{name}: {value}" for name, value in reply.headers.items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        if method != "HEAD":
            if reply.file is None:
                writer.write(reply.body)
            else:
                fd = os.open(reply.file, os.O_RDONLY)
                try:
                    at, end = reply.start, reply.start + reply.length
                    while at < end:
                        piece = os.pread(fd, min(_PIECE, end - at), at)
                        if not piece:
                            break
                        writer.write(piece)
                        at += len(piece)
                        await writer.drain()
                finally:
                    os.close(fd)
        await writer.drain()

    def _answer(self, method: str, path: str, headers: dict[str, str]) -> _Reply:
        """What to answer a request (the order a CDN in front of a store would check)."""
        with self._lock:
            for injection in self._injections:
                if injection.count > 0 and injection.match in path:
                    injection.count -= 1
                    reply = _Reply(injection.status, body=b"injected\n")
                    if injection.retry_after is not None:
                        reply.headers["Retry-After"] = f"{injection.retry_after:g}"
                    return reply
            redirects = dict(self._redirects)
        if method not in ("GET", "HEAD"):
            return _Reply(405, {"Allow": "GET, HEAD"}, body=b"read-only\n")
        if self.token is not None:
            given = headers.get("authorization")
            if given is None:
                return _Reply(401, {"WWW-Authenticate": "Bearer"}, body=b"token needed\n")
            if given != f"Bearer {self.token}":
                return _Reply(403, body=b"bad token\n")
        for prefix, target in redirects.items():
            if path.startswith(prefix):
                rest = urllib.parse.quote(path[len(prefix) :])
                return _Reply(302, {"Location": target + rest}, body=b"moved\n")
        return self._file(path, headers)

    def _file(self, path: str, headers: dict[str, str]) -> _Reply:
        relative = posixpath.normpath("/" + path).lstrip("/")
        file = self.root / relative
        if not relative or not file.is_file():
            return _Reply(404, body=b"not found\n")
        stat = file.stat()
        size = stat.st_size
        etag = f'"{size:x}-{stat.st_mtime_ns:x}"'
        modified = email.utils.formatdate(stat.st_mtime, usegmt=True)
        common = {"Last-Modified": modified, "Accept-Ranges": "bytes" if self.ranges else "none"}
        if self.etags:
            common["ETag"] = etag
        wanted = headers.get("if-match")
        if (
            wanted is not None
            and wanted != "*"
            and etag not in (t.strip() for t in wanted.split(","))
        ):
            return _Reply(412, body=b"precondition failed\n")
        since = headers.get("if-unmodified-since")
        if since is not None:
            limit = email.utils.parsedate_to_datetime(since).timestamp()
            if int(stat.st_mtime) > limit:
                return _Reply(412, body=b"precondition failed\n")
        ranged = headers.get("range") if self.ranges else None
        condition = headers.get("if-range")
        if condition is not None and condition not in (etag, modified):
            ranged = None  # the file changed: the whole of it, as RFC 9110 says
        if ranged is None:
            return _Reply(200, common, file=file, start=0, length=size)
        span = _span(ranged, size)
        if span is None:
            return _Reply(200, common, file=file, start=0, length=size)  # not one range
        start, end = span
        if start >= size or end < start:
            return _Reply(416, {**common, "Content-Range": f"bytes */{size}"})
        common["Content-Range"] = f"bytes {start}-{end}/{size}"
        return _Reply(206, common, file=file, start=start, length=end - start + 1)


def _parse(head: bytes) -> tuple[str, str, dict[str, str]]:
    request_line, *lines = head.decode("latin-1").split("\r\n")
    method, _, rest = request_line.partition(" ")
    target = rest.rpartition(" ")[0] or rest
    headers: dict[str, str] = {}
    for line in lines:
        name, colon, value = line.partition(":")
        if colon:
            headers[name.strip().lower()] = value.strip()
    return method, target, headers


def _span(value: str, size: int) -> tuple[int, int] | None:
    """``(first, last)`` of a single ``bytes=`` range (clipped to the file), or None for
    several ranges or a malformed one (answered whole)."""
    unit, _, spec = value.partition("=")
    if unit.strip() != "bytes" or "," in spec:
        return None
    first, dash, last = spec.strip().partition("-")
    if not dash or not (first.isdigit() or last.isdigit()):
        return None
    if not first:  # the last N bytes
        return max(size - int(last), 0), size - 1
    return int(first), min(int(last), size - 1) if last.isdigit() else size - 1
