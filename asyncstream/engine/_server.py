"""The engine's side of the connection: it opens the stores, runs the
:class:`~._scheduler.Scheduler` in an event loop (uvloop where installed), and speaks the
protocol of :mod:`._protocol`.

:func:`run_engine` is the entry point in the engine's thread (``mode="thread"``) and in
its own process, where :func:`serve` (``python -m asyncstream.engine FD``) first reads the
:class:`~._protocol.Hello`. A blocking reader thread hands each message to the loop. End
of file on the connection (the consumer was killed) makes the engine exit. The ring is
reached by the descriptor the consumer handed over, the one segment this process can
touch; its memory goes with the last process that maps it.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import select
import signal
import threading
import traceback
from collections.abc import Sequence
from multiprocessing import reduction
from multiprocessing.connection import Connection
from typing import Any

from .._exceptions import AsyncStreamError, EngineError
from ..stores._registry import StoreKey, install_stores, make_store, scheme_of
from ..stores._store import ChunkRequest, Store, StoreSetup
from ._config import EngineConfig
from ._protocol import (
    AskStats,
    ChunkReady,
    ChunksReady,
    Fatal,
    Fetch,
    FromEngine,
    Hello,
    Log,
    Release,
    Started,
    Stats,
    Stop,
    ToEngine,
    send,
)
from ._ring import Ring
from ._scheduler import Scheduler

__all__ = ["run_engine", "serve"]

_KEYS_KEPT = 4096  # URLs whose store is remembered (a chunk of a shard follows another)


class _Server:
    """The engine side: runs inside the engine's own event loop."""

    def __init__(
        self, conn: Connection, ring: Ring, config: EngineConfig, forward_logs: bool = False
    ) -> None:
        self.forward_logs = forward_logs
        self.conn = conn
        self.ring = ring
        self.config = config
        self.stores: dict[StoreKey, Store] = {}
        self.scheduler: Scheduler | None = None
        self._keys: dict[tuple[str, str | None], StoreKey] = {}
        self._ready: list[tuple[int, int, int]] = []  # this turn's ChunkReady, unsent
        self._ready_limit = 0

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self.stop = asyncio.Event()
        try:
            self.scheduler = Scheduler(
                self.ring,
                self.config,
                store_for=self._store,
                open_store=self._open_store,
                send=self._send,
            )
            # A blocking reader thread, not loop.add_reader: the event loop would make the
            # pipe non-blocking, and a large message could then be read half-way.
            reader = threading.Thread(
                target=self._read_control, args=(loop,), name="asyncstream-control", daemon=True
            )
            reader.start()
            install_stores(self.config.registry, self.config.store_settings)
            forward = _Forward(loop, self._send) if self.forward_logs else None
            try:
                self._send(Started())
                scheduling = asyncio.create_task(self.scheduler.run())
                await self.stop.wait()
                scheduling.cancel()
                await asyncio.gather(scheduling, return_exceptions=True)
            finally:
                for store in self.stores.values():
                    await store.aclose()
                if forward is not None:
                    forward.close()
        finally:
            self.ring.close()

    def _key(self, request: ChunkRequest) -> StoreKey:
        """The store a request reads from, kept per URL: parsing the URL for each chunk
        was 8% of the engine's CPU with 1 MiB chunks of local files (cProfile)."""
        at = (request.url, request.endpoint)
        key = self._keys.get(at)
        if key is None:
            if len(self._keys) >= _KEYS_KEPT:
                self._keys.clear()
            key = self._keys[at] = StoreKey(scheme_of(request.url), request.endpoint)
        return key

    async def _open_store(self, request: ChunkRequest) -> None:
        """Open the store ``request`` reads from, on its first request (a stream of local
        files makes no S3 client), behind the cache where the store is worth caching; a
        store that fails to open is closed at once.

        Raises:
            EngineError: an endpoint name the settings do not hold, or a store that failed
                to open for a reason outside the exception tree.
        """
        key = self._key(request)
        if key in self.stores:
            return
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
                from ._cache import CachedStore  # only with a cache: the process starts faster

                cache = CachedStore(
                    store,
                    self.config.cache_dir,
                    grid=self.ring.slot_bytes,
                    limit=self.config.cache_limit,
                )
                store = await cache.open()
        except AsyncStreamError:
            with contextlib.suppress(Exception):
                await store.aclose()
            raise
        except Exception as exc:
            with contextlib.suppress(Exception):
                await store.aclose()
            raise EngineError(f"{request.url}: opening its store failed: {exc!r}") from exc
        self.stores[key] = store

    def _store(self, request: ChunkRequest) -> Store:
        return self.stores[self._key(request)]

    def _read_control(self, loop: asyncio.AbstractEventLoop) -> None:
        """Reader thread: hand the control messages to the loop, all those already come
        at once (each hand-over wakes the loop and takes the GIL from it); stop at Stop
        or EOF."""
        poller = select.poll()
        poller.register(self.conn.fileno(), select.POLLIN)
        while True:
            messages: list[ToEngine | None] = []
            try:
                messages.append(self.conn.recv())
                while len(messages) < 64 and poller.poll(0):
                    messages.append(self.conn.recv())
            except (EOFError, OSError):
                messages.append(None)  # the consumer is gone
            try:
                loop.call_soon_threadsafe(self._handle_all, messages)
            except RuntimeError:  # the loop is closed: the engine has finished
                return
            if any(message is None or isinstance(message, Stop) for message in messages):
                return

    def _handle_all(self, messages: list[ToEngine | None]) -> None:
        for message in messages:
            self._handle(message)

    def _handle(self, message: ToEngine | None) -> None:
        assert self.scheduler is not None
        if isinstance(message, Fetch):
            if message.released:
                self.scheduler.released()
            self.scheduler.submit(message.chunks)
        elif isinstance(message, Release):
            self.scheduler.released()
        elif isinstance(message, AskStats):
            self._send(Stats(self._stats()))
        elif isinstance(message, Stop):
            self.stop.set()
        else:  # None: end of file, the consumer is gone
            self.orphaned = True
            self.stop.set()

    def _stats(self) -> dict[str, object]:
        assert self.scheduler is not None
        main: dict[str, Any] = {}
        named: dict[str, dict[str, Any]] = {}
        each: list[dict[str, Any]] = []
        for key, store in sorted(self.stores.items()):
            own = store.stats()
            (named.setdefault(key.endpoint, {}) if key.endpoint else main).update(own)
            each.append({"scheme": key.scheme, "endpoint": key.endpoint, **own})
        tuner = self.scheduler.tuner
        autotune = None
        if tuner is not None:
            autotune = {
                "steps": tuner.steps,
                "kept": tuner.kept,
                "windows": tuner.windows,
                "phase": tuner.phase,
                "ceiling": self.scheduler.aimd.ceiling,
            }
        return self.scheduler.stats.as_dict(
            concurrency_limit=self.scheduler.aimd.limit,
            autotune=autotune,
            store=main,
            # the other endpoints' stores, named, in the settings' order
            endpoints=[
                {"name": name, **named[name]} for name, _ in self.config.endpoints if name in named
            ],
            tasks=len(asyncio.all_tasks()),
            stores=each,
        )

    def _send(self, message: FromEngine) -> None:
        """Send ``message``; a :class:`ChunkReady` waits for the end of the loop's turn,
        sent with the others of that turn as one :class:`ChunksReady` (every other
        message sends them first, so the order holds). A message a chunk cost the
        engine a pickle and a write a chunk, and the reader a poll, two reads and an
        unpickle: with 1 MiB blocks of local files, where a group of chunks completes at
        once, the engine's CPU per GB went from 0.26 to 0.23 (``python -m
        bench.localring``, bench/RESULTS.md)."""
        if isinstance(message, ChunkReady):
            if not self._ready:
                asyncio.get_running_loop().call_soon(self._send_ready)
            self._ready.append((message.id, message.slot, message.nbytes))
            self._ready_limit = message.limit
            return
        self._send_ready()
        self._write(message)

    def _send_ready(self) -> None:
        if self._ready:
            ready, self._ready = self._ready, []
            self._write(ChunksReady(tuple(ready), self._ready_limit))

    def _write(self, message: FromEngine) -> None:
        try:
            send(self.conn, message)
        except (BrokenPipeError, EOFError, OSError):
            self.stop.set()


