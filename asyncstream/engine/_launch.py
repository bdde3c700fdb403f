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
DataLoader workers, each of which runs its own engine) exits by itself; the consumer
adopts none older than ``idle_limit`` less a margin, so a Hello never meets a process on
its way out, and starts another instead. :meth:`EngineProcess.close` (a stream closed,
or whose open failed) and the exit of the consumer kill it. Before the Hello it holds
nothing (no ring, no store, no connection), so killing it leaves nothing behind. No
thread watches it: a thread alive when DataLoader forks its workers is unsafe (Python
3.12 warns of it).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterable
from multiprocessing.connection import Connection

from ..stores._registry import registered_stores, scheme_of

__all__ = ["EngineProcess", "python_command", "spawn", "store_modules"]

IDLE_LIMIT = 30.0
_MARGIN = 5.0  # at most: a process this close to its idle limit is not adopted

# Client libraries a store imports only when it is opened, by scheme: the S3 store's
# botocore session, for the credentials' chain (``S3Store.open``). aiobotocore is not
# preloaded: the S3 store makes its client only where botocore must resolve a URL or the
# aiohttp transport runs, and importing it (0.3 s of CPU, aiohttp's CA bundle included)
# would compete with the consumer's open for the core.
_CLIENT_MODULES = {"s3": ("botocore.session",)}


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


def python_command(module: str, *args: str) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that run ``python -m MODULE ARGS`` in a fresh
    interpreter like this one, importing nothing from the caller's working directory.

    ``-m`` alone puts the working directory first on ``sys.path``, ahead of the standard
    library: a ``secrets.py`` in the folder a training script is started from would be
    imported by the child in place of the standard library's. ``-P`` (Python 3.11) leaves
    it out, and the empty entries of ``PYTHONPATH`` (which mean the working directory
    too, left by ``PYTHONPATH=$PYTHONPATH:...``) are dropped. The rest of the caller's
    environment is kept: not ``-I``, which would also drop ``PYTHONPATH`` (editable
    installs, the tests) and the user's site-packages (``pip install --user``). The folder
    this asyncstream is imported from is put first on ``PYTHONPATH``, so that the child
    runs the same copy.
    """
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    paths = [root, *env.get("PYTHONPATH", "").split(os.pathsep)]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(filter(None, paths)))
    return [sys.executable, "-P", "-m", module, *args], env


def spawn(
    preload: Iterable[str] = (), idle_limit: float | None = None
) -> tuple[Connection, subprocess.Popen[bytes]]:
    """Start ``python -P -m asyncstream.engine FD IDLE [MODULE ...]`` (:func:`python_command`:
    nothing from the working directory): a fresh interpreter
    running only the engine (not multiprocessing's spawn, which re-imports the caller's
    ``__main__`` and with it torch and the training script), which imports ``preload``
    while it waits for its Hello, for at most ``idle_limit`` seconds (None: no limit).

    Returns:
        The consumer's end of the connection, and the process.
    """
    ours_sock, theirs_sock = socket.socketpair()
    conn = Connection(ours_sock.detach())
    fd = theirs_sock.detach()
    try:
        limit = "-" if idle_limit is None else repr(float(idle_limit))
        command, env = python_command("asyncstream.engine", str(fd), limit, *preload)
        proc = subprocess.Popen(command, pass_fds=[fd], env=env, stdin=subprocess.DEVNULL)
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
        idle_limit: seconds it waits for a Hello, counted once its imports are done, then
            exits; it is not adopted within a margin of that (see the module).
    """

    def __init__(self, preload: Iterable[str] = (), *, idle_limit: float = IDLE_LIMIT) -> None:
        self._owner = os.getpid()  # a forked child holds a mere copy
        self._lock = threading.Lock()
        self._adopt_within = idle_limit - min(_MARGIN, idle_limit / 2)
        self._started = time.monotonic()  # before the process's own count begins
        self._conn: Connection | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn, self._proc = spawn(preload, idle_limit)
        self.pid = self._proc.pid
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
        _WAITING.discard(self)
        return conn, proc

    def adopt(self) -> tuple[Connection, subprocess.Popen[bytes]] | None:
        """Hand the process over to an engine, once: its connection and itself; ``None``
        where it is closed, dead, near its idle limit (then it is killed), or another
        process's."""
        fresh = time.monotonic() - self._started < self._adopt_within
        conn, proc = self._take()
        if conn is None or proc is None:
            return None
        if self.owned and fresh and proc.poll() is None:
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
