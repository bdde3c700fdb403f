"""The fetch engine: K chunk downloads in flight into the shared-memory ring.

The engine runs an asyncio loop (uvloop where installed) with one reused aiobotocore
client, in its own process (``mode="process"``: a fresh ``python -m asyncstream.engine``,
which imports neither torch nor the training script) or, where a process may not start
children (PyTorch DataLoader workers are daemonic), in a thread of the consumer
(``mode="thread"``). Either way the two sides talk over one duplex pipe (the process
first receives the ring's name and its :class:`EngineConfig`):

    consumer -> engine   ("fetch", [(id, ChunkRequest), ...])   more work, in need order
                         ("release", slot)                      a slot went back to FREE
                         ("stats",)                             ask for statistics
                         ("stop",)                              finish and exit
    engine -> consumer   ("ready", id, slot, nbytes)            as each chunk completes
                         ("error", id, exception, traceback)    at the chunk's place
                         ("stats", dict)
                         ("started",)                           once, when it can fetch
                                                                (informative; not awaited)
                         ("fatal", exception, traceback)        the engine itself broke

Backpressure is the ring: a download starts only when a slot is FREE and fewer than the
concurrency limit run. Downloads start in submission order (the order the consumer
will need them) and are reported as they finish; the consumer takes each chunk by id when
it needs it (:meth:`Engine.wait`), so what it sees never depends on network timing.

Adaptive concurrency (``adaptive``): the limit starts at ``inflight``. A ``503 SlowDown``
(or 429) halves it, at most once per recent median chunk time (one cut per round trip,
not one per rejected request, since a burst of rejections answers one burst of
requests); each chunk that completes adds ``1 / limit``, so the limit grows back by one
per ``limit`` completions, to ``inflight``: additive increase, multiplicative decrease,
as TCP does. Requests already running keep going; the cut only holds back new ones.

Hedged requests (``hedge``): once 20 chunks have completed, a chunk download still
running after ``hedge_factor`` times what the recent distribution predicts for its
length (95th percentile of time to first byte, plus its length at the 95th percentile
of seconds per byte) gets a second request into another FREE slot; the first to finish
is published and the other is cancelled (its connection closed, its slot FREE again).
Hedges are at most ``hedge_budget`` of the chunks started, so they raise the number of
requests by at most that fraction. The ring has one slot more than asked for, kept for
hedges: the chunk worth hedging is usually the one the consumer waits for, and by the
time it is late the chunks behind it fill every other slot.

Cache (``cache_dir``): the S3 store is wrapped in a :class:`~._cache.CachedStore`, which
serves the chunks it holds from local disk into the same slots; the engine does not
otherwise know about it, except that timings of chunks served from the cache do not
feed the hedge predictor (they say nothing about the store's speed).

Failure and death: a chunk that fails permanently or outlasts its retries is reported
with an ``error`` message at its place in the order. A killed engine process is seen by
the consumer at once (the process sentinel), a killed consumer by the engine (end of file
on the pipe): the engine then unlinks the ring and exits. The ring belongs to the
consumer's resource tracker, which also removes it if the consumer is killed.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import contextlib
import dataclasses
import itertools
import multiprocessing
import multiprocessing.connection
import multiprocessing.util
import os
import random
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Literal

from .._exceptions import AsyncStreamError, EngineError
from ..stores._registry import (
    StoreKey,
    install_stores,
    make_store,
    registered_stores,
    scheme_of,
)
from ..stores._retry import RetryPolicy, Timeouts, retrying
from ..stores._s3 import S3Options
from ..stores._store import ChunkRequest, Store, StoreSetup, Timing
from ._cache import CachedStore
from ._ring import Ring

__all__ = ["Engine", "EngineConfig", "Ready"]


_LATENCY_WINDOW = 4096
_STOP_TIMEOUT = 10.0


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """Settings of the fetch engine.

    Args:
        inflight: K, the most chunk downloads at once.
        retry: retries of one chunk.
        timeouts: time limits of one attempt.
        check_etag: compare the listed ETag with every response (``If-Match``).
        s3: how to reach the store.
        endpoints: more endpoints by name (a mixed stream's sources with options of their
            own): a :class:`~._store.ChunkRequest` with ``endpoint=name`` reads from the
            store of its URL's scheme made with that name's options.
        registry: the table of stores by scheme (:mod:`asyncstream.stores._registry`), as
            the caller's process has it when the settings are made.
        seed: seeds the backoff jitter.
        adaptive: cut concurrency on throttling and grow it back (AIMD).
        hedge: send a second request for a chunk far slower than recent ones.
        hedge_factor: how many times the predicted time a chunk may take before its hedge.
        hedge_budget: the most hedges, as a fraction of the chunks started.
        transport: ``"auto"``: the S3 store's direct transport (kept-alive connections
            of its own, bodies received straight into the slot, HTTP and HTTPS) where no
            HTTP proxy is configured, botocore's aiohttp request otherwise; ``"aiohttp"``:
            always botocore's (see :mod:`asyncstream.stores._s3store`).
        cache_dir: a local folder that keeps the S3 chunks fetched, served from it
            afterwards (see :mod:`asyncstream.engine._cache`); None: no cache.
        cache_limit: the most bytes the cache folder's files may take; None: no limit.
        coalesce_bytes: the most bytes one GET fetches for consecutive chunks of one
            object waiting together (each still has its slot and is handed over as soon
            as it is whole); 0 fetches every chunk alone. Each request pays a round trip
            to the store, so small chunks in one request go faster: K requests in flight
            carry more bytes. A group takes at most its share of the free slots (free
            slots / downloads that may still start), so that all K connections stay busy.
            A group is not hedged, so chunks of half this or more (16 MiB, the stream's
            default) are always fetched alone.
    """

    inflight: int = 8
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    timeouts: Timeouts = field(default_factory=Timeouts)
    check_etag: bool = True
    s3: S3Options = field(default_factory=S3Options)
    endpoints: tuple[tuple[str, S3Options], ...] = ()
    registry: tuple[tuple[str, str], ...] = field(default_factory=registered_stores)
    seed: int = 0
    adaptive: bool = True
    hedge: bool = True
    hedge_factor: float = 2.0
    hedge_budget: float = 0.05
    transport: Literal["auto", "aiohttp"] = "auto"
    cache_dir: str | None = None
    cache_limit: int | None = None
    coalesce_bytes: int = 8 << 20

    def __post_init__(self) -> None:
        if self.inflight < 1:
            raise ValueError(f"inflight must be >= 1, got {self.inflight}")
        if not self.hedge_factor >= 1.0:
            raise ValueError(f"hedge_factor must be >= 1, got {self.hedge_factor}")
        if not 0.0 <= self.hedge_budget <= 1.0:
            raise ValueError(f"hedge_budget must be in [0, 1], got {self.hedge_budget}")
        if self.coalesce_bytes < 0:
            raise ValueError(f"coalesce_bytes must be >= 0, got {self.coalesce_bytes}")
        if self.transport not in ("auto", "aiohttp"):
            raise ValueError(f"transport must be 'auto' or 'aiohttp', got {self.transport!r}")
        if self.cache_limit is not None and (self.cache_dir is None or self.cache_limit < 1):
            raise ValueError(
                f"cache_limit must be >= 1 and needs a cache_dir, got {self.cache_limit!r} "
                f"with cache_dir={self.cache_dir!r}"
            )

    @property
    def wait_timeout(self) -> float:
        """The longest a consumer waits for the next chunk before declaring the engine stuck."""
        return self.retry.deadline + self.timeouts.chunk + 30.0


@dataclass(frozen=True, slots=True)
class Ready:
    """A chunk resident in the ring, handed to the consumer (slot state IN_USE)."""

    id: int
    slot: int
    nbytes: int
    request: ChunkRequest


class _RemoteTraceback(Exception):
    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return f'\n"""\n{self.tb}"""'


def _with_remote_cause(exc: BaseException, tb: str) -> BaseException:
    exc.__cause__ = _RemoteTraceback(tb)
    return exc


class _Stats:
    def __init__(self, limit: int) -> None:
        self.bytes = 0
        self.chunks = 0
        self.started_chunks = 0
        self.shards = 0
        self.retries: collections.Counter[str] = collections.Counter()
        self.failed = 0
        self.inflight = 0
        self.inflight_peak = 0
        self.limit_min = limit
        self.throttle_cuts = 0
        self.hedged = 0
        self.hedge_wins = 0
        # Reads started at the store: a coalesced group is one, retries are not counted;
        # with a cache, hits are reads too (its "misses" are the ones that went out).
        self.requests = 0
        self.coalesced = 0  # chunks that rode on an earlier chunk's GET
        self.first_byte: collections.deque[float] = collections.deque(maxlen=_LATENCY_WINDOW)
        self.total: collections.deque[float] = collections.deque(maxlen=_LATENCY_WINDOW)
        self.started = time.monotonic()
        self._busy = 0.0  # integral of downloads in flight over time
        self._busy_since = self.started

    def add_inflight(self, n: int) -> None:
        now = time.monotonic()
        self._busy += self.inflight * (now - self._busy_since)
        self._busy_since = now
        self.inflight += n
        self.inflight_peak = max(self.inflight_peak, self.inflight)

    def as_dict(self) -> dict[str, Any]:
        self.add_inflight(0)
        seconds = time.monotonic() - self.started
        return {
            "bytes": self.bytes,
            "chunks": self.chunks,
            "shards": self.shards,
            "retries": dict(self.retries),
            "retries_total": sum(self.retries.values()),
            "failed_chunks": self.failed,
            "inflight": self.inflight,
            "inflight_peak": self.inflight_peak,
            # Time-weighted mean of downloads in flight since the engine started.
            "inflight_mean": self._busy / seconds if seconds > 0 else 0.0,
            "concurrency_limit_min": self.limit_min,
            "throttle_cuts": self.throttle_cuts,
            "hedged": self.hedged,
            "hedge_wins": self.hedge_wins,
            "requests": self.requests,
            "coalesced_chunks": self.coalesced,
            "first_byte_s": _summary(self.first_byte),
            "chunk_s": _summary(self.total),
            "seconds": seconds,
            # CPU and peak RSS of the engine's process (the whole process in thread mode).
            "cpu_s": time.process_time(),
            "max_rss_bytes": _peak_rss(),
        }


def _peak_rss() -> int:
    """Peak RSS of this process in bytes.

    ``/proc/self/status`` where there is one: Linux's ``ru_maxrss`` survives ``exec``, so
    in the engine process it would report the forked consumer's peak.
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _summary(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def q(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))]

    return {
        "mean": sum(ordered) / len(ordered),
        "p50": q(0.5),
        "p95": q(0.95),
        "p99": q(0.99),
        "max": ordered[-1],
    }


