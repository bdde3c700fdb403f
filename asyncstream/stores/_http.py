"""The S3 store's own HTTP/1.1 client: keep-alive connections, bodies straight into a buffer
(one connection and where its bodies go: :mod:`._httpconn`; the pool of them per origin,
requests and responses: here).

Why not aiohttp (which botocore's async client uses, and which asyncstream keeps as the
fallback for HTTP proxies): aiohttp hands a body over as ``bytes`` pieces its parser cut
from the socket buffer, to be copied again into the ring slot, one small read at a time;
over TLS, asyncio's SSL transport adds its own buffers in front of that. Here:

* plain HTTP: ``loop.sock_recv_into(sock, slot)``: the kernel copies the bytes into the
  ring slot and nothing in user space touches them;
* HTTPS: a non-blocking :class:`ssl.SSLSocket`, whose ``recv_into(slot)`` has OpenSSL read
  the socket and decrypt straight into the slot: no Python object is made per piece.
  (An :class:`ssl.SSLObject` over memory BIOs would need one more copy, into the BIO.)

Connections persist (HTTP/1.1 keep-alive) in a bounded pool per origin, last used first.
A connection goes back to the pool only after its response was read to its end and the
server did not say ``Connection: close``. An idle connection the server has closed (it is
readable: an end of file, or bytes nobody asked for) is dropped before reuse; a reused
connection that dies before the first byte of its response is replaced by a fresh one,
once, without counting as a retry (the server may close an idle connection at any time).

A ``200`` answer to a ranged GET is the whole object from a server that ignores ``Range``:
unless the range asked for was the whole object, it is a permanent ``no_ranges``
:class:`ChunkFailure` (never read as the range, never retried into a download of the
whole object again).

Errors: a refused, reset or closed connection is ``OSError`` (retryable); a certificate
that does not verify, ``https://`` against a plain-HTTP port and ``http://`` against a
TLS port are :class:`TLSMismatch` (permanent: retrying cannot fix them), named so. Most
plain-HTTP servers neither answer nor close on a TLS ClientHello (they wait for the rest
of a request line): after a second of handshake silence the port is asked, once, in
plain HTTP, and a plain HTTP answer makes the handshake a TLSMismatch at once.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import re
import socket
import ssl
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar
from urllib.parse import urlsplit

from ._errors import ChunkFailure
from ._httpconn import Conn, Reply, Scatter, Stale, receive_from
from ._origin import Origin, TLSMismatch, tls_failure
from ._retry import Timeouts

__all__ = ["PROBE_AFTER", "ConnectionPool", "first_byte"]

T = TypeVar("T")

_HEAD_LIMIT = 64 << 10  # response headers larger than this are refused
# What no header may hold: a listing's or an index's ETag with a line break would add
# header lines of its choosing to every GET of the shard (it goes out as If-Match).
_BREAK = re.compile(r"[\r\n\0]")
_ERROR_BODY_LIMIT = 64 << 10  # an error document is read up to this
_TLS_RECORD = b"\x16\x03"  # a TLS handshake record: a TLS server's first bytes
_TLS_ALERT = b"\x15\x03"  # a TLS alert record
PROBE_AFTER = 1.0  # seconds of silence before asking whether a port speaks the other protocol


class ConnectionPool:
    """Keep-alive connections to one origin, at most ``limit`` of them idle.

    Args:
        origin: scheme, host, port.
        ssl_context: for ``https://``; ``None`` makes a default (verifying) one.
        limit: the most idle connections kept.
    """

    def __init__(
        self, origin: Origin, *, ssl_context: ssl.SSLContext | None = None, limit: int = 16
    ) -> None:
        self.origin = origin
        self.ssl_context = ssl_context or (ssl.create_default_context() if origin.tls else None)
        self.limit = limit
        self._idle: collections.deque[Conn] = collections.deque()
        self.opened = 0  # connections made
        self.reused = 0  # requests sent on a connection that had served one before
        self._probed = False

    def close(self) -> None:
        """Close the idle connections (the pool can still be used)."""
        while self._idle:
            self._idle.pop().close()

    async def _connect(self, timeouts: Timeouts) -> Conn:
        loop = asyncio.get_running_loop()
        error: OSError = ConnectionError(f"no address for {self.origin}")
        infos = await loop.getaddrinfo(self.origin.host, self.origin.port, type=socket.SOCK_STREAM)
        for family, kind, proto, _, address in infos:
            sock: socket.socket = socket.socket(family, kind, proto)
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                async with asyncio.timeout(timeouts.connect) as limit:
                    await loop.sock_connect(sock, address)
                    if self.ssl_context is not None:
                        sock = self.ssl_context.wrap_socket(
                            sock, server_hostname=self.origin.host, do_handshake_on_connect=False
                        )
                        await self._handshake(Conn(sock))
                return Conn(sock)
            except TimeoutError:
                sock.close()
                if not limit.expired():
                    raise
                error = ConnectionError(
                    f"connecting to {self.origin} took over {timeouts.connect:g} s"
                )
            except OSError as exc:
                sock.close()
                error = exc
            except BaseException:
                sock.close()
                raise
        raise error

    async def _handshake(self, conn: Conn) -> None:
        handshake = asyncio.ensure_future(conn.handshake())
        try:
            done, _ = await asyncio.wait({handshake}, timeout=PROBE_AFTER)
            if not done:
                await self._probe_plain()
            await handshake
        except ssl.SSLError as exc:
            raise tls_failure(self.origin, exc) from exc
        finally:
            if not handshake.done():
                handshake.cancel()
                await asyncio.wait({handshake})

    @property
    def probed(self) -> bool:
        """Whether this origin's port was asked if it speaks the other protocol."""
        return self._probed

    async def confirm_tls(self, timeouts: Timeouts) -> None:
        """For an ``https://`` origin whose first response is slow on another client
        (botocore's): a handshake of this pool's own, which probes as any does; raises
        TLSMismatch if the port turns out to be a plain-HTTP one. Once per pool."""
        if self._probed:
            return
        with contextlib.suppress(OSError, TimeoutError):
            (await self._connect(timeouts)).close()
        self._probed = True

    async def _probe_plain(self) -> None:
        """After a second of TLS handshake silence: does the port answer plain HTTP?
        Asked once per pool (one second at most); raises TLSMismatch if so. An answer of
        400 proves nothing: a TLS port may say that to a plain request, as nginx does."""
        if self._probed:
            return
        self._probed = True
        loop = asyncio.get_running_loop()
        host = f"{self.origin.host}:{self.origin.port}"
        request = f"HEAD / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
        answer = b""
        try:
            async with asyncio.timeout(PROBE_AFTER):
                infos = await loop.getaddrinfo(
                    self.origin.host, self.origin.port, type=socket.SOCK_STREAM
                )
                family, kind, proto, _, address = infos[0]
                with socket.socket(family, kind, proto) as sock:
                    sock.setblocking(False)
                    await loop.sock_connect(sock, address)
                    await loop.sock_sendall(sock, request)
                    while len(answer) < 12 and (piece := await loop.sock_recv(sock, 12)):
                        answer += piece
        except (OSError, TimeoutError):
            pass
        if answer.startswith(b"HTTP/1.") and answer[9:12].isdigit() and answer[9:12] != b"400":
            raise TLSMismatch(
                f"{self.origin}: no answer to the TLS handshake, and the port answers plain "
                "HTTP: it is a plain-HTTP port. Use http:// for it"
            )

    async def _acquire(self, timeouts: Timeouts) -> Conn:
        while self._idle:
            conn = self._idle.pop()
            if conn.idle_and_open():
                return conn
            conn.close()
        conn = await self._connect(timeouts)
        self.opened += 1
        return conn

    def _release(self, conn: Conn, reusable: bool) -> None:
        if reusable and len(self._idle) < self.limit:
            self._idle.append(conn)
        else:
            conn.close()

    async def get(
        self,
        url: str,
        headers: Mapping[str, str],
        out: Scatter,
        timeouts: Timeouts,
        accept: Callable[[Reply], None] | None = None,
    ) -> tuple[Reply, float]:
        """``GET url`` (of this origin): a success's body goes into ``out``, which it must
        fill exactly. ``accept`` sees a success's head before any byte of its body lands
        (and may raise): ``out`` hands each buffer on as soon as it is full, so what
        identifies the object (ETag, Content-Range) is checked first.

        Returns the reply and the loop time its header arrived.

        Raises:
            ChunkFailure: a body of another length, a stall, no response in time.
            TLSMismatch: see the module docstring.
            OSError: the connection failed.
        """
        parts = urlsplit(url)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        default = ":443" if self.origin.tls else ":80"
        # Host and port as the request was signed, never a URL's user:password@ (which
        # would send the password in the clear, to whatever answers, in every request).
        host = parts.netloc.rpartition("@")[2].removesuffix(default)
        for name, value in headers.items():
            if _BREAK.search(name) or _BREAK.search(value):  # a hostile ETag, say
                shown = _BREAK.sub("?", name)[:40]  # never the value: it may be a secret
                raise ValueError(f"the request's {shown!r} header holds a line break or NUL")
        head = f"GET {target} HTTP/1.1\r\nHost: {host}\r\n"
        head += "".join(f"{name}: {value}\r\n" for name, value in headers.items()) + "\r\n"
        request = head.encode("latin-1")
        ranged = next((v for k, v in headers.items() if k.lower() == "range"), None)
        for attempt in range(2):
            conn = await self._acquire(timeouts)
            fresh = conn.requests == 0
            if not fresh:
                self.reused += 1
            try:
                return await self._exchange(conn, request, out, timeouts, accept, ranged)
            except Stale:
                conn.close()
                if fresh or attempt:
                    if fresh and not self.origin.tls:
                        await self.probe_tls(timeouts)
                    raise ConnectionResetError(
                        f"{self.origin} closed the connection before responding"
                    ) from None
            except BaseException:
                conn.close()
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def probe_tls(self, timeouts: Timeouts) -> None:
        """After a fresh plain connection ended unanswered (here, or on botocore's client):
        is the port a TLS one? Checked once per pool (a TLS ClientHello, one second at
        most); raises TLSMismatch if so."""
        if self._probed:
            return
        self._probed = True
        probe = ssl.create_default_context()
        probe.check_hostname, probe.verify_mode = False, ssl.CERT_NONE
        pool = ConnectionPool(
            Origin("https", self.origin.host, self.origin.port), ssl_context=probe
        )
        quick = Timeouts(connect=1.0, first_byte=1.0, stall=1.0, chunk=1.0)
        try:
            (await pool._connect(quick)).close()
        except (OSError, TLSMismatch, TimeoutError):
            return  # not a TLS server either: a plain failure, retried as such
        raise TLSMismatch(f"{self.origin} is a TLS (https://) endpoint: use https:// for it")

    async def _exchange(
        self,
        conn: Conn,
        request: bytes,
        out: Scatter,
        timeouts: Timeouts,
        accept: Callable[[Reply], None] | None,
        ranged: str | None = None,
    ) -> tuple[Reply, float]:
        loop = asyncio.get_running_loop()
        conn.requests += 1
        try:
            await conn.sendall(request)
        except OSError:
            raise Stale() from None
        status, fields, extra, keep = await first_byte(self._read_head(conn), timeouts)
        headers_at = loop.time()
        declared = fields.get("content-length", "")
        if status == 200 and ranged is not None:
            self._check_whole(ranged, declared, out.total)
        if "chunked" in fields.get("transfer-encoding", "") or not declared.isdigit():
            if status < 300:
                raise ChunkFailure("length", "a response without a Content-Length")
            # An error document in chunks (Azurite's): read to its last chunk, then the
            # connection is closed (not reused: what follows it is not checked).
            chunked = "chunked" in fields.get("transfer-encoding", "")
            body = await self._error_body(conn, bytes(extra), None, timeouts, chunked=chunked)
            conn.close()
            return Reply(status, fields, _dechunk(body) if chunked else body), headers_at
        length = int(declared)
        if status >= 300:
            body = await self._error_body(conn, bytes(extra), length, timeouts)
            self._release(conn, keep and len(body) == length)
            return Reply(status, fields, body), headers_at
        if length != out.total:
            raise ChunkFailure("length", f"asked for {out.total} bytes, the response has {length}")
        if len(extra) > length:
            raise ChunkFailure("length", f"more than the {length} bytes asked for")
        if accept is not None:
            accept(Reply(status, fields))
        out.write(extra)
        await receive_from(conn, out, timeouts)
        self._release(conn, keep)
        return Reply(status, fields), headers_at

    def _check_whole(self, ranged: str, declared: str, total: int) -> None:
        """A ``200`` to a ``Range: bytes=A-B`` request: fine only where the range asked
        for was the whole object, which the body then is (a server that ignores ranges).

        Raises:
            ChunkFailure: ``no_ranges`` (permanent), naming the server.
        """
        if ranged.strip().startswith(("bytes=0-", "bytes = 0-")) and declared == str(total):
            return
        size = f"{declared} bytes" if declared.isdigit() else "its length unsaid"
        raise ChunkFailure(
            "no_ranges",
            f"{self.origin} answered the ranged GET ({ranged}) with 200 and the whole object "
            f"({size}): the server ignores Range requests",
        )

    async def _read_head(self, conn: Conn) -> tuple[int, dict[str, str], memoryview, bool]:
        """Status, header fields, the body bytes that came with them (a view of the
        connection's head buffer, valid until its next request), and whether the
        connection may be reused.

        The head is read into a buffer the connection keeps (``Conn.head``), and the body
        bytes that came with it are copied once, into the slot, not a ``bytearray(65536)``
        made for each GET and those bytes copied four times over."""
        buffer = conn.head
        view = memoryview(buffer)
        got = 0
        while (end := buffer.find(b"\r\n\r\n", 0, got)) < 0:
            if got >= _HEAD_LIMIT:
                raise ChunkFailure("length", f"response headers over {_HEAD_LIMIT} bytes")
            if got == len(buffer):  # a head larger than the buffer: a larger one (rare)
                larger = bytearray(2 * len(buffer))
                larger[:got] = view[:got]
                conn.head = buffer = larger
                view = memoryview(buffer)
            try:
                n = await conn.recv_into(view[got:])
            except ConnectionResetError:
                if got:
                    raise
                raise Stale() from None  # reset unanswered: as a close (a TLS port does it)
            if not n:
                if not got:
                    raise Stale()
                raise ConnectionResetError(f"{self.origin} closed the connection mid-response")
            got += n
        status_line, *lines = buffer[:end].decode("latin-1").split("\r\n")
        version, _, rest = status_line.partition(" ")
        code = rest[:3]
        if not version.startswith("HTTP/1.") or not code.isdigit():
            if buffer.startswith((_TLS_RECORD, _TLS_ALERT)):
                raise TLSMismatch(f"{self.origin} answered in TLS: it is an https:// endpoint")
            raise ConnectionResetError(f"not an HTTP/1 response: {status_line[:60]!r}")
        fields: dict[str, str] = {}
        for line in lines:
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip()
        keep = version == "HTTP/1.1" and "close" not in fields.get("connection", "").lower()
        return int(code), fields, view[end + 4 : got], keep

    async def _error_body(
        self,
        conn: Conn,
        body: bytes,
        length: int | None,
        timeouts: Timeouts,
        *,
        chunked: bool = False,
    ) -> bytes:
        limit = _ERROR_BODY_LIMIT if length is None else min(length, _ERROR_BODY_LIMIT)
        buffer = bytearray(limit)
        with contextlib.suppress(OSError, TimeoutError):
            async with asyncio.timeout(timeouts.stall):
                while len(body) < limit and not (chunked and body.endswith(b"0\r\n\r\n")):
                    n = await conn.recv_into(memoryview(buffer)[: limit - len(body)])
                    if not n:
                        break
                    body += buffer[:n]
        return body[:limit]


def _dechunk(data: bytes) -> bytes:
    """A body in HTTP/1.1 chunked transfer coding, decoded (as far as it is whole)."""
    out, at = bytearray(), 0
    while (end := data.find(b"\r\n", at)) >= 0:
        size_field = data[at:end].split(b";")[0].strip()
        try:
            size = int(size_field, 16)
        except ValueError:
            break
        if size == 0:
            break
        out += data[end + 2 : end + 2 + size]
        at = end + 2 + size + 2
    return bytes(out)


async def first_byte(response: Awaitable[T], timeouts: Timeouts) -> T:
    """``response`` (an awaitable that ends with the response's head), unless it does not
    come within ``timeouts.first_byte``: then a ``first_byte`` :class:`ChunkFailure`."""
    try:
        async with asyncio.timeout(timeouts.first_byte) as first:
            return await response
    except TimeoutError:
        if first.expired():
            raise ChunkFailure(
                "first_byte", f"no response within {timeouts.first_byte:g} s"
            ) from None
        raise
