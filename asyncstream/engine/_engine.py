"""The consumer's handle on a fetch engine, and the engine's lifecycle.

:class:`Engine` creates the shared-memory ring and starts the engine: in its own process
(``mode="process"``: a fresh ``python -m asyncstream.engine``, which imports neither
torch nor the training script) or, where a process may not start children (PyTorch
DataLoader workers are daemonic), in a thread of the consumer (``mode="thread"``). The
process may also be started ahead, before the ring and the settings are known, and
adopted here (:mod:`._launch`: a stream starts it while it opens its dataset). The
two sides talk over one duplex connection, in the typed messages of :mod:`._protocol`;
the engine's side is :mod:`._server`, its scheduler :mod:`._scheduler`.

Chunks are submitted in the order the consumer will need them and taken by id
(:meth:`Engine.wait`), so what the consumer sees never depends on network timing.

Failure and death: a chunk that fails permanently or outlasts its retries raises at its
place in the order. A killed engine process is seen by the consumer at once (end of file
on its connection), a killed consumer by the engine, which then exits. The ring has no
name (:mod:`._ring`): its memory goes with the last process that maps it, a killed one
included. Engines still open at exit, in a DataLoader worker's finalizers or on its
SIGTERM are closed here, so no process outlives its consumer.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import multiprocessing
import multiprocessing.util
import os
import select
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing import reduction
from multiprocessing.connection import Connection
from typing import Any, Literal

from .._exceptions import EngineError
from ..stores._store import ChunkRequest
from ._config import EngineConfig
from ._launch import EngineProcess, spawn
from ._policies import Hedging
from ._protocol import (
    AskStats,
    ChunkFailed,
    ChunkReady,
    ChunksReady,
    Fatal,
    Fetch,
    FromEngine,
    Hello,
    Log,
    Release,
    RemoteTraceback,
    Stats,
    Stop,
    ToEngine,
    log_from_engine,
    send,
    with_remote_cause,
)
from ._ring import Ring

__all__ = ["Engine", "EngineConfig", "Ready"]

_STOP_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class Ready:
    """A chunk resident in the ring, handed to the consumer (slot state IN_USE)."""

    id: int
    slot: int
    nbytes: int
    request: ChunkRequest


class Engine:
    """The consumer's handle on a fetch engine and its ring.

    Args:
        config: engine settings.
        n_slots: ring slots (``window + inflight`` for a stream); with ``config.hedge`` the
            ring has one more, kept for hedges.
        slot_bytes: bytes per slot (the chunk size).
        mode: ``"process"`` (own process, spawn context) or ``"thread"``.
        process: an engine process started ahead (:class:`~._launch.EngineProcess`), to
            adopt in ``"process"`` mode; one that is gone is replaced by a new one, and
            in ``"thread"`` mode it is closed.
    """

    def __init__(
        self,
        config: EngineConfig,
        *,
        n_slots: int,
        slot_bytes: int,
        mode: Literal["process", "thread"] = "process",
        process: EngineProcess | None = None,
    ) -> None:
        if mode not in ("process", "thread"):
            raise ValueError(f"mode must be 'process' or 'thread', got {mode!r}")
        self.config = config
        self.mode = mode
        try:
            self.ring = Ring.create(n_slots + Hedging(enabled=config.hedge).reserve, slot_bytes)
        except BaseException:
            if process is not None:
                process.close()
            raise
        self._conn: Connection | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread: threading.Thread | None = None
        self._next_id = 0
        self._arrived: dict[int, ChunkReady | ChunkFailed] = {}
        self._requests: dict[int, ChunkRequest] = {}
        self._stats: dict[str, Any] | None = None
        self._released = False  # slots put back FREE that the engine was not told of yet
        self._poller: select.poll | None = None  # on the connection, made once
        self._starved = 0.0
        self.limit = config.inflight_start  # the engine's concurrency, as last reported
        self._closed = False
        self._pid = os.getpid()  # a forked child inherits this object, not the engine
        try:
            self._start(process)
        except BaseException:
            if process is not None:
                process.close()  # not adopted: killed here
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

    def _start(self, process: EngineProcess | None) -> None:
        if self.mode == "process":
            adopted = process.adopt() if process is not None else None
            self._conn, self._proc = adopted if adopted is not None else spawn()
            try:
                self._conn.send(Hello(self.ring.name, self.config))
                # The ring's descriptor, right behind: the one segment the engine reaches.
                reduction.send_handle(self._conn, self.ring.fileno(), self._proc.pid)
            except OSError as exc:  # the process died before it could be told anything
                raise self._died() from exc
        else:
            if process is not None:
                process.close()  # a thread serves here (a DataLoader worker, say)
            from ._server import run_engine  # the consumer's import skips the engine's side

            ours, theirs = multiprocessing.Pipe(duplex=True)
            self._conn = ours
            ring_fd = os.dup(self.ring.fileno())  # the engine's own, closed with its ring
            self._thread = threading.Thread(
                target=run_engine,
                args=(theirs, ring_fd, self.ring.name, self.config),
                name="asyncstream-engine",
                daemon=True,
            )
            try:
                self._thread.start()
            except BaseException:
                os.close(ring_fd)
                raise
        # Not waiting for "started" lets the engine boot while the caller sets up; a
        # broken set-up still fails at the first wait, before any data.

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
            released, self._released = self._released, False
            self._send(Fetch(list(zip(ids, requests, strict=True)), released))
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
        if rid not in self._arrived:
            self.flush()  # the chunk may wait for a slot given back unsaid
        while rid not in self._arrived:
            self._receive(began + limit)
        self._starved += time.monotonic() - began
        message = self._arrived.pop(rid)
        request = self._requests.pop(rid)
        if isinstance(message, ChunkFailed):
            raise with_remote_cause(message.error, message.trace)
        self.ring.take(message.slot)
        return Ready(rid, message.slot, message.nbytes, request)

    def view(self, ready: Ready) -> memoryview:
        """The chunk's bytes in the ring (valid until :meth:`release`)."""
        return self.ring.view(ready.slot)[: ready.nbytes]

    def release(self, slot: int, *, tell: bool = True) -> None:
        """Give a slot back to the engine (IN_USE to FREE).

        Args:
            slot: the chunk's slot.
            tell: tell the engine now. Without, it is told with the next :meth:`submit`,
                before :meth:`wait` blocks, or at :meth:`flush`, whichever comes first:
                a consumer that releases a chunk and then submits the next saves a
                message each way (the engine only needs to know before it runs out of
                free slots, and every way of waiting for one says it first).
        """
        self._check_open()
        self.ring.release(slot)
        if tell:
            self._released = False
            self._send(Release(slot))
        else:
            self._released = True

    def flush(self) -> None:
        """Tell the engine of the slots :meth:`release` gave back without telling."""
        if self._released and not self._closed:
            self._released = False
            self._send(Release(-1))

    def stats(self) -> dict[str, Any]:
        """The engine's statistics, plus ``starved_s``: the consumer's time spent waiting.

        ``transport`` says which transport its S3 downloads take (``"direct"`` or
        ``"aiohttp"``, see :mod:`asyncstream.stores._s3store`).
        """
        self._check_open()
        self._stats = None
        self.flush()
        self._send(AskStats())
        deadline = time.monotonic() + 10.0
        while self._stats is None:
            self._receive(deadline)
        return {**self._stats, "starved_s": self._starved}

    def _receive(self, deadline: float) -> None:
        assert self._conn is not None
        # The engine's death closes its end of the pipe: EOF here, at once.
        remaining = deadline - time.monotonic()
        poller = self._poller
        if poller is None:
            poller = self._poller = select.poll()
            poller.register(self._conn.fileno(), select.POLLIN)
        # poll() takes milliseconds, rounded up so that a wait never ends before its time
        if poller.poll(max(0, math.ceil(remaining * 1000))):
            try:
                message: FromEngine = self._conn.recv()
            except (EOFError, OSError) as exc:
                raise self._died() from exc
            if isinstance(message, ChunksReady):
                arrived, limit = self._arrived, message.limit
                for rid, slot, nbytes in message.chunks:
                    arrived[rid] = ChunkReady(rid, slot, nbytes, limit)
                if limit:
                    self.limit = limit
            elif isinstance(message, ChunkFailed):  # (ChunkReady comes in ChunksReady)
                self._arrived[message.id] = message
            elif isinstance(message, Stats):
                self._stats = message.stats
            elif isinstance(message, Log):
                log_from_engine(message)
            elif isinstance(message, Fatal):
                raise EngineError(
                    f"the fetch engine failed: {message.error!r}"
                ) from RemoteTraceback(message.trace)
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

    def _send(self, message: ToEngine) -> None:
        assert self._conn is not None
        try:
            send(self._conn, message)
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
        """Stop the engine and let go of the ring. Idempotent.

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
                    self._conn.send(Stop())
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
    """At exit, close every engine still open, so their processes are reaped."""
    for engine in list(_LIVE):
        with contextlib.suppress(Exception):
            engine.close(wait=True)


def _close_on_sigterm() -> None:
    """In a DataLoader worker: close the engines before SIGTERM ends the process.

    Persistent workers are still alive when the main process exits, and multiprocessing's
    exit hook SIGTERMs daemonic children, so their finalizers never run: each worker's
    engine would be cut off mid-work. The handler closes the live engines (their rings,
    whose memory goes with the worker anyway), then hands the signal to the handler there
    was before, and ends the worker with status 0 (unless SIGTERM was ignored): it was
    being shut down, and a worker dead of a signal makes torch's watchdog in the main
    process raise ``RuntimeError`` during its exit. It ends the worker even when that
    handler returns: a handler inherited from the
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
