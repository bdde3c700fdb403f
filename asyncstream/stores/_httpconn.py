"""One connection of the S3 store's HTTP/1.1 client (:mod:`._http`): a non-blocking
socket, plain or TLS, driven by the running loop, and where a response body goes
(:class:`Scatter`: consecutive buffers, filled in order, straight from the socket).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import select
import socket
import ssl
import sys
import termios
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


def _lowat(environ: Mapping[str, str]) -> int:
    """:data:`LOWAT`: 1 MiB on Linux, ``ASYNCSTREAM_RCVLOWAT`` bytes where set (0: off)."""
    if not sys.platform.startswith("linux"):
        return 0  # the option's wake-up rule is Linux's
    value = environ.get("ASYNCSTREAM_RCVLOWAT", "").strip()
    if not value:
        return 1 << 20
    try:
        return max(0, int(value))
    except ValueError:
        raise ValueError(f"ASYNCSTREAM_RCVLOWAT must be a number of bytes, not {value!r}") from None


LOWAT = _lowat(os.environ)
"""The most body bytes the kernel gathers before it wakes the reader (``SO_RCVLOWAT``);
0 or 1: off. See :func:`receive_from`."""

_TLS_RECORD_BYTES = 16384 + 256  # a TLS record's bytes at most (part of one may sit in OpenSSL)
_TAIL = 64 << 10  # the last bytes of a body, received in one wake-up (see _mark)


async def receive_from(conn: Conn, out: Scatter, timeouts: Timeouts) -> None:
    """Fill ``out`` from the connection, straight into its buffers.

    The kernel is asked to wake the reader only once :data:`LOWAT` bytes (1 MiB) are
    queued, then less as the body's end nears (:func:`_mark`), the mark put back to 1 for
    the connection's next response (``SO_RCVLOWAT``). Each wake-up costs the engine's
    loop a turn, a receive and a reschedule, and a connection paced by its link brought
    small pieces a wake-up. Over the S3-like link (nginx, 90 MB/s a connection) the
    engine's CPU per GB at the same MB/s: plain HTTP 0.98 s without the mark and 0.49
    with it (1 MiB GETs), 0.69 and 0.23 (16 MiB); HTTPS 1.29 and 1.13, 0.92 and 0.84,
    where decrypting 16 KiB records one at a time is most of the rest (``python -m
    bench.tls --server nginx --network s3-like --rcvlowat``, bench/RESULTS.md).

    Over TLS the bytes queued are ciphertext, and OpenSSL may hold part of a record read
    already: the mark stays a record below what the body still lacks, so that what is
    still to come always reaches it. A link slower than the mark: every quarter of
    ``timeouts.stall`` without a wake-up, bytes queued put the mark back to 1 for the
    rest of the body (the kernel then wakes the reader), so the stall timer still fires
    only where nothing came (a watchdog on the loop, not a cancellation: a receive that
    completed is never lost).
    """
    if LOWAT <= 1:
        await receive(out, lambda: _step(conn, out), timeouts)
        return
    loop = asyncio.get_running_loop()
    sock = conn.sock
    record = _TLS_RECORD_BYTES if conn.tls is not None else 0
    lowat, enabled, seen = 1, True, -1
    watchdog: asyncio.TimerHandle | None = None

    def mark(value: int) -> None:
        nonlocal lowat
        if value != lowat:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, value)
            lowat = value

    async def step() -> int:
        if enabled:
            mark(_mark(out.total - out.pos - record))
        return await _step(conn, out)

    def watch() -> None:
        nonlocal enabled, seen, watchdog
        try:
            if out.pos == seen and lowat > 1 and _queued(sock) > 0:
                enabled = False  # slower than the mark: woken for every byte from now on
                mark(1)
                return
        except OSError:  # the socket closed under it: the stall timer or the error decides
            return
        seen = out.pos
        watchdog = loop.call_later(timeouts.stall / 4, watch)

    watchdog = loop.call_later(timeouts.stall / 4, watch)
    try:
        await receive(out, step, timeouts)
    finally:
        watchdog.cancel()  # the last one armed
        if lowat != 1:
            with contextlib.suppress(OSError):  # closed by a failure: nothing to put back
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)


def _mark(left: int) -> int:
    """The receive mark for a body that still lacks ``left`` bytes (a TLS record less):
    :data:`LOWAT` while more than twice that is to come, then half of what is left, and
    the last :data:`_TAIL` bytes at once. Halving the tail keeps the reader receiving
    while the body's last bytes arrive: a mark of all that is left made the reader wait
    for a 1 MiB block's last byte before copying any of it, which over loopback (where a
    block takes half a millisecond) read fewer MB/s than no mark at all."""
    if left <= 2 * _TAIL:
        return max(1, left)
    return min(LOWAT, left // 2)


async def _step(conn: Conn, out: Scatter) -> int:
    n = await conn.recv_into(out.space())
    out.advance(n)
    return n


def _queued(sock: socket.socket) -> int:
    """Bytes the kernel holds for ``sock``, unread (``FIONREAD``)."""
    queued = bytearray(4)
    fcntl.ioctl(sock.fileno(), termios.FIONREAD, queued)
    return int.from_bytes(queued, sys.byteorder)


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
