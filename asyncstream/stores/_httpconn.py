"""One connection of the S3 store's HTTP/1.1 client (:mod:`._http`): a non-blocking
socket, plain or TLS, driven by the running loop, and where a response body goes
(:class:`Scatter`: consecutive buffers, filled in order, straight from the socket).
"""

from __future__ import annotations

import asyncio
import select
import socket
import ssl
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from ._errors import ChunkFailure
from ._retry import Timeouts

__all__ = ["Conn", "Reply", "Scatter", "Stale", "receive", "receive_from"]

_HEAD_BYTES = 16 << 10  # a head and the body bytes read with it, in one receive


@dataclass(frozen=True)
class Reply:
    """A response: status, header fields (lower-case names) and, for an error status, its
    document (a success's body went into the caller's buffer)."""

    status: int
    fields: Mapping[str, str]
    body: bytes = b""


class Scatter:
    """Where a body goes: consecutive buffers (ring slots), filled in order, each reported
    by ``filled(index)`` as soon as it is full. One buffer is the common case; several let
    one GET fill the slots of consecutive chunks (the engine's coalesced requests)."""

    def __init__(
        self, views: Sequence[memoryview], filled: Callable[[int], None] | None = None
    ) -> None:
        self.views = views
        self.filled = filled
        self.total = sum(len(v) for v in views)
        self.pos = 0  # bytes received so far
        self._index = 0  # the buffer being filled
        self._at = 0  # bytes received into it
        self._skip_empty()

    def _skip_empty(self) -> None:
        while self._index < len(self.views) and self._at == len(self.views[self._index]):
            if self.filled is not None:
                self.filled(self._index)
            self._index += 1
            self._at = 0

    @property
    def done(self) -> bool:
        return self.pos >= self.total

    def space(self) -> memoryview:
        """The rest of the buffer being filled (receive into it, then :meth:`advance`)."""
        return self.views[self._index][self._at :]

    def advance(self, n: int) -> None:
        """``n`` bytes were received into :meth:`space`."""
        self._at += n
        self.pos += n
        self._skip_empty()

    def write(self, data: bytes | memoryview) -> None:
        """Copy ``data`` in (the body bytes that came with the headers; aiohttp's pieces).

        Raises:
            ChunkFailure: more bytes than the buffers hold.
        """
        view = memoryview(data)
        if len(view) > self.total - self.pos:
            raise ChunkFailure("length", f"more than the {self.total} bytes asked for")
        while view:
            space = self.space()
            n = min(len(space), len(view))
            space[:n] = view[:n]
            view = view[n:]
            self.advance(n)


class Conn:
    """One connection, plain or TLS, non-blocking, driven by the running loop."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock  # the SSLSocket itself for TLS (wrapping detaches the plain one)
        self.tls = sock if isinstance(sock, ssl.SSLSocket) else None
        self.requests = 0
        # Where a response's head is read (with the first body bytes that come with it),
        # made once per connection; grown for a larger head (``_http``).
        self.head = bytearray(_HEAD_BYTES)

    @property
    def fd(self) -> int:
        return self.sock.fileno()

    def idle_and_open(self) -> bool:
        """Whether an idle connection can take a request: not readable (a closed or
        misbehaving peer makes it readable) and, for TLS, nothing left decrypted."""
        if self.sock.fileno() < 0 or (self.tls is not None and self.tls.pending()):
            return False
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN | select.POLLHUP | select.POLLERR)
        return not poller.poll(0)

    async def _ready(self, write: bool) -> None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            if not future.done():
                future.set_result(None)

        if write:
            loop.add_writer(self.fd, wake)
        else:
            loop.add_reader(self.fd, wake)
        try:
            await future
        finally:
            (loop.remove_writer if write else loop.remove_reader)(self.fd)

    async def handshake(self) -> None:
        assert self.tls is not None
        while True:
            try:
                self.tls.do_handshake()
                return
            except ssl.SSLWantReadError:
                await self._ready(write=False)
            except ssl.SSLWantWriteError:
                await self._ready(write=True)

    async def sendall(self, data: bytes) -> None:
        if self.tls is None:
            await asyncio.get_running_loop().sock_sendall(self.sock, data)
            return
        view = memoryview(data)
        while view:
            try:
                view = view[self.tls.send(view) :]
            except ssl.SSLWantReadError:
                await self._ready(write=False)
            except ssl.SSLWantWriteError:
                await self._ready(write=True)

    async def recv_into(self, view: memoryview) -> int:
        """Bytes received into ``view`` (0 at the end of the stream).

        Over TLS, every record already readable is decrypted into ``view`` in one call
        (OpenSSL hands over one 16 KiB record per read): an await, and a reschedule of
        the caller's stall timer, per record would cost more than the decryption.
        """
        if self.tls is None:
            return await asyncio.get_running_loop().sock_recv_into(self.sock, view)
        total, size = 0, len(view)
        while True:
            try:
                while total < size:
                    n = self.tls.recv_into(view[total:], size - total)
                    if not n:
                        return total
                    total += n
                return total
            except ssl.SSLWantReadError:
                if total:
                    return total
                await self._ready(write=False)
            except ssl.SSLWantWriteError:
                if total:
                    return total
                await self._ready(write=True)
            except ssl.SSLEOFError:
                return total  # the peer closed without close_notify: an end, as for TCP

    def close(self) -> None:
        self.sock.close()


class Stale(Exception):
    """A connection that ended before the first byte of its response."""


async def receive_from(conn: Conn, out: Scatter, timeouts: Timeouts) -> None:
    """Fill ``out`` from the connection, straight into its buffers."""

    async def step() -> int:
        n = await conn.recv_into(out.space())
        out.advance(n)
        return n

    await receive(out, step, timeouts)


async def receive(out: Scatter, step: Callable[[], Awaitable[int]], timeouts: Timeouts) -> None:
    """Fill ``out`` by calling ``step`` (which puts some bytes into it and says how many;
    0 at the end of the body); a stall or an early end fails."""
    loop = asyncio.get_running_loop()
    # The stall timer moves at most every `quantum` seconds, not at every receive (a
    # timer cancelled and made again each time was a tenth of the engine's CPU over a
    # paced link): a stall is then called after at least stall - quantum seconds
    # without a byte, a hundredth of the timeout early at worst.
    quantum = min(timeouts.stall / 100, 0.05)
    try:
        async with asyncio.timeout(timeouts.stall) as stall:
            moved = loop.time()
            while not out.done:
                if not await step():
                    break
                now = loop.time()
                if now - moved >= quantum:
                    stall.reschedule(now + timeouts.stall)
                    moved = now
    except TimeoutError:
        if stall.expired():
            raise ChunkFailure(
                "stall", f"no byte for {timeouts.stall:g} s after {out.pos} of {out.total}"
            ) from None
        raise
    if not out.done:
        raise ChunkFailure("truncated", f"the body ended after {out.pos} of {out.total} bytes")
