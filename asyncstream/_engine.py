"""The fetch engine: K chunk downloads in flight into the shared-memory ring.

The engine runs an asyncio loop (uvloop where installed) with one reused aiobotocore
client, in its own process (``mode="process"``: a fresh ``python -m asyncstream._engine``,
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

Backpressure is the ring: a download starts only when a slot is FREE and fewer than
``inflight`` downloads run. Downloads start in submission order (the order the consumer
will need them) and are reported as they finish; the consumer takes each chunk by id when
it needs it (:meth:`Engine.wait`), so what it sees never depends on network timing.

Failure and death: a chunk that fails permanently or outlasts its retries is reported
with an ``error`` message at its place in the order. A killed engine process is seen by
the consumer at once (the process sentinel), a killed consumer by the engine (end of file
on the pipe): the engine then unlinks the ring and exits. The ring belongs to the
consumer's resource tracker, which also removes it if the consumer is killed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import multiprocessing
import multiprocessing.connection
import os
import random
import resource
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from typing import Any, Literal

from ._exceptions import AsyncStreamError, EngineError
from ._fetch import ChunkRequest, fetch_local, fetch_s3
from ._retry import RetryPolicy, Timeouts, retrying
from ._ring import Ring
from ._s3 import S3Options

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
        seed: seeds the backoff jitter.
    """

    inflight: int = 8
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    timeouts: Timeouts = field(default_factory=Timeouts)
    check_etag: bool = True
    s3: S3Options = field(default_factory=S3Options)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.inflight < 1:
            raise ValueError(f"inflight must be >= 1, got {self.inflight}")

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
    def __init__(self) -> None:
        self.bytes = 0
        self.chunks = 0
        self.shards = 0
        self.retries: collections.Counter[str] = collections.Counter()
        self.failed = 0
        self.inflight = 0
        self.inflight_peak = 0
        self.first_byte: collections.deque[float] = collections.deque(maxlen=_LATENCY_WINDOW)
        self.total: collections.deque[float] = collections.deque(maxlen=_LATENCY_WINDOW)
        self.started = time.monotonic()

    def as_dict(self) -> dict[str, Any]:
        return {
            "bytes": self.bytes,
            "chunks": self.chunks,
            "shards": self.shards,
            "retries": dict(self.retries),
            "retries_total": sum(self.retries.values()),
            "failed_chunks": self.failed,
            "inflight": self.inflight,
            "inflight_peak": self.inflight_peak,
            "first_byte_s": _summary(self.first_byte),
            "chunk_s": _summary(self.total),
            "seconds": time.monotonic() - self.started,
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
        self.stats = _Stats()
        self.rng = random.Random(config.seed)
        self.pending: collections.deque[tuple[int, ChunkRequest]] = collections.deque()
        self.tasks: set[asyncio.Task[None]] = set()
        self.orphaned = False

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self.work = asyncio.Event()
        self.slot_freed = asyncio.Event()
        self.stop = asyncio.Event()
        self.slots = asyncio.Semaphore(self.config.inflight)
        self.ring = Ring.attach(self.ring_name, foreign=self.foreign)
        try:
            # A blocking reader thread, not loop.add_reader: the event loop would make the
            # pipe non-blocking, and a large message could then be read half-way.
            reader = threading.Thread(
                target=self._read_control, args=(loop,), name="asyncstream-control", daemon=True
            )
            reader.start()
            async with self._client() as client:
                self._send(("started",))
                scheduler = asyncio.create_task(self._schedule(client))
                await self.stop.wait()
                scheduler.cancel()
                for task in list(self.tasks):
                    task.cancel()
                await asyncio.gather(scheduler, *self.tasks, return_exceptions=True)
        finally:
            if self.orphaned:
                self.ring.unlink()  # the consumer died: nobody else will
            self.ring.close()

    def _client(self) -> Any:
        from aiobotocore.session import AioSession

        t = self.config.timeouts
        options = replace(
            self.config.s3,
            max_pool_connections=max(self.config.inflight * 2, 4),
            connect_timeout=t.connect,
            # Our own first-byte and stall timeouts fire first; this is only a backstop.
            read_timeout=max(t.first_byte, t.stall) + 5.0,
        )
        return AioSession(profile=options.profile).create_client(
            "s3", **options.client_kwargs(retries=False)
        )

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
            self._send(("stats", self.stats.as_dict()))
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

    async def _schedule(self, client: Any) -> None:
        while True:
            while not self.pending:
                self.work.clear()
                await self.work.wait()
            await self.slots.acquire()
            slot = await self._free_slot()
            rid, request = self.pending.popleft()
            task = asyncio.create_task(self._fetch(client, rid, request, slot))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _free_slot(self) -> int:
        while True:
            self.slot_freed.clear()  # before looking, so a release in between is not lost
            slot = self.ring.acquire()
            if slot is not None:
                return slot
            await self.slot_freed.wait()

    async def _fetch(self, client: Any, rid: int, request: ChunkRequest, slot: int) -> None:
        stats = self.stats
        stats.inflight += 1
        stats.inflight_peak = max(stats.inflight_peak, stats.inflight)
        try:
            if request.length > self.ring.slot_bytes:
                raise EngineError(
                    f"{request.url}: a chunk of {request.length} bytes does not fit a slot of "
                    f"{self.ring.slot_bytes}"
                )
            out = self.ring.view(slot)

            async def attempt() -> Any:
                if request.url.startswith("file://"):
                    return await fetch_local(request, out)
                return await fetch_s3(
                    client,
                    request,
                    out,
                    timeouts=self.config.timeouts,
                    check_etag=self.config.check_etag,
                )

            timing = await retrying(
                attempt,
                url=request.url,
                policy=self.config.retry,
                rng=self.rng,
                on_retry=lambda cause: stats.retries.update((cause,)),
            )
            out.release()
        except asyncio.CancelledError:
            self.ring.abandon(slot)
            raise
        except Exception as exc:
            self.ring.abandon(slot)
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
            stats.total.append(timing.total)
            self._send(("ready", rid, slot, request.length))
        finally:
            stats.inflight -= 1
            self.slots.release()


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
        n_slots: ring slots (``window + inflight`` for a stream).
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
        self.ring = Ring.create(n_slots, slot_bytes)
        self._conn: Connection | None = None
        self._proc: Any = None
        self._thread: threading.Thread | None = None
        self._next_id = 0
        self._arrived: dict[int, tuple[Any, ...]] = {}
        self._requests: dict[int, ChunkRequest] = {}
        self._stats: dict[str, Any] | None = None
        self._starved = 0.0
        self._closed = False
        try:
            self._start()
        except BaseException:
            self.close()
            raise

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
                root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
                env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "asyncstream._engine", str(fd)],
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
            not self._closed and not self._requests and self.ring.free_count() == self.ring.n_slots
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
        """The engine's statistics, plus ``starved_s``: the consumer's time spent waiting."""
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

    def _check_open(self) -> None:
        if self._closed:
            raise EngineError("this engine is closed")

    def close(self, *, wait: bool = False) -> None:
        """Stop the engine and remove the ring. Idempotent.

        Args:
            wait: wait (at most 10 s, then kill) for the engine process to exit. Without
                it a reaper thread does that wait, so closing costs the caller nothing.
        """
        if self._closed:
            return
        self._closed = True
        try:
            if self._conn is not None:
                with contextlib.suppress(OSError):
                    self._conn.send(("stop",))
            if self._proc is not None:
                if wait:
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


def _reap(proc: subprocess.Popen[bytes]) -> None:
    """Wait for a stopping engine process; kill it if it outstays ``_STOP_TIMEOUT``."""
    try:
        proc.wait(_STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _main(fd: int) -> None:
    """``python -m asyncstream._engine FD``: the engine process."""
    conn = Connection(fd)
    try:
        ring_name, config = conn.recv()
    except (EOFError, OSError):
        return  # the consumer died before it sent anything
    _run_core(conn, ring_name, config, True)


if __name__ == "__main__":
    _main(int(sys.argv[1]))
