"""One attempt at one chunk: a ranged GET written straight into a ring slot.

Two transports, chosen per endpoint (``EngineConfig.transport``):

* **direct** (``http://`` endpoints with no HTTP proxy configured: MinIO in the cluster,
  the embedded server): botocore builds and signs the GetObject request as always
  (credentials and their refresh, region, addressing style, ``Range``, ``If-Match``),
  and its ``before-send`` hook (:func:`enable_direct`) sends it on a socket of the
  engine's own, receiving the body with ``sock_recv_into`` straight into the slot: the
  kernel copies the bytes into shared memory and nothing in user space copies them
  again. This takes well under half the CPU per byte of the aiohttp path (measured in
  ``bench/RESULTS.md``). botocore then parses the response: its headers for a success,
  the error document for a failure, so errors are the same ``ClientError`` whichever
  transport ran, and retries, throttling and messages do not depend on it. One
  connection per chunk (``Connection: close``): a chunk is megabytes, the handshake is
  noise next to it.
* **aiohttp** (``https://``, proxies, or ``transport="aiohttp"``): botocore's own
  request. aiohttp hands the body over as the ``bytes`` pieces its parser cut from the
  socket buffer; each piece is copied once, into the slot (``out[pos:pos + n] = piece``),
  so a chunk costs one copy beyond aiohttp's own on its way to shared memory.

Validation: the response must cover exactly the requested range (a server that ignores
``Range`` or sends more bytes fails the attempt) and, where an ETag was listed and
``check_etag`` is on, the object's ETag must still be the listed one: the request carries
``If-Match``, so S3 answers 412 for an object replaced mid-epoch, and the response's
ETag is compared as well, for stores that ignore ``If-Match``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import urllib.request
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import unquote, urlparse, urlsplit

from aiobotocore.awsrequest import AioAWSResponse
from multidict import CIMultiDict

from ._retry import ChunkFailure, Timeouts

__all__ = ["ChunkRequest", "direct_transport", "enable_direct", "fetch_local", "fetch_s3"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ChunkRequest:
    """A byte range of a shard.

    Attributes:
        url: the shard, ``s3://bucket/key`` or ``file:///path``.
        offset: first byte of the range.
        length: bytes in the range (at most the slot size).
        etag: the shard's ETag from the listing, if any.
        final: whether this is the shard's last chunk (counts shards in statistics).
    """

    url: str
    offset: int
    length: int
    etag: str | None = None
    final: bool = True


@dataclass(frozen=True, slots=True)
class Timing:
    """Seconds from the request to the response headers, and to the last byte."""

    first_byte: float
    total: float


_HEAD_LIMIT = 64 << 10  # response headers larger than this are refused
_ERROR_BODY_LIMIT = 64 << 10  # an error document is read up to this


def _split(url: str) -> tuple[str, str]:
    bucket, _, key = url[len("s3://") :].partition("/")
    return bucket, key


def direct_transport(endpoint_url: str | None) -> bool:
    """Whether chunks from this endpoint can take the direct transport (module docs)."""
    if not endpoint_url or not endpoint_url.startswith("http://"):
        return False
    host = urlsplit(endpoint_url).hostname or ""
    return "http" not in urllib.request.getproxies() or bool(urllib.request.proxy_bypass(host))


async def fetch_s3(
    client: Any,
    request: ChunkRequest,
    out: memoryview,
    *,
    timeouts: Timeouts,
    check_etag: bool,
    direct: bool = False,
) -> Timing:
    """Download ``request`` into ``out[:request.length]``; one attempt, no retry.

    Args:
        direct: take the direct transport (see the module docs; the endpoint must be
            ``http://``), else botocore's own request.

    Raises:
        ChunkFailure: a short or oversized body, a stall, a timeout, an ETag mismatch.
        Exception: whatever botocore or aiohttp raised, or for the direct transport a
            botocore ``ClientError`` for an error response and ``OSError`` for the
            connection (classified by the caller).
    """
    loop = asyncio.get_running_loop()
    start = loop.time()
    get = _get_direct if direct else _get_botocore
    try:
        async with asyncio.timeout(timeouts.chunk) as whole:
            headers_at = await get(client, request, out, timeouts, check_etag)
    except TimeoutError:
        if whole.expired():
            raise ChunkFailure(
                "chunk_timeout", f"chunk not complete within {timeouts.chunk:g} s"
            ) from None
        raise
    return Timing(headers_at - start, loop.time() - start)


async def _first_byte(response: Awaitable[T], timeouts: Timeouts) -> T:
    """``response``, unless no response comes within ``timeouts.first_byte``."""
    try:
        async with asyncio.timeout(timeouts.first_byte) as first:
            return await response
    except TimeoutError:
        if first.expired():
            raise ChunkFailure(
                "first_byte", f"no response within {timeouts.first_byte:g} s"
            ) from None
        raise


def _get_params(request: ChunkRequest, check_etag: bool) -> dict[str, Any]:
    """The GetObject parameters of a chunk."""
    bucket, key = _split(request.url)
    params: dict[str, Any] = {
        "Bucket": bucket,
        "Key": key,
        "Range": f"bytes={request.offset}-{request.offset + request.length - 1}",
    }
    if check_etag and request.etag:
        params["IfMatch"] = request.etag
    return params


def _check_response(
    request: ChunkRequest, check_etag: bool, etag: str | None, content_length: int | None
) -> None:
    """The response is for the listed object version and has exactly the range's bytes."""
    if check_etag and request.etag and etag not in (None, request.etag):
        raise ChunkFailure("checksum", f"ETag {etag} differs from the listed {request.etag}")
    if content_length != request.length:
        raise ChunkFailure(
            "length",
            f"asked for {request.length} bytes at {request.offset}, "
            f"the response has {content_length}",
        )


async def _receive(
    read_into: Callable[[memoryview], Awaitable[int]],
    out: memoryview,
    pos: int,
    length: int,
    timeouts: Timeouts,
) -> None:
    """Fill ``out[pos:length]`` with ``read_into`` (0 at end of body); a stall fails."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeouts.stall) as stall:
            while pos < length:
                n = await read_into(out[pos:length])
                if not n:
                    break
                pos += n
                stall.reschedule(loop.time() + timeouts.stall)
    except TimeoutError:
        if stall.expired():
            raise ChunkFailure(
                "stall", f"no byte for {timeouts.stall:g} s after {pos} of {length}"
            ) from None
        raise
    if pos < length:
        raise ChunkFailure("truncated", f"the body ended after {pos} of {length} bytes")


# -- botocore's request (aiohttp) ------------------------------------------------------


async def _get_botocore(
    client: Any, request: ChunkRequest, out: memoryview, timeouts: Timeouts, check_etag: bool
) -> float:
    """The aiohttp transport; returns the loop time the response headers came."""
    response = await _first_byte(client.get_object(**_get_params(request, check_etag)), timeouts)
    headers_at = asyncio.get_running_loop().time()
    raw = response["Body"].raw_stream  # the aiohttp ClientResponse
    complete = False
    try:
        _check_response(request, check_etag, response.get("ETag"), response.get("ContentLength"))
        stream = raw.content

        async def read_into(view: memoryview) -> int:
            piece = await stream.readany()
            n = len(piece)
            if n > len(view):
                raise ChunkFailure("length", f"more than the {request.length} bytes asked for")
            view[:n] = piece
            return n

        await _receive(read_into, out, 0, request.length, timeouts)
        complete = True
    finally:
        if complete:
            raw.release()  # back to the pool for keep-alive
        else:
            raw.close()  # a half-read connection cannot be reused
    return headers_at


# -- the direct transport --------------------------------------------------------------


@dataclass
class _Target:
    """Where the direct transport puts the chunk being fetched in this task."""

    request: ChunkRequest
    out: memoryview
    timeouts: Timeouts
    check_etag: bool
    headers_at: float = 0.0


_target: ContextVar[_Target | None] = ContextVar("asyncstream_direct", default=None)


class _Body:
    """The raw body of a response the direct transport hands botocore."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    async def read(self, *_: Any) -> bytes:
        return self.data


def enable_direct(client: Any) -> None:
    """Let ``client``'s GetObject calls take the direct transport when
    :func:`fetch_s3` asks for it (a ``before-send`` handler; other calls are unchanged)."""
    client.meta.events.register("before-send.s3.GetObject", _send_direct)


async def _get_direct(
    client: Any, request: ChunkRequest, out: memoryview, timeouts: Timeouts, check_etag: bool
) -> float:
    """The direct transport; returns the loop time the response headers came.

    botocore builds and signs the request as always; its ``before-send`` handler
    (:func:`_send_direct`) then sends it on a socket of its own and receives the body
    into ``out`` before botocore parses the (bodiless) response.
    """
    target = _Target(request, out, timeouts, check_etag)
    token = _target.set(target)
    try:
        response = await client.get_object(**_get_params(request, check_etag))
    finally:
        _target.reset(token)
    if not target.headers_at:  # botocore sent it itself: the body is not in the slot
        response["Body"].close()
        raise RuntimeError("the direct transport is not enabled on this client")
    return target.headers_at


async def _send_direct(request: Any, **_: Any) -> AioAWSResponse | None:
    """botocore's ``before-send``: do the HTTP exchange for the target of this task."""
    target = _target.get()
    if target is None:
        return None  # not a chunk: botocore sends it
    loop = asyncio.get_running_loop()
    parts = urlsplit(request.url)
    headers = {
        name: value.decode("latin-1") if isinstance(value, bytes) else str(value)
        for name, value in request.headers.items()
        if name.lower() != "connection"
    }
    if not any(name.lower() == "host" for name in headers):
        # As botocore's signer wrote it when the request has no Host: no default port.
        headers["Host"] = parts.netloc.removesuffix(":80")
    headers["Connection"] = "close"
    target_line = parts.path + (f"?{parts.query}" if parts.query else "")
    head = f"{request.method} {target_line} HTTP/1.1\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers.items()) + "\r\n"
    timeouts = target.timeouts
    sock = await _connect(parts.hostname or "", parts.port or 80, timeouts.connect)
    try:
        await loop.sock_sendall(sock, head.encode("latin-1"))
        status, fields, body = await _first_byte(_read_head(sock), timeouts)
        target.headers_at = loop.time()
        if status >= 300:  # botocore parses the error document into its ClientError
            body = await _read_error_body(sock, fields, body, timeouts)
            return AioAWSResponse(request.url, status, CIMultiDict(fields), _Body(body))
        if "chunked" in fields.get("transfer-encoding", ""):
            raise ChunkFailure("length", "a chunked response to a ranged GET")
        chunk = target.request
        declared = fields.get("content-length", "")
        _check_response(
            chunk,
            target.check_etag,
            fields.get("etag"),
            int(declared) if declared.isdigit() else None,
        )
        if len(body) > chunk.length:
            raise ChunkFailure("length", f"more than the {chunk.length} bytes asked for")
        target.out[: len(body)] = body
        await _receive(
            lambda view: loop.sock_recv_into(sock, view),
            target.out,
            len(body),
            chunk.length,
            timeouts,
        )
        return AioAWSResponse(request.url, status, CIMultiDict(fields), _Body(b""))
    finally:
        sock.close()


async def _connect(host: str, port: int, connect_s: float) -> socket.socket:
    """A connected non-blocking TCP socket (each address in turn)."""
    loop = asyncio.get_running_loop()
    error: OSError = ConnectionError(f"no address for {host}:{port}")
    for family, kind, proto, _, address in await loop.getaddrinfo(
        host, port, type=socket.SOCK_STREAM
    ):
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            async with asyncio.timeout(connect_s) as limit:
                await loop.sock_connect(sock, address)
            return sock
        except TimeoutError:
            sock.close()
            if not limit.expired():
                raise
            error = ConnectionError(f"connecting to {host}:{port} took over {connect_s:g} s")
        except OSError as exc:
            sock.close()
            error = exc
        except BaseException:
            sock.close()
            raise
    raise error


async def _read_head(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """The response's status, its header fields (lower-case names) and the body bytes
    that came with them."""
    loop = asyncio.get_running_loop()
    data = b""
    while (end := data.find(b"\r\n\r\n")) < 0:
        if len(data) > _HEAD_LIMIT:
            raise ChunkFailure("length", f"response headers over {_HEAD_LIMIT} bytes")
        piece = await loop.sock_recv(sock, 65536)
        if not piece:
            raise ConnectionResetError("the server closed the connection before responding")
        data += piece
    status_line, *header_lines = data[:end].decode("latin-1").split("\r\n")
    version, _, rest = status_line.partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise ConnectionResetError(f"not an HTTP/1 response: {status_line[:60]!r}")
    fields = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        fields[name.strip().lower()] = value.strip()
    return int(code), fields, data[end + 4 :]


async def _read_error_body(
    sock: socket.socket, fields: dict[str, str], body: bytes, timeouts: Timeouts
) -> bytes:
    """An error response's document, up to ``_ERROR_BODY_LIMIT`` bytes."""
    loop = asyncio.get_running_loop()
    declared = fields.get("content-length", "")
    limit = min(int(declared), _ERROR_BODY_LIMIT) if declared.isdigit() else _ERROR_BODY_LIMIT
    with contextlib.suppress(OSError, TimeoutError):
        async with asyncio.timeout(timeouts.stall):
            while len(body) < limit:
                piece = await loop.sock_recv(sock, limit - len(body))
                if not piece:
                    break
                body += piece
    return body[:limit]


async def fetch_local(request: ChunkRequest, out: memoryview) -> Timing:
    """Read a range of a local file into ``out`` (in a worker thread)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    path = unquote(urlparse(request.url).path)

    def read() -> int:
        fd = os.open(path, os.O_RDONLY)
        try:
            return os.preadv(fd, [out[: request.length]], request.offset)
        finally:
            os.close(fd)

    n = await loop.run_in_executor(None, read)
    if n != request.length:
        raise ChunkFailure("truncated", f"read {n} of {request.length} bytes from {path}")
    elapsed = loop.time() - start
    return Timing(elapsed, elapsed)
