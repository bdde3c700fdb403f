"""The receive mark (``SO_RCVLOWAT``) of the engine's HTTP client, against a real server on
loopback that paces its bodies, over HTTP and HTTPS: a body slower than the mark is read
whole and is no stall; a connection with nothing queued still stalls; the mark is put back
for the connection's next response (:func:`asyncstream.stores._httpconn.receive_from`)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import socketserver
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncstream.stores import _httpconn
from asyncstream.stores._errors import ChunkFailure
from asyncstream.stores._http import ConnectionPool
from asyncstream.stores._httpconn import Scatter
from asyncstream.stores._origin import Origin
from asyncstream.stores._retry import Timeouts
from asyncstream.testing import make_test_certificates

pytestmark = pytest.mark.skipif(_httpconn.LOWAT <= 1, reason="the receive mark is Linux's")

BIG = 3 << 20  # over twice the mark: the mark at LOWAT first, then lowered
SLOW = 96 << 10  # paced: 48 pieces of 2 KiB, 30 ms apart (about 1.4 s)
BODY = bytes(range(256)) * (BIG // 256)


class _Handler(socketserver.StreamRequestHandler):
    """Answers each GET on a kept-alive connection by its path: ``/big`` at once,
    ``/slow`` paced, ``/small`` (100 bytes), ``/stuck`` half its body and then nothing."""

    def handle(self) -> None:
        while True:
            line = self.rfile.readline()
            if not line:
                return
            path = line.split()[1].decode()
            while self.rfile.readline() not in (b"\r\n", b""):
                pass
            size = {"/big": BIG, "/slow": SLOW, "/small": 100, "/stuck": SLOW}[path]
            body = BODY[:size]
            self.wfile.write(f"HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n".encode())
            self.wfile.flush()
            if path == "/slow":
                for at in range(0, size, 2048):
                    self.wfile.write(body[at : at + 2048])
                    self.wfile.flush()
                    time.sleep(0.03)
            elif path == "/stuck":
                self.wfile.write(body[: size // 2])
                self.wfile.flush()
                self.server.stuck.wait(30)  # type: ignore[attr-defined]
                return
            else:
                self.wfile.write(body)
                self.wfile.flush()


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, tls: ssl.SSLContext | None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.tls = tls
        self.stuck = threading.Event()

    def get_request(self) -> tuple[socket.socket, object]:
        sock, address = super().get_request()
        if self.tls is not None:
            sock = self.tls.wrap_socket(sock, server_side=True)
        return sock, address


@pytest.fixture(params=["http", "https"])
def pool(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ConnectionPool]:
    tls = client = None
    if request.param == "https":
        certs = make_test_certificates(tmp_path)
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(*certs.server)
        client = ssl.create_default_context(cafile=certs.ca)
    server = _Server(tls)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    origin = Origin(request.param, "127.0.0.1", server.server_address[1])
    pool = ConnectionPool(origin, ssl_context=client, limit=1)
    try:
        yield pool
    finally:
        pool.close()
        server.stuck.set()
        server.shutdown()
        server.server_close()


def _get(pool: ConnectionPool, path: str, size: int, timeouts: Timeouts) -> bytes:
    """One GET through the pool into a buffer of ``size`` bytes; its body."""
    buffer = bytearray(size)

    async def run() -> None:
        url = f"{pool.origin.scheme}://127.0.0.1:{pool.origin.port}{path}"
        await pool.get(url, {}, Scatter([memoryview(buffer)]), timeouts)

    asyncio.run(run())
    return bytes(buffer)


def _marks(pool: ConnectionPool) -> list[int]:
    """The receive mark of each idle connection."""
    return [c.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) for c in pool._idle]


def test_a_body_slower_than_the_mark_is_read_whole_and_no_stall(pool: ConnectionPool) -> None:
    """The paced body takes about 1.4 s and never brings the mark's bytes within the
    0.6 s stall timeout: the watchdog sees bytes queued and puts the mark back to 1."""
    timeouts = Timeouts(connect=5, first_byte=5, stall=0.6, chunk=30)
    assert _get(pool, "/slow", SLOW, timeouts) == BODY[:SLOW]
    assert _marks(pool) == [1]


def test_a_connection_with_nothing_queued_still_stalls(pool: ConnectionPool) -> None:
    timeouts = Timeouts(connect=5, first_byte=5, stall=0.6, chunk=30)
    with pytest.raises(ChunkFailure) as info:
        _get(pool, "/stuck", SLOW, timeouts)
    assert info.value.cause == "stall"
    assert f"after {SLOW // 2} of {SLOW}" in str(info.value)


def test_the_mark_is_put_back_for_the_next_response(pool: ConnectionPool) -> None:
    """A body over the mark, then a 100-byte one on the same kept-alive connection: with
    the mark left up, its head would never wake the reader (first_byte would run out)."""
    timeouts = Timeouts(connect=5, first_byte=2, stall=5, chunk=30)
    assert _get(pool, "/big", BIG, timeouts) == BODY
    assert _marks(pool) == [1]
    assert _get(pool, "/small", 100, timeouts) == BODY[:100]
    assert (pool.opened, pool.reused) == (1, 1)
    assert _marks(pool) == [1]


def test_the_mark_is_what_the_body_still_lacks_up_to_lowat(pool: ConnectionPool) -> None:
    """The mark seen at each receive of a large body: LOWAT while more than twice that is
    to come, then half of what is left, the last 64 KiB at once (over TLS, a record
    less: part of one may be in OpenSSL)."""
    seen: list[tuple[int, int]] = []
    step = _httpconn._step

    async def spy(conn: _httpconn.Conn, out: Scatter) -> int:
        mark = conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT)
        seen.append((out.total - out.pos, mark))
        return await step(conn, out)

    timeouts = Timeouts(connect=5, first_byte=5, stall=5, chunk=30)
    with contextlib.ExitStack() as stack:
        stack.callback(setattr, _httpconn, "_step", step)
        _httpconn._step = spy
        assert _get(pool, "/big", BIG, timeouts) == BODY
    record = _httpconn._TLS_RECORD_BYTES if pool.origin.tls else 0
    assert seen
    assert seen[0][1] == _httpconn.LOWAT
    for left, mark in seen:
        lacking = left - record
        expected = max(1, lacking) if lacking <= 128 << 10 else min(1 << 20, lacking // 2)
        assert mark == expected


def test_the_mark_off_leaves_every_receive_woken_at_once(
    pool: ConnectionPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ASYNCSTREAM_RCVLOWAT=0`` (LOWAT 0): the mark is never raised."""
    monkeypatch.setattr(_httpconn, "LOWAT", 0)
    seen: list[int] = []
    step = _httpconn._step

    async def spy(conn: _httpconn.Conn, out: Scatter) -> int:
        seen.append(conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT))
        return await step(conn, out)

    monkeypatch.setattr(_httpconn, "_step", spy)
    timeouts = Timeouts(connect=5, first_byte=5, stall=5, chunk=30)
    assert _get(pool, "/big", BIG, timeouts) == BODY
    assert seen
    assert set(seen) == {1}


@pytest.mark.parametrize(
    ("environ", "lowat"),
    [
        ({}, 1 << 20),
        ({"ASYNCSTREAM_RCVLOWAT": "0"}, 0),
        ({"ASYNCSTREAM_RCVLOWAT": " 65536 "}, 65536),
    ],
)
def test_the_mark_is_1_mib_unless_the_environment_says(environ: dict[str, str], lowat: int) -> None:
    assert _httpconn._lowat(environ) == lowat


def test_a_mark_that_is_no_number_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="ASYNCSTREAM_RCVLOWAT must be a number of bytes"):
        _httpconn._lowat({"ASYNCSTREAM_RCVLOWAT": "1MiB"})