class _Core:
    """The engine side: runs inside the engine's own event loop."""

    def __init__(
        self, conn: Connection, ring_name: str, config: EngineConfig, foreign: bool
    ) -> None:
        self.conn = conn
        self.foreign = foreign
        self.ring_name = ring_name
        self.config = config
        self.stats = _Stats(config.inflight)
        self.rng = random.Random(config.seed)
        self.pending: collections.deque[tuple[int, ChunkRequest]] = collections.deque()
        self.tasks: set[asyncio.Task[None]] = set()
        self.orphaned = False
        self.limit = float(config.inflight)  # the adaptive concurrency limit
        self.active = 0  # chunk downloads running (hedges not counted)
        self.last_cut = -1e9
        self.predictor = _Predictor()
        self.hedging = 0  # hedges running
        self.stores: dict[StoreKey, Store] = {}

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self.work = asyncio.Event()
        self.slot_freed = asyncio.Event()
        self.capacity = asyncio.Event()
        self.stop = asyncio.Event()
        self.ring = Ring.attach(self.ring_name, foreign=self.foreign)
        try:
            # A blocking reader thread, not loop.add_reader: the event loop would make the
            # pipe non-blocking, and a large message could then be read half-way.
            reader = threading.Thread(
                target=self._read_control, args=(loop,), name="asyncstream-control", daemon=True
            )
            reader.start()
            install_stores(self.config.registry)
            try:
                self._send(("started",))
                scheduler = asyncio.create_task(self._schedule())
                await self.stop.wait()
                scheduler.cancel()
                for task in list(self.tasks):
                    task.cancel()
                await asyncio.gather(scheduler, *self.tasks, return_exceptions=True)
            finally:
                for store in self.stores.values():
                    await store.aclose()
        finally:
            if self.orphaned:
                self.ring.unlink()  # the consumer died: nobody else will
            self.ring.close()

    def _key(self, request: ChunkRequest) -> StoreKey:
        return StoreKey(scheme_of(request.url), request.endpoint)

    async def _open_store(self, key: StoreKey) -> None:
        """Open the store of ``key`` as ``stores[key]`` (on its first request: a stream
        of local files makes no S3 client), behind the cache where the store is worth
        caching (a store that fails to open is closed at once).

        Raises:
            EngineError: an endpoint name the settings do not hold.
        """
        if key.endpoint:
            options = dict(self.config.endpoints).get(key.endpoint)
            if options is None:
                raise EngineError(f"no endpoint named {key.endpoint!r} in the engine's settings")
        else:
            options = self.config.s3
        setup = StoreSetup(
            options=options,
            timeouts=self.config.timeouts,
            check_etag=self.config.check_etag,
            connections=max(self.config.inflight * 2, 4),
            transport=self.config.transport,
        )
        store = make_store(key.scheme, setup)
        try:
            await store.open()
            if self.config.cache_dir is not None and store.cacheable:
                cache = CachedStore(
                    store,
                    self.config.cache_dir,
                    grid=self.ring.slot_bytes,
                    limit=self.config.cache_limit,
                )
                store = await cache.open()
        except BaseException:
            with contextlib.suppress(Exception):
                await store.aclose()
            raise
        self.stores[key] = store

    def _store(self, request: ChunkRequest) -> Store:
        return self.stores[self._key(request)]

    def _read_control(self, loop: asyncio.AbstractEventLoop) -> None:
        """Reader thread: hand each control message to the loop; stop at "stop" or EOF."""
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                message = ("orphaned",)
            try:
                loop.call_soon_threadsafe(self._handle, message)
            except RuntimeError:  # the loop is closed: the engine has finished
                return
            if message[0] in ("stop", "orphaned"):
                return

    def _handle(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "fetch":
            self.pending.extend(message[1])
            self.work.set()
        elif kind == "release":
            self.slot_freed.set()
        elif kind == "stats":
            stats = self.stats.as_dict()
            stats["concurrency_limit"] = int(self.limit)
            endpoints: dict[str, dict[str, Any]] = {}
            for key, store in sorted(self.stores.items()):
                (endpoints.setdefault(key.endpoint, {}) if key.endpoint else stats).update(
                    store.stats()
                )
            if endpoints:  # the other endpoints' stores, named, in the settings' order
                stats["endpoints"] = [
                    {"name": name, **endpoints[name]}
                    for name, _ in self.config.endpoints
                    if name in endpoints
                ]
            stats["tasks"] = len(asyncio.all_tasks())
            self._send(("stats", stats))
        elif kind == "stop":
            self.stop.set()
        elif kind == "orphaned":  # the consumer is gone
            self.orphaned = True
            self.stop.set()

    def _send(self, message: tuple[Any, ...]) -> None:
        try:
            self.conn.send(message)
        except (BrokenPipeError, EOFError, OSError):
            self.orphaned = True
            self.stop.set()

    async def _schedule(self) -> None:
        while True:
            while not self.pending:
                self.work.clear()
                await self.work.wait()
            while self.active >= int(self.limit):
                self.capacity.clear()
                await self.capacity.wait()
            try:  # a store is opened on its first request
                key = self._key(self.pending[0][1])
                if key not in self.stores:
                    await self._open_store(key)
            except Exception as exc:
                rid, request = self.pending.popleft()
                error = (
                    exc
                    if isinstance(exc, AsyncStreamError)
                    else EngineError(f"{request.url}: opening its store failed: {exc!r}")
                )
                self._send(("error", rid, error, traceback.format_exc()))
                continue
            slot = await self._free_slot()
            rid, request = self.pending.popleft()
            group = [(rid, request, slot), *self._followers(request)]
            self.active += 1
            self.stats.requests += 1
            self.stats.coalesced += len(group) - 1
            if len(group) == 1:
                task = asyncio.create_task(self._fetch(rid, request, slot))
            else:
                task = asyncio.create_task(self._fetch_group(group))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    def _followers(self, first: ChunkRequest) -> list[tuple[int, ChunkRequest, int]]:
        """Chunks that continue ``first``'s range of its object, taken from the next few
        waiting (a stream's prefetch interleaves its shards), each with a free slot, up to
        ``coalesce_bytes`` in all: fetched by the same GET.

        A group takes at most its fair share of the free slots: those slots divided by
        the downloads that may still start (``limit - active``). One GET per connection
        moves at that connection's speed (about 90 MB/s on S3), so a few large groups
        holding every slot would idle the other connections; shared out, the free slots
        keep all K connections busy and each still saves round trips.
        """
        store = self._store(first)
        if not store.coalesces:
            return []
        reserve = max(0, _hedge_reserve(self.config) - self.hedging)
        free = self.ring.free_count() - reserve + 1  # the first chunk's slot is taken
        starts = max(1, int(self.limit) - self.active)
        share = -(-free // starts) - 1  # ceil(free / starts) slots, the first's among them
        look = 2 * self.config.inflight
        group: list[tuple[int, ChunkRequest, int]] = []
        end, total = first.offset + first.length, first.length
        while len(group) < share and self.ring.free_count() > reserve:
            at = next(
                (
                    i
                    for i, (_, request) in enumerate(itertools.islice(self.pending, look))
                    if request.url == first.url
                    and request.endpoint == first.endpoint
                    and request.offset == end
                ),
                None,
            )
            if at is None:
                break
            rid, request = self.pending[at]
            if (
                request.etag != first.etag
                or request.length > self.ring.slot_bytes
                or total + request.length > self.config.coalesce_bytes
            ):
                break
            del self.pending[at]
            slot = self.ring.acquire()
            assert slot is not None
            group.append((rid, request, slot))
            end += request.length
            total += request.length
        return group

    async def _free_slot(self) -> int:
        while True:
            self.slot_freed.clear()  # before looking, so a release in between is not lost
            # The hedge reserve: slots a hedge may take that new downloads may not.
            reserve = max(0, _hedge_reserve(self.config) - self.hedging)
            if self.ring.free_count() > reserve:
                slot = self.ring.acquire()
                assert slot is not None
                return slot
            await self.slot_freed.wait()

    def _abandon(self, slot: int) -> None:
        self.ring.abandon(slot)
        self.slot_freed.set()

    # -- adaptive concurrency --------------------------------------------------------

    def _on_retry(self, cause: str) -> None:
        self.stats.retries.update((cause,))
        if cause != "slowdown" or not self.config.adaptive:
            return
        now = time.monotonic()
        if now - self.last_cut < self.predictor.median_total():
            return  # the same burst of rejections: one cut per round trip
        self.last_cut = now
        self.limit = max(1.0, self.limit / 2)
        self.stats.throttle_cuts += 1
        self.stats.limit_min = min(self.stats.limit_min, int(self.limit))

    def _on_success(self) -> None:
        if self.limit < self.config.inflight:
            self.limit = min(float(self.config.inflight), self.limit + 1.0 / self.limit)

    # -- downloads -------------------------------------------------------------------

    async def _fetch(self, rid: int, request: ChunkRequest, slot: int) -> None:
        stats = self.stats
        stats.add_inflight(1)
        stats.started_chunks += 1
        try:
            if request.length > self.ring.slot_bytes:
                self._abandon(slot)
                raise EngineError(
                    f"{request.url}: a chunk of {request.length} bytes does not fit a slot of "
                    f"{self.ring.slot_bytes}"
                )
            began = time.monotonic()
            slot, timing = await self._hedged(request, slot)
            waited = time.monotonic() - began  # what the consumer saw, hedge or not
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            stats.failed += 1
            error = (
                exc if isinstance(exc, AsyncStreamError) else EngineError(f"{request.url}: {exc!r}")
            )
            self._send(("error", rid, error, traceback.format_exc()))
        else:
            self.ring.publish(slot)
            stats.bytes += request.length
            stats.chunks += 1
            stats.shards += request.final
            stats.first_byte.append(timing.first_byte)
            stats.total.append(max(waited, timing.total))
            if not timing.cached:
                self.predictor.add(request.length, timing)  # the winner's own timing
            self._on_success()
            self._send(("ready", rid, slot, request.length))
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
        stats.started_chunks += len(group)
        done = 0  # chunks handed over: a prefix of the group
        began = time.monotonic()
        first = group[0][1]
        store = self._store(first)

        def filled(i: int) -> None:
            nonlocal done
            rid, request, slot = group[done]
            self.ring.publish(slot)
            stats.bytes += request.length
            stats.chunks += 1
            stats.shards += request.final
            self._send(("ready", rid, slot, request.length))
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
            )
        except asyncio.CancelledError:
            for _, _, slot in group[done:]:
                self._abandon(slot)
            raise
        except Exception as exc:
            stats.failed += len(group) - done
            error = (
                exc if isinstance(exc, AsyncStreamError) else EngineError(f"{first.url}: {exc!r}")
            )
            trace = traceback.format_exc()
            for rid, _, slot in group[done:]:
                self._abandon(slot)
                self._send(("error", rid, error, trace))
        else:
            stats.first_byte.append(timing.first_byte)
            stats.total.append(time.monotonic() - began)
            self._on_success()
        finally:
            stats.add_inflight(-1)
            self.active -= 1
            self.capacity.set()

    async def _download(self, request: ChunkRequest, slot: int) -> Timing:
        """One chunk into one slot, with retries; the slot stays FILLING either way."""
        out = self.ring.view(slot)
        try:
            store = self._store(request)
            return await retrying(
                lambda: store.read_into(request, out),
                url=request.url,
                policy=self.config.retry,
                rng=self.rng,
                on_retry=self._on_retry,
            )
        finally:
            out.release()

    def _hedge_after(self, request: ChunkRequest) -> float | None:
        """Seconds after which this chunk gets a hedge, or None for no hedge."""
        if not self.config.hedge or not self._store(request).hedgeable:
            return None
        if self.stats.hedged >= self.config.hedge_budget * self.stats.started_chunks:
            return None
        predicted = self.predictor.predict(request.length)
        return None if predicted is None else self.config.hedge_factor * predicted

    async def _hedged(self, request: ChunkRequest, slot: int) -> tuple[int, Timing]:
        """Download into ``slot``; past the hedge time, race a second request.

        Returns the slot that holds the chunk; every other slot used is FREE again.
        """
        primary = asyncio.ensure_future(self._download(request, slot))
        racing: dict[asyncio.Future[Timing], int] = {primary: slot}
        hedging = False
        try:
            after = self._hedge_after(request)
            if after is not None:
                await asyncio.wait([primary], timeout=after)
                if not primary.done() and self._hedge_after(request) is not None:
                    spare = self.ring.acquire()
                    if spare is not None:
                        self.stats.hedged += 1
                        self.hedging += 1
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
                self.hedging -= 1


def _hedge_reserve(config: EngineConfig) -> int:
    """Ring slots kept back for hedges (the head-of-line chunk is the one worth hedging,
    and by the time it is late the chunks behind it have filled every other slot)."""
    return 1 if config.hedge else 0


class _Predictor:
    """What a chunk download should take, from the recent distribution of completed ones."""

    _MIN_SAMPLES = 20

    def __init__(self) -> None:
        self.first_byte: collections.deque[float] = collections.deque(maxlen=512)
        self.per_byte: collections.deque[float] = collections.deque(maxlen=512)
        self.totals: collections.deque[float] = collections.deque(maxlen=512)
        self._cache: tuple[float, float, float] | None = None
        self._added = 0

    def add(self, length: int, timing: Timing) -> None:
        self.first_byte.append(timing.first_byte)
        self.totals.append(timing.total)
        if length > 0:
            self.per_byte.append(max(0.0, timing.total - timing.first_byte) / length)
        self._added += 1
        if self._added % 16 == 0:
            self._cache = None

    def _quantiles(self) -> tuple[float, float, float] | None:
        if len(self.totals) < self._MIN_SAMPLES or not self.per_byte:
            return None
        if self._cache is None:

            def q(values: collections.deque[float], p: float) -> float:
                ordered = sorted(values)
                return ordered[min(len(ordered) - 1, int(p * len(ordered)))]

            self._cache = (
                q(self.first_byte, 0.95),
                q(self.per_byte, 0.95),
                q(self.totals, 0.5),
            )
        return self._cache

    def predict(self, length: int) -> float | None:
        """Seconds a download of ``length`` bytes takes at the 95th percentile; None: unknown."""
        quantiles = self._quantiles()
        if quantiles is None:
            return None
        first_byte, per_byte, _ = quantiles
        return first_byte + length * per_byte

    def median_total(self) -> float:
        """The median chunk time (0.1 s until there are enough chunks to tell)."""
        quantiles = self._quantiles()
        return 0.1 if quantiles is None else quantiles[2]


def _run_core(conn: Connection, ring_name: str, config: EngineConfig, foreign: bool) -> None:
    """Engine entry point, in the engine's process or thread."""
    core = _Core(conn, ring_name, config, foreign)
    try:
        try:
            import uvloop
        except ImportError:  # pragma: no cover - uvloop is a dependency on Linux and macOS
            asyncio.run(core.run())
        else:
            uvloop.run(core.run())
    except BaseException as exc:
        with contextlib.suppress(Exception):
            conn.send(("fatal", exc, traceback.format_exc()))
        if not isinstance(exc, Exception):
            raise
    finally:
        conn.close()


class Engine:
    """The consumer's handle on a fetch engine and its ring.

    Args:
        config: engine settings.
        n_slots: ring slots (``window + inflight`` for a stream); with ``config.hedge`` the
            ring has one more, kept for hedges.
        slot_bytes: bytes per slot (the chunk size).
        mode: ``"process"`` (own process, spawn context) or ``"thread"``.
    """

    def __init__(
        self,
        config: EngineConfig,
        *,
        n_slots: int,
        slot_bytes: int,
        mode: Literal["process", "thread"] = "process",
    ) -> None:
        if mode not in ("process", "thread"):
            raise ValueError(f"mode must be 'process' or 'thread', got {mode!r}")
        self.config = config
        self.mode = mode
        self.ring = Ring.create(n_slots + _hedge_reserve(config), slot_bytes)
        self._conn: Connection | None = None
        self._proc: Any = None
        self._thread: threading.Thread | None = None
        self._next_id = 0
        self._arrived: dict[int, tuple[Any, ...]] = {}
        self._requests: dict[int, ChunkRequest] = {}
        self._stats: dict[str, Any] | None = None
        self._starved = 0.0
        self._closed = False
        self._pid = os.getpid()  # a forked child inherits this object, not the engine
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        _LIVE.add(self)
        if multiprocessing.current_process().daemon:
            # A DataLoader worker ends with os._exit, after multiprocessing's finalizers
            # but without garbage collection or atexit: close the engine there.
            multiprocessing.util.Finalize(
                self, _close_engine, args=(weakref.ref(self),), exitpriority=10
            )
            _close_on_sigterm()

    def __repr__(self) -> str:
        return (
            f"Engine(mode={self.mode!r}, inflight={self.config.inflight}, ring={self.ring!r}, "
            f"{'closed' if self._closed else 'open'})"
        )

    def _start(self) -> None:
        if self.mode == "process":
            # A fresh interpreter running only the engine (not multiprocessing's spawn, which
            # re-imports the caller's __main__ and with it torch and the training script).
            ours_sock, theirs_sock = socket.socketpair()
            self._conn = Connection(ours_sock.detach())
            fd = theirs_sock.detach()
            try:
                env = dict(os.environ)
                root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
                env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "asyncstream.engine", str(fd)],
                    pass_fds=[fd],
                    env=env,
                    stdin=subprocess.DEVNULL,
                )
            finally:
                os.close(fd)
            self._conn.send((self.ring.name, self.config))
        else:
            ours, theirs = multiprocessing.Pipe(duplex=True)
            self._conn = ours
            self._thread = threading.Thread(
                target=_run_core,
                args=(theirs, self.ring.name, self.config, False),
                name="asyncstream-engine",
                daemon=True,
            )
            self._thread.start()
        # Not waiting for "started" lets the engine boot (about half a second) while the
        # caller sets up; a broken set-up still fails at the first wait, before any data.

    @property
    def pid(self) -> int | None:
        """The engine process's id (``None`` in thread mode)."""
        return None if self._proc is None else int(self._proc.pid)

    @property
    def idle(self) -> bool:
        """Nothing submitted and untaken, every slot FREE: ready to serve another epoch."""
        return (
            not self._closed
            and self.owned
            and not self._requests
            and self.ring.free_count() == self.ring.n_slots
        )

    def submit(self, requests: Sequence[ChunkRequest]) -> list[int]:
        """Queue chunk downloads, in the order the consumer will need them.

        Returns:
            Their ids; :meth:`next` returns them in this order.
        """
        self._check_open()
        ids = list(range(self._next_id, self._next_id + len(requests)))
        self._next_id += len(requests)
        for rid, request in zip(ids, requests, strict=True):
            self._requests[rid] = request
        if requests:
            self._send(("fetch", list(zip(ids, requests, strict=True))))
        return ids

    def next(self, timeout: float | None = None) -> Ready:
        """The earliest submitted chunk not yet taken; see :meth:`wait`."""
        if not self._requests:
            raise EngineError("next() called with no chunk submitted")
        return self.wait(min(self._requests), timeout)

    def wait(self, rid: int, timeout: float | None = None) -> Ready:
        """Chunk ``rid``, resident and IN_USE; blocks until it is.

        Chunks may be taken in any order; the others stay READY in the ring meanwhile.

        Raises:
            FetchError: the chunk could not be fetched (names the shard and cause).
            EngineError: the engine died, or nothing came within ``timeout`` (default
                :attr:`EngineConfig.wait_timeout`).
        """
        self._check_open()
        if rid not in self._requests:
            raise EngineError(f"chunk {rid} was not submitted, or was already taken")
        limit = self.config.wait_timeout if timeout is None else timeout
        began = time.monotonic()
        while rid not in self._arrived:
            self._receive(began + limit)
        self._starved += time.monotonic() - began
        message = self._arrived.pop(rid)
        request = self._requests.pop(rid)
        if message[0] == "error":
            raise _with_remote_cause(message[2], message[3])
        _, _, slot, nbytes = message
        self.ring.take(slot)
        return Ready(rid, slot, nbytes, request)

    def view(self, ready: Ready) -> memoryview:
        """The chunk's bytes in the ring (valid until :meth:`release`)."""
        return self.ring.view(ready.slot)[: ready.nbytes]

    def release(self, slot: int) -> None:
        """Give a slot back to the engine (IN_USE to FREE)."""
        self._check_open()
        self.ring.release(slot)
        self._send(("release", slot))

    def stats(self) -> dict[str, Any]:
        """The engine's statistics, plus ``starved_s``: the consumer's time spent waiting.

        ``transport`` says which transport its S3 downloads take (``"direct"`` or
        ``"aiohttp"``, see :mod:`asyncstream.stores._s3store`).
        """
        self._check_open()
        self._stats = None
        self._send(("stats",))
        deadline = time.monotonic() + 10.0
        while self._stats is None:
            self._receive(deadline)
        return {**self._stats, "starved_s": self._starved}

    def _receive(self, deadline: float) -> None:
        assert self._conn is not None
        # The engine's death closes its end of the pipe: EOF here, at once.
        remaining = deadline - time.monotonic()
        ready = multiprocessing.connection.wait([self._conn], timeout=max(0.0, remaining))
        if self._conn in ready:
            try:
                message = self._conn.recv()
            except (EOFError, OSError) as exc:
                raise self._died() from exc
            kind = message[0]
            if kind in ("ready", "error"):
                self._arrived[message[1]] = message
            elif kind == "stats":
                self._stats = message[1]
            elif kind == "fatal":
                raise EngineError(f"the fetch engine failed: {message[1]!r}") from _RemoteTraceback(
                    message[2]
                )
            return
        raise EngineError(
            f"the fetch engine sent nothing in time (waited {remaining:.0f} s); it may be stuck"
        )

    def _died(self) -> EngineError:
        if self._proc is not None:
            try:
                code = self._proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                return EngineError("the fetch engine process closed its pipe")
            how = f"was killed by signal {-code}" if code < 0 else f"exited with {code}"
            return EngineError(f"the fetch engine process {how}")
        return EngineError("the fetch engine thread stopped")

    def _send(self, message: tuple[Any, ...]) -> None:
        assert self._conn is not None
        try:
            self._conn.send(message)
        except (BrokenPipeError, OSError) as exc:
            raise self._died() from exc

    @property
    def owned(self) -> bool:
        """Whether this process started the engine (a forked child holds a mere copy)."""
        return os.getpid() == self._pid

    def _check_open(self) -> None:
        if self._closed:
            raise EngineError("this engine is closed")
        if not self.owned:
            raise EngineError(
                f"this engine belongs to process {self._pid}; a forked process (a "
                "DataLoader worker, say) starts an engine of its own"
            )

    def close(self, *, wait: bool = False) -> None:
        """Stop the engine and remove the ring. Idempotent.

        Args:
            wait: wait (at most 10 s, then kill) for the engine process to exit. Without
                it a reaper thread does that wait, so closing costs the caller nothing.
        """
        if self._closed:
            return
        self._closed = True
        if not self.owned:  # a forked copy: let go of it, leave the owner's engine be
            if self._conn is not None:
                self._conn.close()  # this process's copy of the descriptor only
            self.ring.close()
            return
        try:
            if self._conn is not None:
                with contextlib.suppress(OSError):
                    self._conn.send(("stop",))
            if self._proc is not None:
                # At interpreter exit a new thread may never start (Python 3.11 waits for
                # it forever): reap inline then, which is bounded.
                if wait or sys.is_finalizing():
                    _reap(self._proc)
                else:
                    threading.Thread(
                        target=_reap, args=(self._proc,), name="asyncstream-reaper", daemon=True
                    ).start()
            if self._thread is not None:
                self._thread.join(_STOP_TIMEOUT)
        finally:
            if self._conn is not None:
                self._conn.close()
            self.ring.close()
            self.ring.unlink()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


