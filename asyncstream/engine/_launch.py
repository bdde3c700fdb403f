"""The fetch engine's process, started before its ring and settings are known.

A fresh interpreter takes a while to run the engine (Python itself, the engine's modules,
the event loop, the store's client library: 0.1 s to 0.3 s). A stream starts it first
thing at construction (:class:`EngineProcess`), so that this time passes while the dataset
is opened (the HEADs, the index) and the caller sets up; the process imports what it will
need, the store modules of the URLs' schemes included (:func:`store_modules`), then waits
for its :class:`~._protocol.Hello`. The stream's first :class:`~._engine.Engine` adopts it
(:meth:`EngineProcess.adopt`) and sends the ring and the settings, or starts a process of
its own where there is none to adopt.

Lifetime: a process nobody adopts within ``idle_limit`` seconds (a stream read only by
DataLoader workers, each of which runs its own engine) is killed, as it is by
:meth:`EngineProcess.close` (a stream closed, or whose open failed) and at exit. Before
the Hello it holds nothing (no ring, no store, no connection), so killing it leaves
nothing behind.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import subprocess
import sys
import threading
import weakref
from collections.abc import Iterable
from multiprocessing.connection import Connection

from ..stores._registry import registered_stores, scheme_of

__all__ = ["EngineProcess", "spawn", "store_modules"]

IDLE_LIMIT = 30.0

# Client libraries a store imports only when it is opened, by scheme: the S3 store's
# botocore session (``S3Store.open``) is most of its opening time in a fresh process.
_CLIENT_MODULES = {"s3": ("aiobotocore.session",)}


def store_modules(urls: Iterable[str]) -> tuple[str, ...]:
    """The modules of the stores that serve ``urls`` (and their client libraries), for the
    engine's process to import before its settings come; URLs no store serves are left
    to the stream's open to report."""
    table = dict(registered_stores())
    found: list[str] = []
    for url in urls:
        try:
            scheme = scheme_of(url)
        except Exception:  # reported by the open, not here
            continue
        if scheme in table:
            found.append(table[scheme].partition(":")[0])
        found.extend(_CLIENT_MODULES.get(scheme, ()))
    return tuple(dict.fromkeys(found))


def spawn(preload: Iterable[str] = ()) -> tuple[Connection, subprocess.Popen[bytes]]:
    """Start ``python -m asyncstream.engine FD [MODULE ...]``: a fresh interpreter running
    only the engine (not multiprocessing's spawn, which re-imports the caller's
    ``__main__`` and with it torch and the training script), which imports ``preload``
    while it waits for its Hello.

    Returns:
        The consumer's end of the connection, and the process.
    """
    ours_sock, theirs_sock = socket.socketpair()
    conn = Connection(ours_sock.detach())
    fd = theirs_sock.detach()
    try:
        env = dict(os.environ)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        proc = subprocess.Popen(
            [sys.executable, "-m", "asyncstream.engine", str(fd), *preload],
            pass_fds=[fd],
            env=env,
            stdin=subprocess.DEVNULL,
        )
    except BaseException:
        conn.close()
        raise
    finally:
        os.close(fd)
    return conn, proc


class EngineProcess:
    """An engine process started ahead of its engine, waiting for its Hello.

    Args:
        preload: modules it imports meanwhile (:func:`store_modules`).
        idle_limit: seconds after which, not adopted, it is killed.
    """

    def __init__(self, preload: Iterable[str] = (), *, idle_limit: float = IDLE_LIMIT) -> None:
        self._owner = os.getpid()  # a forked child holds a mere copy
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn, self._proc = spawn(preload)
        self.pid = self._proc.pid
        self._timer = threading.Timer(idle_limit, self.close)
        self._timer.daemon = True
        self._timer.name = "asyncstream-launch-timer"
        self._timer.start()
        _WAITING.add(self)

    def __repr__(self) -> str:
        state = "waiting" if self._proc is not None else "adopted or closed"
        return f"EngineProcess(pid={self.pid}, {state})"

    @property
    def owned(self) -> bool:
        """Whether this process started it (a forked child holds a mere copy)."""
        return os.getpid() == self._owner

    def _take(self) -> tuple[Connection | None, subprocess.Popen[bytes] | None]:
        with self._lock:
            conn, proc = self._conn, self._proc
            self._conn = self._proc = None
        self._timer.cancel()
        _WAITING.discard(self)
        return conn, proc

    def adopt(self) -> tuple[Connection, subprocess.Popen[bytes]] | None:
        """Hand the process over to an engine, once: its connection and itself; ``None``
        where it is gone (killed as idle, closed), dead, or another process's."""
        conn, proc = self._take()
        if conn is None or proc is None:
            return None
        if self.owned and proc.poll() is None:
            return conn, proc
        self._end(conn, proc)
        return None

    def close(self) -> None:
        """Kill the process if nobody adopted it (idempotent; in a forked child, only
        this copy's descriptor is closed)."""
        conn, proc = self._take()
        self._end(conn, proc)

    def _end(self, conn: Connection | None, proc: subprocess.Popen[bytes] | None) -> None:
        if conn is not None:
            conn.close()
        if proc is not None and self.owned:
            # It holds nothing yet: no ring, no store, no connection to clean up.
            with contextlib.suppress(OSError):
                proc.kill()
            proc.wait()


_WAITING: weakref.WeakSet[EngineProcess] = weakref.WeakSet()


@atexit.register
def _close_waiting() -> None:
    """At exit, kill every engine process still waiting to be adopted."""
    for launch in list(_WAITING):
        with contextlib.suppress(Exception):
            launch.close()
