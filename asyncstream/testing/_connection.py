"""One client connection of a :class:`~asyncstream.testing.FaultProxy` and the upstream
connection that serves it: requests are forwarded byte for byte, response bodies streamed
in chunks (paced by the network profile), and each request's fault acted out on the wire
(an S3 error answered here, a body cut by a TCP RST or a clean close, a stall, a delay)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from typing import Final, Protocol

from ._control import Control
from ._faults import BODY_KINDS, ERROR_KINDS, Action, Fault
from ._http import (
    CHUNKED,
    LENGTH,
    UNTIL_CLOSE,
    BadMessage,
    Request,
    Response,
    chunk_size,
    error_response,
    plain_response,
)
from ._network import NetworkProfile, Pacer

__all__ = ["Connection", "Proxy"]

_log = logging.getLogger("asyncstream.testing")

_UPSTREAM_LIMIT: Final = 1024 * 1024
_CHUNK: Final = 1024 * 1024


class _Abort(Exception):
    """Ends a client connection: with a TCP RST (``rst``) or a clean close."""

    def __init__(self, *, rst: bool) -> None:
        super().__init__("rst" if rst else "fin")
        self.rst = rst


def _set_rst(writer: asyncio.StreamWriter) -> None:
    """Make the coming close of this connection a TCP RST (SO_LINGER with a zero timeout)."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


class Proxy(Protocol):
    """What a connection uses of the :class:`~asyncstream.testing.FaultProxy` that accepted
    it: the network profile, the upstream address, the request headers to strip, and the
    register of open transports (closed with the proxy). A protocol, so that this module
    stands below the proxy that makes connections."""

    @property
    def profile(self) -> NetworkProfile: ...

    strip_request_headers: frozenset[str]
    _up_host: str
    _up_port: int

    def _track(self, transport: asyncio.WriteTransport) -> None: ...

    def _untrack(self, transport: asyncio.WriteTransport) -> None: ...


