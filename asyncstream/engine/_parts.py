"""One slot read by several GETs at once: a block larger than the GET size.

The stream's block (a ring slot) is part of the sample order; the size of one GET is a
tuning knob (``FetchConfig.chunk_bytes``). Where a block is larger than a GET, the
scheduler reads it in parts of at most ``request_bytes``, all at once, each straight into
its place in the slot, each checked by the store as a chunk is (length, ETag, size). A
part that fails fails the attempt, but the parts already whole stay whole: the next
attempt (the scheduler's retry policy, one budget for the slot) reads only the rest, so
that under a fault rate ``p`` an attempt does not need all of its parts to succeed at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable

from ..stores._store import ChunkRequest, Timing

__all__ = ["PartReader", "Read"]

#: a store's read of one request into a buffer (``Store.read_into``)
Read = Callable[[ChunkRequest, memoryview], Awaitable[Timing]]


class PartReader:
    """Reads a request into a buffer in parts of at most ``size`` bytes, at once; what
    it read survives a failed attempt (module docstring). One reader per slot download.

    Args:
        read: the store's read of one part.
        size: the most bytes one part reads (>= 1).
    """

    def __init__(self, read: Read, size: int) -> None:
        if size < 1:
            raise ValueError(f"a part must be at least 1 byte, got {size}")
        self.read = read
        self.size = size
        self.done: set[tuple[int, int]] = set()  # (offset, length) of parts already whole
        self.parts = 0  # part reads started, every attempt counted

    async def __call__(self, request: ChunkRequest, out: memoryview) -> Timing:
        """One attempt: every part of ``request`` not yet whole, into ``out``.

        Raises:
            What the first failed part raised (after every part of the attempt ended).
        """
        loop = asyncio.get_running_loop()
        start = loop.time()
        end = request.offset + request.length
        todo = [
            dataclasses.replace(
                request,
                offset=offset,
                length=min(self.size, end - offset),
                final=request.final and offset + self.size >= end,
            )
            for offset in range(request.offset, end, self.size)
            if (offset, min(self.size, end - offset)) not in self.done
        ]
        self.parts += len(todo)
        results = await asyncio.gather(
            *(self._one(request, part, out) for part in todo), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result
        timings = [r for r in results if isinstance(r, Timing)]
        first = min((t.first_byte for t in timings), default=0.0)
        return Timing(first, loop.time() - start, cached=False)

    async def _one(self, request: ChunkRequest, part: ChunkRequest, out: memoryview) -> Timing:
        at = part.offset - request.offset
        with out[at : at + part.length] as view:
            timing = await self.read(part, view)
        self.done.add((part.offset, part.length))
        return timing