_LIVE: weakref.WeakSet[Engine] = weakref.WeakSet()


def _close_engine(ref: weakref.ref[Engine]) -> None:
    engine = ref()
    if engine is not None:
        engine.close(wait=True)


@atexit.register
def _close_live_engines() -> None:
    """At exit, close every engine still open, so their rings are unlinked by us (not
    reported as leaked by the resource tracker) and their processes are reaped."""
    for engine in list(_LIVE):
        with contextlib.suppress(Exception):
            engine.close(wait=True)


def _close_on_sigterm() -> None:
    """In a DataLoader worker: close the engines before SIGTERM ends the process.

    Persistent workers are still alive when the main process exits, and multiprocessing's
    exit hook SIGTERMs daemonic children, so their finalizers never run: each worker's
    ring would stay registered with the resource tracker, which then removes it and warns
    of a leak that is none. The handler closes the live engines (unlinking their rings),
    then hands the signal to the handler there was before, and ends the worker with
    status 0 (unless SIGTERM was ignored): it was being shut down, and a worker dead of a
    signal makes torch's watchdog in the main process raise ``RuntimeError`` during its
    exit. It ends the worker even when that handler returns: a handler inherited from the
    main process, such as PyTorch Lightning's (which records the signal for the training
    loop and returns), would otherwise leave the worker alive, and the main process's exit
    (multiprocessing joins its daemonic children after SIGTERMing them) waiting forever.
    """
    if threading.current_thread() is not threading.main_thread() or not _in_loader_worker():
        return  # other daemonic processes (a Pool's workers) keep their own SIGTERM
    previous = signal.getsignal(signal.SIGTERM)
    if getattr(previous, "asyncstream", False):
        return  # installed already

    def on_sigterm(signum: int, frame: Any) -> None:
        _close_live_engines()
        if callable(previous):
            signal.signal(signal.SIGTERM, previous)
            previous(signum, frame)
        if previous != signal.SIG_IGN:
            os._exit(0)  # also after a handler that returned (see the docstring)

    on_sigterm.asyncstream = True  # type: ignore[attr-defined]
    signal.signal(signal.SIGTERM, on_sigterm)


def _in_loader_worker() -> bool:
    """Whether this process is a ``torch.utils.data.DataLoader`` worker (torch imported)."""
    data = sys.modules.get("torch.utils.data")
    return data is not None and data.get_worker_info() is not None


def _reap(proc: subprocess.Popen[bytes]) -> None:
    """Wait for a stopping engine process; kill it if it outstays ``_STOP_TIMEOUT``."""
    try:
        proc.wait(_STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _main(fd: int) -> None:
    """``python -m asyncstream.engine FD``: the engine process (:mod:`.__main__`)."""
    # Ctrl-C reaches the whole process group; the consumer stops the engine (or its pipe
    # closes when the consumer dies), so the engine itself ignores it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn = Connection(fd)
    try:
        ring_name, config = conn.recv()
    except (EOFError, OSError):
        return  # the consumer died before it sent anything
    _run_core(conn, ring_name, config, True)
