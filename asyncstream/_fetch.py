"""One attempt at one chunk: a ranged GET written straight into a ring slot.

Copies: aiohttp hands the body over as the ``bytes`` pieces its parser cut from the
socket buffer; each piece is copied once, into the slot (``out[pos:pos + n] = piece``).
Nothing joins the pieces or buffers a whole chunk elsewhere, so a chunk costs one user
space copy on its way from the socket to shared memory.

Validation: the response must cover exactly the requested range (a server that ignores
``Range`` or sends more bytes fails the attempt) and, where an ETag was listed and
``check_etag`` is on, the object's ETag must still be the listed one: the request carries
``If-Match``, so S3 answers 412 for an object replaced mid-epoch, and the response's
ETag is compared as well, for stores that ignore ``If-Match``.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

from ._retry import ChunkFailure, Timeouts

__all__ = ["ChunkRequest", "fetch_local", "fetch_s3"]


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


def _split(url: str) -> tuple[str, str]:
    bucket, _, key = url[len("s3://") :].partition("/")
    return bucket, key


async def fetch_s3(
    client: Any,
    request: ChunkRequest,
    out: memoryview,
    *,
    timeouts: Timeouts,
    check_etag: bool,
) -> Timing:
    """Download ``request`` into ``out[:request.length]``; one attempt, no retry.

    Raises:
        ChunkFailure: a short or oversized body, a stall, a timeout, an ETag mismatch.
        Exception: whatever botocore or aiohttp raised (classified by the caller).
    """
    loop = asyncio.get_running_loop()
    start = loop.time()
    bucket, key = _split(request.url)
    end = request.offset + request.length - 1
    params: dict[str, Any] = {
        "Bucket": bucket,
        "Key": key,
        "Range": f"bytes={request.offset}-{end}",
    }
    if check_etag and request.etag:
        params["IfMatch"] = request.etag
    try:
        async with asyncio.timeout(timeouts.chunk) as whole:
            try:
                async with asyncio.timeout(timeouts.first_byte) as first:
                    response = await client.get_object(**params)
            except TimeoutError:
                if first.expired():
                    raise ChunkFailure(
                        "first_byte", f"no response within {timeouts.first_byte:g} s"
                    ) from None
                raise
            first_byte = loop.time() - start
            await _read_body(response, request, out, timeouts, check_etag)
    except TimeoutError:
        if whole.expired():
            raise ChunkFailure(
                "chunk_timeout", f"chunk not complete within {timeouts.chunk:g} s"
            ) from None
        raise
    return Timing(first_byte, loop.time() - start)


async def _read_body(
    response: dict[str, Any],
    request: ChunkRequest,
    out: memoryview,
    timeouts: Timeouts,
    check_etag: bool,
) -> None:
    body = response["Body"]
    raw = body.raw_stream  # the aiohttp ClientResponse
    complete = False
    try:
        if check_etag and request.etag and response.get("ETag") not in (None, request.etag):
            raise ChunkFailure(
                "checksum",
                f"ETag {response.get('ETag')} differs from the listed {request.etag}",
            )
        length = request.length
        if response.get("ContentLength") != length:
            raise ChunkFailure(
                "length",
                f"asked for {length} bytes at {request.offset}, "
                f"the response has {response.get('ContentLength')}",
            )
        loop = asyncio.get_running_loop()
        stream = raw.content
        pos = 0
        try:
            async with asyncio.timeout(timeouts.stall) as stall:
                while pos < length:
                    piece = await stream.readany()
                    if not piece:
                        break
                    n = len(piece)
                    if pos + n > length:
                        raise ChunkFailure("length", f"more than the {length} bytes asked for")
                    out[pos : pos + n] = piece
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
        complete = True
    finally:
        if complete:
            raw.release()  # back to the pool for keep-alive
        else:
            raw.close()  # a half-read connection cannot be reused


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
