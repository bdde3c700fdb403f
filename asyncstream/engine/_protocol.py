"""The wire protocol between an :class:`~._engine.Engine` handle and its engine.

The engine runs in its own process (``python -m asyncstream.engine FD``) or in a thread
of the consumer; either way the two sides talk over one duplex
:class:`multiprocessing.connection.Connection`, each message one pickled object of the
types below (small named tuples: cheap to pickle, matched by type).

At start, a process (not a thread, which is handed them directly) first receives
:class:`Hello`: the ring's label and the :class:`~._config.EngineConfig`, then, right
behind it on the same socket, the ring's descriptor (``SCM_RIGHTS``,
:func:`multiprocessing.reduction.send_handle`): the ring has no name to attach by. Then:

    consumer -> engine   Fetch(chunks, released)          more work, in need order (and
                                                          whether slots went back to FREE
                                                          since the consumer last said so)
                         Release(slot)                    a slot went back to FREE
                         AskStats()                       ask for statistics
                         Stop()                           finish and exit
    engine -> consumer   Started()                        once, when it can fetch
                                                          (informative; not awaited)
                         ChunkReady(id, slot, nbytes)     as each chunk completes,
                                                          sent as
                         ChunksReady(chunks, limit)       the chunks of one turn of the
                                                          engine's loop together
                         ChunkFailed(id, error, trace)    at the chunk's place
                         Stats(stats)                     the answer to AskStats
                         Fatal(error, trace)              the engine itself broke
                         Log(name, level, text)           a record of the engine's
                                                          ``asyncstream`` logger (a
                                                          process's: retries, the cache)

Messages are pickled with :func:`pickle.dumps` and sent with ``send_bytes`` (the
:class:`~multiprocessing.connection.Connection`'s own ``send`` makes a ForkingPickler for
each, which only matters for handles: the ring's goes by :func:`send_handle`).

Chunk ids are the consumer's: it numbers the chunks it submits, and the engine answers
each id exactly once, with :class:`ChunkReady` or :class:`ChunkFailed`, in the order
downloads finish (the consumer takes them by id, so what it sees never depends on network
timing). Errors travel pickled, with their traceback as text (:func:`with_remote_cause`
chains it to the error raised at the consumer). End of file on the connection means the
other side is gone: the consumer then reports the engine dead; the engine exits.
"""

from __future__ import annotations

import logging
import pickle
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

from ..stores._store import ChunkRequest
from ._config import EngineConfig

__all__ = [
    "AskStats",
    "ChunkFailed",
    "ChunkReady",
    "ChunksReady",
    "Fatal",
    "Fetch",
    "FromEngine",
    "Hello",
    "Log",
    "Release",
    "Started",
    "Stats",
    "Stop",
    "ToEngine",
    "log_from_engine",
    "send",
    "with_remote_cause",
]


class Hello(NamedTuple):
    """The first message to an engine process: the ring's label (its descriptor follows)
    and how to fetch."""

    ring_name: str
    config: EngineConfig


# -- consumer to engine -------------------------------------------------------------------


class Fetch(NamedTuple):
    """More chunks to download, ``(id, request)`` each, in the order they will be needed;
    ``released``: slots went back to FREE since the last :class:`Release` (said here rather
    than in a message of its own: one message a chunk less each way)."""

    chunks: list[tuple[int, ChunkRequest]]
    released: bool = False


class Release(NamedTuple):
    """The consumer put ``slot`` back to FREE (the engine may fill it again); -1: slots
    given back earlier without a word (:meth:`~._engine.Engine.flush`). The engine reads
    which slots are FREE from the ring either way."""

    slot: int


class AskStats(NamedTuple):
    """Ask for the engine's statistics (answered by :class:`Stats`)."""


class Stop(NamedTuple):
    """Cancel what runs, close the stores, and exit."""


ToEngine = Fetch | Release | AskStats | Stop


# -- engine to consumer -------------------------------------------------------------------


class Started(NamedTuple):
    """The engine's stores are open: it can fetch."""


class ChunkReady(NamedTuple):
    """Chunk ``id`` is READY in ``slot``, ``nbytes`` long; ``limit``: the downloads the
    engine allows at once now (``prefetch="auto"`` asks ahead for twice that)."""

    id: int
    slot: int
    nbytes: int
    limit: int = 0


class ChunksReady(NamedTuple):
    """The :class:`ChunkReady` of one turn of the engine's event loop, in order, in one
    message: ``(id, slot, nbytes)`` each, and the ``limit`` of the last. A group of
    chunks read at once (consecutive chunks of a shard, read or received together)
    completes in one turn; one message for them saves each side a pickle and a system
    call a chunk (see :class:`~._server._Server`)."""

    chunks: tuple[tuple[int, int, int], ...]
    limit: int = 0


class ChunkFailed(NamedTuple):
    """Chunk ``id`` could not be fetched; its slot is FREE again."""

    id: int
    error: BaseException
    trace: str


class Stats(NamedTuple):
    """The engine's statistics (:meth:`~._stats.EngineStats.as_dict`)."""

    stats: dict[str, Any]


class Fatal(NamedTuple):
    """The engine itself broke and has stopped."""

    error: BaseException
    trace: str


class Log(NamedTuple):
    """A record of the engine process's ``asyncstream`` logger (INFO and above), its
    text already formatted and redacted, for the consumer to log as its own."""

    name: str
    level: int
    text: str


FromEngine = Started | ChunkReady | ChunksReady | ChunkFailed | Stats | Fatal | Log


def send(conn: Connection, message: ToEngine | FromEngine) -> None:
    """Send one message (see the module's docstring)."""
    conn.send_bytes(pickle.dumps(message, pickle.HIGHEST_PROTOCOL))


def log_from_engine(message: Log) -> None:
    """Log an engine process's record in the consumer, under its logger (an
    ``asyncstream`` one), where the consumer's logging configuration handles it."""
    name = message.name if message.name.split(".", 1)[0] == "asyncstream" else "asyncstream"
    logging.getLogger(name).log(message.level, "%s", message.text)


class RemoteTraceback(Exception):
    """The traceback of an error raised on the engine's side, as text."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return f'\n"""\n{self.tb}"""'


def with_remote_cause(exc: BaseException, tb: str) -> BaseException:
    """``exc``, chained to the engine-side traceback ``tb`` it was sent with."""
    exc.__cause__ = RemoteTraceback(tb)
    return exc