def run_engine(
    conn: Connection,
    ring_fd: int,
    ring_name: str,
    config: EngineConfig,
    *,
    forward_logs: bool = False,
) -> None:
    """Run the engine until it is stopped, in the engine's process or thread.

    Args:
        conn: the engine's end of the connection to the consumer.
        ring_fd: a descriptor of the ring's segment, this engine's to close.
        ring_name: the ring's label, for messages.
        config: the engine's settings.
        forward_logs: send the records of this process's ``asyncstream`` logger (INFO
            and above) to the consumer (:class:`~._protocol.Log`): in the engine's own
            process; a thread's records are the consumer's already.
    """
    ring: Ring | None = None
    try:
        ring = Ring.attach(ring_fd, ring_name)  # the descriptor is the ring's from here
        server = _Server(conn, ring, config, forward_logs)
        try:
            import uvloop
        except ImportError:  # pragma: no cover - uvloop is a dependency on Linux and macOS
            asyncio.run(server.run())
        else:
            uvloop.run(server.run())
    except BaseException as exc:
        with contextlib.suppress(Exception):
            conn.send(Fatal(exc, traceback.format_exc()))
        if not isinstance(exc, Exception):
            raise
    finally:
        if ring is not None:
            ring.close()
        conn.close()


def serve(fd: int, idle_limit: float | None = None, preload: Sequence[str] = ()) -> None:
    """``python -m asyncstream.engine FD IDLE [MODULE ...]``: the engine process
    (:mod:`.__main__`).

    Args:
        fd: its end of the connection to the consumer.
        idle_limit: seconds to wait for the Hello, then exit (a process started ahead that
            nobody adopted, see :mod:`._launch`); None: no limit.
        preload: modules to import before the Hello comes (the stores' and their client
            libraries, see :func:`~._launch.store_modules`): a process started ahead of its
            settings does its imports while the consumer opens the dataset. One that fails
            to import is skipped here; the store that needs it reports the error.
    """
    # Ctrl-C reaches the whole process group; the consumer stops the engine (or its pipe
    # closes when the consumer dies), so the engine itself ignores it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn = Connection(fd)
    with contextlib.suppress(ImportError):
        import uvloop  # noqa: F401  # imported now, used by run_engine
    for name in preload:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    try:
        if idle_limit is not None and not conn.poll(idle_limit):
            return  # nobody adopted it
        hello: Hello = conn.recv()
        ring_fd = reduction.recv_handle(conn)  # the ring, right behind its Hello
    except (EOFError, OSError, RuntimeError):  # RuntimeError: a message without the ring
        return  # the consumer died before it sent everything
    run_engine(conn, ring_fd, hello.ring_name, hello.config, forward_logs=True)


class _Forward(logging.Handler):
    """Sends the engine process's ``asyncstream`` records to the consumer, from the
    loop's thread (the one that sends on the connection), in place of this process's
    stderr."""

    def __init__(self, loop: asyncio.AbstractEventLoop, send: Any) -> None:
        super().__init__(logging.INFO)
        self.loop, self.send = loop, send
        self.logger = logging.getLogger("asyncstream")
        self.logger.setLevel(logging.INFO)
        self.logger.propagate = False
        self.logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        message = Log(record.name, record.levelno, record.getMessage())
        with contextlib.suppress(RuntimeError):  # the loop is closed: the engine is ending
            self.loop.call_soon_threadsafe(self.send, message)

    def close(self) -> None:
        self.logger.removeHandler(self)
        self.logger.propagate = True
        super().close()