class Connection:
    """One client connection and the upstream connection that serves it.

    Args:
        proxy: the proxy that accepted it (its upstream address, its transports).
        control: the proxy's shared state: what each request gets, the counters.
        reader: the client side's stream reader.
        writer: the client side's stream writer.
    """

    def __init__(
        self,
        proxy: Proxy,
        control: Control,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.proxy = proxy
        self.control = control
        self.reader = reader
        self.writer = writer
        rate = proxy.profile.bandwidth_bytes_per_s
        self.pacer = Pacer(rate) if rate is not None else None
        self.up_reader: asyncio.StreamReader | None = None
        self.up_writer: asyncio.StreamWriter | None = None
        # State of the body being forwarded.
        self.fault: Action | None = None
        self.cut: int | None = None
        self.sent = 0

    async def serve(self) -> None:
        """Serve the client's requests until it closes, a fault ends it, or it fails."""
        try:
            while True:
                try:
                    head = await self.reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return  # the client closed the connection
                except asyncio.LimitOverrunError:
                    await self._send_raw(plain_response(431, "request head too large\n"))
                    return
                try:
                    request = Request.parse(head)
                except BadMessage as exc:
                    await self._send_raw(plain_response(exc.status, f"{exc}\n"))
                    return
                if not await self._exchange(request):
                    return
        except _Abort as abort:
            if abort.rst:
                _set_rst(self.writer)
                self.writer.transport.abort()
            self.close_upstream(abort=True)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, BadMessage) as e:
            _log.debug("FaultProxy: connection ended: %r", e)
            self.writer.transport.abort()
            self.close_upstream(abort=True)
        finally:
            self.writer.close()
            self.close_upstream(abort=False)

    async def _send_raw(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def _exchange(self, request: Request) -> bool:
        """Serve one request; returns whether the client connection stays open."""
        action, delay, request_id = self.control.decide(request)
        keep_alive = request.keep_alive
        if action is not None and action.kind in ERROR_KINDS:
            self.control.log_request(request, action.status)
            if request.expect_continue:
                keep_alive = False  # the client waits to send its body; never read it
            else:
                await self._copy_request_body(request, None)
            if delay > 0:
                await asyncio.sleep(delay)
            await self._send_raw(
                error_response(
                    action.status,
                    action.code,
                    action.message,
                    request_id=request_id,
                    head_only=request.method == "HEAD",
                    keep_alive=keep_alive,
                )
            )
            return keep_alive

        counted = request.method == "GET"
        if counted:
            self.control.count_active(1)
        try:
            return await self._forward(request, action, delay, keep_alive)
        finally:
            if counted:
                self.control.count_active(-1)

    async def _forward(
        self, request: Request, action: Action | None, delay: float, keep_alive: bool
    ) -> bool:
        if request.expect_continue and request.version == "HTTP/1.1":
            await self._send_raw(b"HTTP/1.1 100 Continue\r\n\r\n")
        try:
            response = await self._roundtrip(request)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            _log.debug("FaultProxy: upstream failed: %r", exc)
            self.control.log_request(request, 502)
            self.close_upstream(abort=True)
            await self._send_raw(plain_response(502, f"upstream failed: {exc!r}\n"))
            return False
        except BadMessage as exc:
            self.control.log_request(request, exc.status)
            self.close_upstream(abort=True)
            await self._send_raw(plain_response(exc.status, f"{exc}\n"))
            return False
        self.control.log_request(request, response.status)
        if action is not None and action.kind is Fault.LATENCY:
            delay += action.seconds
        if delay > 0:
            await asyncio.sleep(delay)
        keep_alive = keep_alive and response.framing != UNTIL_CLOSE
        await self._send_raw(response.client_head(keep_alive=keep_alive))
        await self._forward_body(response, action)
        if not response.reusable:
            self.close_upstream(abort=False)
        return keep_alive

    # ---------------------------------------------------------------- upstream side

    async def _roundtrip(self, request: Request) -> Response:
        """Send the request upstream and read the response head."""
        retry = request.length == 0  # nothing consumed from the client: safe to resend
        while True:
            reused, up_reader, up_writer = await self._open_upstream()
            try:
                up_writer.write(request.upstream_head(self.proxy.strip_request_headers))
                await up_writer.drain()
                await self._copy_request_body(request, up_writer)
                self.control.count("forwarded")
                while True:
                    head = await up_reader.readuntil(b"\r\n\r\n")
                    response = Response.parse(head, request.method)
                    if not 100 <= response.status < 200 or response.status == 101:
                        return response
            except (OSError, asyncio.IncompleteReadError) as exc:
                partial = isinstance(exc, asyncio.IncompleteReadError) and exc.partial
                if not (reused and retry and not partial):
                    raise
                _log.debug("FaultProxy: stale upstream connection, reconnecting: %r", exc)
                self.close_upstream(abort=True)
                retry = False

    async def _open_upstream(self) -> tuple[bool, asyncio.StreamReader, asyncio.StreamWriter]:
        """The upstream connection, opened if need be, and whether it was reused."""
        reader, writer = self.up_reader, self.up_writer
        if reader is not None and writer is not None and not reader.at_eof():
            return True, reader, writer
        self.close_upstream(abort=True)
        proxy = self.proxy
        reader, writer = await asyncio.open_connection(
            proxy._up_host, proxy._up_port, limit=_UPSTREAM_LIMIT
        )
        proxy._track(writer.transport)
        self.up_reader, self.up_writer = reader, writer
        return False, reader, writer

    def close_upstream(self, *, abort: bool) -> None:
        writer, self.up_writer, self.up_reader = self.up_writer, None, None
        if writer is not None:
            if abort:
                writer.transport.abort()
            else:
                writer.close()
            self.proxy._untrack(writer.transport)

    async def _copy_exactly(self, remaining: int, sink: asyncio.StreamWriter | None) -> None:
        """Copy (or, with no sink, discard) ``remaining`` bytes of the request."""
        while remaining:
            data = await self.reader.read(min(remaining, _CHUNK))
            if not data:
                raise asyncio.IncompleteReadError(b"", remaining)
            remaining -= len(data)
            if sink is not None:
                sink.write(data)
                await sink.drain()

    async def _copy_request_body(self, request: Request, sink: asyncio.StreamWriter | None) -> None:
        """Copy (or, with no sink, discard) the request body, keeping its framing."""
        reader = self.reader
        if request.length is not None:
            await self._copy_exactly(request.length, sink)
            return
        while True:  # chunked
            line = await reader.readuntil(b"\r\n")
            size = chunk_size(line)
            parts = [line]
            if size == 0:
                while True:
                    trailer = await reader.readuntil(b"\r\n")
                    parts.append(trailer)
                    if trailer == b"\r\n":
                        break
            if sink is not None:
                sink.write(b"".join(parts))
            if size == 0:
                if sink is not None:
                    await sink.drain()
                return
            await self._copy_exactly(size, sink)
            crlf = await reader.readexactly(2)
            if crlf != b"\r\n":
                raise BadMessage(400, "malformed chunked body")
            if sink is not None:
                sink.write(crlf)

    # ---------------------------------------------------------------- response body

    async def _forward_body(self, response: Response, action: Action | None) -> None:
        self.sent = 0
        self.fault = action if action is not None and action.kind in BODY_KINDS else None
        self.cut = None
        if self.fault is not None:
            if self.fault.after_bytes is not None:
                self.cut = self.fault.after_bytes
            elif response.length is not None:
                self.cut = int(response.length * self.fault.body_fraction)
            else:
                self.cut = 0
            if self.cut == 0:
                await self._fire()
        reader = self.up_reader
        assert reader is not None
        if response.framing == LENGTH:
            assert response.length is not None
            await self._copy_payload(reader, response.length)
        elif response.framing == CHUNKED:
            while True:
                line = await reader.readuntil(b"\r\n")
                size = chunk_size(line)
                await self._write(line)
                if size == 0:
                    while True:
                        trailer = await reader.readuntil(b"\r\n")
                        await self._write(trailer)
                        if trailer == b"\r\n":
                            break
                    break
                await self._copy_payload(reader, size)
                await self._write(await reader.readexactly(2))
        else:
            while data := await reader.read(_CHUNK):
                await self._payload(data)
        if self.fault is not None:
            await self._fire()

    async def _copy_payload(self, reader: asyncio.StreamReader, size: int) -> None:
        remaining = size
        while remaining:
            data = await reader.read(min(remaining, _CHUNK))
            if not data:
                raise asyncio.IncompleteReadError(b"", remaining)
            remaining -= len(data)
            await self._payload(data)

    async def _payload(self, data: bytes) -> None:
        if self.fault is not None and self.cut is not None and self.sent + len(data) >= self.cut:
            head, data = data[: self.cut - self.sent], data[self.cut - self.sent :]
            await self._write(head)
            self.sent += len(head)
            self.control.count("bytes_forwarded", len(head))
            await self._fire()
        if data:
            await self._write(data)
            self.sent += len(data)
            self.control.count("bytes_forwarded", len(data))

    async def _write(self, data: bytes) -> None:
        writer = self.writer
        if self.pacer is None:
            writer.write(data)
            await writer.drain()
            return
        step = self.pacer.slice
        for start in range(0, len(data), step):
            piece = data[start : start + step]
            await self.pacer.take(len(piece))
            writer.write(piece)
            await writer.drain()

    async def _fire(self) -> None:
        """Act out the pending body fault, now that its share of the body is out."""
        fault, self.fault = self.fault, None
        assert fault is not None
        # Push everything buffered into the kernel first, so the client gets those bytes.
        # (Over TLS, as far as the TLS layer: asyncio's SSL transport pauses at a buffer
        # size >= its high-water mark, so a mark of 0 would pause it for good.)
        transport = self.writer.transport
        tls = self.writer.get_extra_info("sslcontext") is not None
        transport.set_write_buffer_limits(high=1 if tls else 0, low=0)
        await self.writer.drain()
        transport.set_write_buffer_limits()
        if fault.kind is Fault.RESET:
            raise _Abort(rst=True)
        if fault.kind is Fault.TRUNCATE:
            raise _Abort(rst=False)
        await asyncio.sleep(fault.seconds)  # a stall; cancelled when the proxy closes
