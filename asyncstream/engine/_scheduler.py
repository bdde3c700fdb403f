"""The scheduler: which chunk downloads run, into which slots, and what each one tells.

It runs in the engine's event loop (:mod:`._server` feeds it the consumer's messages and
sends what it reports). Backpressure is the ring: a download starts only when a slot is
FREE and fewer than the concurrency limit run. Downloads start in submission order (the
order the consumer will need them) and are reported as they finish; the consumer takes
each chunk by id when it needs it, so what it sees never depends on network timing.

The decisions are the policies' (:mod:`._policies`): the adaptive concurrency limit
(:class:`~._policies.Aimd`) and, under ``inflight="auto"``, the level it holds
(:class:`~._policies.HillClimb`), which waiting chunks ride on one GET
(:class:`~._policies.Coalescing`), when a slow download gets a second request
(:class:`~._policies.Hedging`, from :class:`~._policies.LatencyModel`'s prediction), and
the retry timing (:class:`~asyncstream.stores._retry.RetryPolicy`). This module does the
I/O they decide: slots, tasks, store reads, retries. It counts in one
:class:`~._stats.EngineStats`.

Hedged requests: the first to finish is published and the other is cancelled (its
connection closed, its slot FREE again). The ring has one slot more than asked for, kept
for hedges (:attr:`~._policies.Hedging.reserve`). A coalesced group is not hedged.

Chunks larger than one GET (``EngineConfig.request_bytes``) are read in parts at once
(:mod:`._parts`), each retried on its own.

Cache: the S3 store may be a :class:`~._cache.CachedStore`, which serves the chunks it
holds from local disk into the same slots; the scheduler does not otherwise know about
it, except that timings of chunks served from the cache do not feed the latency model
(they say nothing about the store's speed).

Failure: a chunk that fails permanently or outlasts its retries is reported with
:class:`~._protocol.ChunkFailed` at its place in the order; its slot is FREE again.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import random
import time
import traceback
from collections.abc import Awaitable, Callable

from .._exceptions import AsyncStreamError, EngineError
from ..stores._retry import retrying
from ..stores._store import ChunkRequest, Store, Timing
from ._cache import CachedStore
from ._config import EngineConfig
from ._parts import PartReader
from ._policies import Aimd, Coalescing, Hedging, HillClimb, LatencyModel
from ._protocol import ChunkFailed, ChunkReady, FromEngine
from ._ring import Ring
from ._stats import EngineStats

__all__ = ["Scheduler"]


#: the parts an engine's first chunk is read in, the smallest of them, and the smallest
#: chunk so read
ALONE_PARTS, ALONE_PART_BYTES, ALONE_MIN_BYTES = 4, 2 << 20, 8 << 20


def alone_parts(length: int, request_bytes: int | None) -> int | None:
    """The GET size of an engine's first chunk, from a remote store: the one a fresh
    process's first sample waits for whole (the first draw is uniform over its samples).
    Read as up to four GETs at once, on connections that are idle anyway, it is whole in
    about a quarter of the time over a link with a per-connection rate (a 16 MiB chunk at
    90 MB/s: 0.19 s alone). Chunks under 8 MiB are read whole (the gain is a few
    milliseconds). Only the first of an engine: which GETs a stream makes stays a
    function of its requests, not of when downloads happen to finish. Never larger than
    ``request_bytes``."""
    if length < ALONE_MIN_BYTES:
        return request_bytes
    size = max(ALONE_PART_BYTES, -(-length // ALONE_PARTS))
    return size if request_bytes is None else min(size, request_bytes)


class Scheduler:
    """Chunk downloads into the ring, as many at once as the policies allow.

    Args:
        ring: the ring, attached.
        config: the engine's settings.
        store_for: the store that serves a request (opened).
        open_store: opens the store of a request, if it is not open yet (a store is
            opened on its first request); what it raises is that request's error.
        send: reports each chunk (:class:`~._protocol.ChunkReady` or
            :class:`~._protocol.ChunkFailed`) to the consumer.
    """

    def __init__(
        self,
        ring: Ring,
        config: EngineConfig,
        *,
        store_for: Callable[[ChunkRequest], Store],
        open_store: Callable[[ChunkRequest], Awaitable[None]],
        send: Callable[[FromEngine], None],
    ) -> None:
        self.ring = ring
        self.config = config
        self._store = store_for
        self._open_store = open_store
        self._send = send
        self.stats = EngineStats(limit=config.inflight_start)
        self.rng = random.Random(config.seed)
        self.pending: collections.deque[tuple[int, ChunkRequest]] = collections.deque()
        self.tasks: set[asyncio.Task[None]] = set()
        self.active = 0  # chunk downloads running (hedges not counted)
        self._first = True  # no chunk started yet (alone_parts)
        self.aimd = Aimd(config.inflight, enabled=config.adaptive, start=config.inflight_start)
        self.tuner = HillClimb(self.aimd) if config.auto else None
        self.latency = LatencyModel()
        self.hedging = Hedging(
            enabled=config.hedge, factor=config.hedge_factor, budget=config.hedge_budget
        )
        self.coalescing = Coalescing(
            limit_bytes=config.coalesce_bytes, slot_bytes=ring.slot_bytes, look=2 * config.inflight
        )
        self.work = asyncio.Event()
        self.slot_freed = asyncio.Event()
        self.capacity = asyncio.Event()

    def submit(self, chunks: list[tuple[int, ChunkRequest]]) -> None:
        """More chunks to download, after those already waiting."""
        self.pending.extend(chunks)
        self.work.set()

    def released(self) -> None:
        """The consumer put a slot back to FREE."""
        self.slot_freed.set()

    async def run(self) -> None:
        """Start downloads as slots and the limit allow, until cancelled; then cancel
        every download still running and wait for them."""
        try:
            await self._schedule()
        finally:
            for task in list(self.tasks):
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _schedule(self) -> None:
        while True:
            while not self.pending:
                self.work.clear()
                await self.work.wait()
            while self.active >= self.aimd.limit:
                self.capacity.clear()
                await self.capacity.wait()
            try:  # a store is opened on its first request
                await self._open_store(self.pending[0][1])
            except Exception as exc:
                rid, request = self.pending.popleft()
                self._send(ChunkFailed(rid, exc, traceback.format_exc()))
                continue
            slot = await self._free_slot()
            rid, request = self.pending.popleft()
            group = [(rid, request, slot), *self._followers(request)]
            self.active += 1
            self.stats.requests += 1
            self.stats.coalesced_chunks += len(group) - 1
            # The engine's first chunk (a fresh stream's first sample waits for it) is
            # read in parts at once, from a remote store.
            alone, self._first = self._first and len(group) == 1, False
            if len(group) == 1:
                task = asyncio.create_task(self._fetch(rid, request, slot, alone))
            else:
                task = asyncio.create_task(self._fetch_group(group))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    def _followers(self, first: ChunkRequest) -> list[tuple[int, ChunkRequest, int]]:
        """Waiting chunks that continue ``first``'s range of its object, each with a free
        slot: fetched by the same GET (see :class:`~._policies.Coalescing`)."""
        store = self._store(first)
        if not store.coalesces:
            return []
        share = Coalescing.share(
            free=self.ring.free_count(),
            held_back=self.hedging.held_back,
            starts=1 if store.local else self.aimd.limit - self.active,
        )
        group = []
        for rid, request in self.coalescing.followers(first, self.pending, share):
            slot = self.ring.acquire()
            assert slot is not None  # share counts only FREE slots, and only we take them
            group.append((rid, request, slot))
        return group

    async def _free_slot(self) -> int:
        while True:
            self.slot_freed.clear()  # before looking, so a release in between is not lost
            # The hedge reserve: slots a hedge may take that new downloads may not.
            if self.ring.free_count() > self.hedging.held_back:
                slot = self.ring.acquire()
                assert slot is not None
                return slot
            await self.slot_freed.wait()

    def _abandon(self, slot: int) -> None:
        self.ring.abandon(slot)
        self.slot_freed.set()

    def _on_retry(self, cause: str) -> None:
        self.stats.retries.update((cause,))
        if cause == "slowdown" and self.aimd.throttled(self.latency.median_total()):
            if self.tuner is not None:
                self.tuner.throttled()
            self.stats.throttle_cuts += 1
            self.stats.concurrency_limit_min = min(
                self.stats.concurrency_limit_min, self.aimd.limit
            )

    def _completed(self, nbytes: int, *, grouped: bool = False) -> None:
        """A download of ``nbytes`` completed: AIMD grows back, and the tuner (if any)
        counts it, with whether only the limit held chunks back while the ring had room
        (a slot free): chunks waiting to start, or this download carrying several
        (``grouped``: coalesced because there were more chunks wanted than downloads
        allowed, which more downloads would have carried at once)."""
        self.aimd.completed()
        if self.tuner is not None:
            wanted = bool(self.pending) or grouped
            bound = wanted and self.ring.free_count() > self.hedging.held_back
            self.tuner.completed(nbytes, bound=bound, round_trip=self.latency.median_total())
            self.stats.concurrency_limit_max = max(
                self.stats.concurrency_limit_max, self.aimd.limit
            )

    # -- downloads -------------------------------------------------------------------

    async def _fetch(self, rid: int, request: ChunkRequest, slot: int, alone: bool = False) -> None:
        stats = self.stats
        stats.add_inflight(1)
        self.hedging.start(1)
        try:
            if request.length > self.ring.slot_bytes:
                self._abandon(slot)
                raise EngineError(
                    f"{request.url}: a chunk of {request.length} bytes does not fit a slot of "
                    f"{self.ring.slot_bytes}"
                )
            began = time.monotonic()
            slot, timing = await self._hedged(request, slot, alone)
            waited = time.monotonic() - began  # what the consumer saw, hedge or not
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            stats.failed_chunks += 1
            error = (
                exc if isinstance(exc, AsyncStreamError) else EngineError(f"{request.url}: {exc!r}")
            )
            self._send(ChunkFailed(rid, error, traceback.format_exc()))
        else:
            self.ring.publish(slot)
            stats.handed_over(request.length, request.final)
            stats.timed(timing.first_byte, max(waited, timing.total))
            if not timing.cached:
                self.latency.add(request.length, timing)  # the winner's own timing
            self._completed(request.length)
            self._send(ChunkReady(rid, slot, request.length, self.aimd.limit))
        finally:
            stats.add_inflight(-1)
            self.active -= 1
            self.capacity.set()

    async def _fetch_group(self, group: list[tuple[int, ChunkRequest, int]]) -> None:
        """Consecutive chunks of one object by one GET (with retries: a failed attempt
        is taken up again from the first chunk not yet whole); each is handed over the
        moment its slot is full. Not hedged."""
        stats = self.stats
        stats.add_inflight(1)
        self.hedging.start(len(group))
        done = 0  # chunks handed over: a prefix of the group
        began = time.monotonic()
        first = group[0][1]
        store = self._store(first)

        def filled(i: int) -> None:
            nonlocal done
            rid, request, slot = group[done]
            self.ring.publish(slot)
            stats.handed_over(request.length, request.final)
            self._send(ChunkReady(rid, slot, request.length, self.aimd.limit))
            done += 1

        async def attempt() -> Timing:
            rest = group[done:]
            slots = [self.ring.view(slot) for _, _, slot in rest]
            views = [
                whole[: request.length] for whole, (_, request, _) in zip(slots, rest, strict=True)
            ]
            merged = dataclasses.replace(
                first,
                offset=rest[0][1].offset,
                length=sum(request.length for _, request, _ in rest),
                final=rest[-1][1].final,
            )
            try:
                return await store.read_group(merged, views, filled)
            finally:
                for view in (*views, *slots):
                    view.release()

        try:
            timing = await retrying(
                attempt,
                url=first.url,
                policy=self.config.retry,
                rng=self.rng,
                on_retry=self._on_retry,
                endpoint=self._endpoint(first),
            )
        except asyncio.CancelledError:
            for _, _, slot in group[done:]:
                self._abandon(slot)
            raise
        except Exception as exc:
            stats.failed_chunks += len(group) - done
            error = (
                exc if isinstance(exc, AsyncStreamError) else EngineError(f"{first.url}: {exc!r}")
            )
            trace = traceback.format_exc()
            for rid, _, slot in group[done:]:
                self._abandon(slot)
                self._send(ChunkFailed(rid, error, trace))
        else:
            stats.timed(timing.first_byte, time.monotonic() - began)
            self._completed(sum(request.length for _, request, _ in group), grouped=len(group) > 1)
        finally:
            stats.add_inflight(-1)
            self.active -= 1
            self.capacity.set()

    async def _download(self, request: ChunkRequest, slot: int, alone: bool = False) -> Timing:
        """One chunk into one slot, with retries; the slot stays FILLING either way. A
        chunk larger than ``request_bytes`` is read in parts at once (:mod:`._parts`),
        below the cache where there is one (the cache keeps whole chunks); so is the
        engine's first chunk, ``alone``, from a remote store (:func:`alone_parts`)."""
        out = self.ring.view(slot)
        try:
            store = self._store(request)
            size = self.config.request_bytes
            if alone and store.hedgeable:
                size = alone_parts(request.length, size)
            parts: PartReader | None = None
            read: Callable[[], Awaitable[Timing]]
            if size is None or request.length <= size:
                read = lambda: store.read_into(request, out)  # noqa: E731
            elif isinstance(store, CachedStore):
                parts = PartReader(store.inner.read_into, size)
                read = lambda: store.read_into(request, out, fill=parts)  # noqa: E731
            else:
                parts = PartReader(store.read_into, size)
                read = lambda: parts(request, out)  # noqa: E731
            return await retrying(
                read,
                url=request.url,
                policy=self.config.retry,
                rng=self.rng,
                on_retry=self._on_retry,
                endpoint=self._endpoint(request),
            )
        finally:
            out.release()
            if parts is not None:
                self.stats.part_reads += parts.parts

    def _endpoint(self, request: ChunkRequest) -> str | None:
        """The S3 server a request goes to, for the retries' WARNING (None: its URL's
        host, or the store's default)."""
        if not request.url.startswith("s3://"):
            return None
        options = dict(self.config.endpoints).get(request.endpoint, self.config.s3)
        return options.endpoint_url

    def _hedge_after(self, request: ChunkRequest) -> float | None:
        """Seconds after which this chunk gets a hedge, or None for no hedge."""
        if not self._store(request).hedgeable:
            return None
        return self.hedging.delay(self.latency.predict(request.length))

    async def _hedged(
        self, request: ChunkRequest, slot: int, alone: bool = False
    ) -> tuple[int, Timing]:
        """Download into ``slot``; past the hedge time, race a second request.

        Returns the slot that holds the chunk; every other slot used is FREE again.

        A chunk that gets no hedge (a local file, hedging off, no latency model yet) is
        downloaded in this task: no task of its own and no ``asyncio.wait`` around it,
        which cost the engine's loop about a fifth of its time per chunk on local files
        with 1 MiB chunks (cProfile, thread time). On an error or a cancellation its slot
        is FREE again, as with a race.
        """
        try:
            after = self._hedge_after(request)
            if after is None:
                return slot, await self._download(request, slot, alone)
        except BaseException:
            self._abandon(slot)  # FILLING, never published
            raise
        primary = asyncio.ensure_future(self._download(request, slot, alone))
        racing: dict[asyncio.Future[Timing], int] = {primary: slot}
        hedging = False
        try:
            await asyncio.wait([primary], timeout=after)
            if primary.done() and not primary.cancelled() and primary.exception() is None:
                del racing[primary]  # done before its hedge time: the common case
                return slot, primary.result()
            if not primary.done() and self.hedging.allowed():
                spare = self.ring.acquire()
                if spare is not None:
                    self.stats.hedged += 1
                    self.hedging.fire()
                    hedging = True
                    racing[asyncio.ensure_future(self._download(request, spare))] = spare
            running = set(racing)
            while True:
                done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                winner = next((f for f in done if f.exception() is None), None)
                if winner is not None or not running:
                    break
            if winner is None:
                # Every request failed: the first one's error tells the story.
                await asyncio.gather(*racing, return_exceptions=True)
                for used in racing.values():
                    self._abandon(used)
                racing.clear()
                return slot, primary.result()
            if winner is not primary:
                self.stats.hedge_wins += 1
            won = racing.pop(winner)
            return won, winner.result()
        finally:
            # Losers (and everything, when cancelled): stop them, free their slots.
            for future in racing:
                future.cancel()
            if racing:
                await asyncio.gather(*racing, return_exceptions=True)
            for used in racing.values():
                self._abandon(used)  # FILLING, never published, whether it finished or not
            if hedging:
                self.hedging.finished()
