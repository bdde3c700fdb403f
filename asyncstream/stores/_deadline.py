"""A total deadline for each request the S3, GCS and Azure stores make at open: a
``HEAD``, a listing page, the ``GET`` of an index file or manifest, its retries included.

A per-read timeout never fires on a server that trickles its headers or body a byte every
half second; a deadline on the whole request does. The mechanism is one, under all three
SDKs, because all three send on urllib3:

* a request at open runs in a :func:`bounded` scope, held per thread (one request and
  its retries, its body read included);
* the urllib3 connections made from this module's pool classes (:func:`watched`) enlist
  with the scope of the thread that uses them, as they connect and as they wait for an
  answer;
* a timer thread, at the deadline, shuts down the sockets of the connections enlisted
  (a blocked ``recv`` returns at once, under TLS too); the library then fails and closes
  the connection, and :func:`attempt_under` reads its error as the deadline's: a
  ``ChunkFailure("open_deadline")``, which :mod:`._errors` makes a
  :class:`~asyncstream.TransientFetchError` naming the URL and the deadline, not retried.

How each store's SDK is given these connections, all public extension points: botocore's
``before-send`` event (the S3 store sends the request on a urllib3 ``PoolManager`` of
these pools, as botocore's own sender does: :mod:`._s3objects`); a ``requests``
``HTTPAdapter`` whose pool manager uses them (:func:`deadline_session`: the GCS store's
session), and azure-core's ``RequestsTransport(session=...)`` on such a session (Azure).
Requests outside a scope (uploads of ``pack``) are not bounded.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.response import BaseHTTPResponse

from ._errors import ChunkFailure

if TYPE_CHECKING:
    import requests

__all__ = ["Deadline", "attempt_under", "bounded", "current", "deadline_session", "watched"]

T = TypeVar("T")
_LOCAL = threading.local()


class Deadline:
    """The deadline of one request at open and its retries (module docstring).

    Args:
        seconds: the time the request may take in all.
        setting: where the deadline is set, for the error's message.
    """

    def __init__(self, seconds: float, setting: str) -> None:
        self.seconds = seconds
        self.setting = setting
        self.until = time.monotonic() + seconds
        self._expired = threading.Event()
        self._lock = threading.Lock()
        self._enlisted: list[Any] = []

    @property
    def expired(self) -> bool:
        return self._expired.is_set()

    def enlist(self, conn: Any) -> None:
        """``conn`` serves this scope now: shut at the deadline (at once if past it)."""
        conn.asyncstream_deadline = self
        with self._lock:
            if conn not in self._enlisted:
                self._enlisted.append(conn)
        if self.expired:
            _shut(conn)

    def expire(self) -> None:
        """The deadline: end every connection still serving this scope."""
        self._expired.set()
        with self._lock:
            enlisted = list(self._enlisted)
        for conn in enlisted:
            if getattr(conn, "asyncstream_deadline", None) is self:
                _shut(conn)

    def check(self) -> None:
        """Raise the deadline's error if it has passed (before an attempt)."""
        if self.expired or time.monotonic() >= self.until:
            raise self.error()

    def error(self) -> ChunkFailure:
        return ChunkFailure(
            "open_deadline",
            f"no complete answer within {self.seconds:g} s, retries included (the "
            f"setting {self.setting})",
        )


def _shut(conn: Any) -> None:
    sock = getattr(conn, "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the plain socket's, under TLS too


def current() -> Deadline | None:
    """The scope of this thread's request at open, if one is running."""
    deadline: Deadline | None = getattr(_LOCAL, "deadline", None)
    return deadline


@contextlib.contextmanager
def bounded(seconds: float, setting: str) -> Iterator[Deadline]:
    """Run a request (and its retries) under a deadline of ``seconds``; a scope already
    running on this thread is kept (its deadline is the nearer)."""
    outer = current()
    if outer is not None:
        yield outer
        return
    deadline = Deadline(seconds, setting)
    timer = threading.Timer(seconds, deadline.expire)
    timer.daemon = True
    timer.start()
    _LOCAL.deadline = deadline
    try:
        yield deadline
    finally:
        _LOCAL.deadline = None
        timer.cancel()  # its thread ends now


def attempt_under(deadline: Deadline | None, attempt: Callable[[], T]) -> Callable[[], T]:
    """``attempt`` as one try within ``deadline``: not started past it, and whatever it
    raised once the deadline shut its connection is the deadline's error (also where the
    shut connection looked like the end of a body)."""
    if deadline is None:
        return attempt

    def bounded_attempt() -> T:
        deadline.check()
        try:
            result = attempt()
        except Exception as exc:
            if deadline.expired:
                raise deadline.error() from exc
            raise
        if deadline.expired:
            raise deadline.error()
        return result

    return bounded_attempt


def _enlist(conn: Any) -> None:
    deadline = current()
    if deadline is not None:
        deadline.enlist(conn)


def _refuse_past(conn: Any) -> None:
    """No request leaves once its scope's deadline has passed: an SDK's own retry of a
    body the deadline cut (Azure's downloader retries reads on its own, whatever its
    retry policy) would otherwise open a new connection and send it."""
    deadline = current()
    if deadline is not None and deadline.expired:
        raise ConnectionAbortedError(f"{deadline.setting}: the deadline has passed")
    _enlist(conn)


class _WatchedHTTPConnection(HTTPConnection):
    """A urllib3 connection that enlists with the thread's deadline scope, and sends
    nothing past its deadline."""

    def connect(self) -> None:
        _refuse_past(self)
        super().connect()
        _enlist(self)  # shut at once if the deadline passed while connecting

    def request(self, *args: Any, **kwargs: Any) -> None:
        _refuse_past(self)  # a kept-alive connection, reused: checked before it sends
        super().request(*args, **kwargs)

    def getresponse(self) -> Any:
        _enlist(self)
        response: BaseHTTPResponse = super().getresponse()
        return response


class _WatchedHTTPSConnection(HTTPSConnection):
    """:class:`_WatchedHTTPConnection` over TLS (its plain socket is shut)."""

    def connect(self) -> None:
        _refuse_past(self)
        super().connect()
        _enlist(self)

    def request(self, *args: Any, **kwargs: Any) -> None:
        _refuse_past(self)
        super().request(*args, **kwargs)

    def getresponse(self) -> Any:
        _enlist(self)
        response: BaseHTTPResponse = super().getresponse()
        return response


class _WatchedHTTPPool(urllib3.HTTPConnectionPool):
    ConnectionCls = _WatchedHTTPConnection


class _WatchedHTTPSPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPSConnection


M = TypeVar("M", bound=urllib3.PoolManager)


def watched(manager: M) -> M:
    """``manager`` (a urllib3 ``PoolManager`` or ``ProxyManager``, new) making its
    connections of the pool classes above: bounded by the scope of the thread using them."""
    manager.pool_classes_by_scheme = {"http": _WatchedHTTPPool, "https": _WatchedHTTPSPool}
    return manager


def deadline_session() -> requests.Session:
    """A ``requests`` session whose connections are bounded by :func:`bounded` scopes."""
    import requests
    from requests.adapters import HTTPAdapter

    class DeadlineAdapter(HTTPAdapter):
        def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
            super().init_poolmanager(*args, **kwargs)
            watched(self.poolmanager)

        def proxy_manager_for(self, proxy: str, **kwargs: Any) -> Any:
            return watched(super().proxy_manager_for(proxy, **kwargs))

    session = requests.Session()
    session.mount("http://", DeadlineAdapter())
    session.mount("https://", DeadlineAdapter())
    return session
