"""The fault-injecting proxy itself: :class:`FaultProxy` (see :mod:`asyncstream.testing`).

Its parts live beside it: the faults (``_faults.py``), the network profile
(``_network.py``), the state each request is decided on (``_control.py``), the HTTP
parsing (``_http.py``) and the connections (``_connection.py``). The proxy runs its own
event loop in its own thread, so it serves sync tests and code that runs its own loop alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import threading
import urllib.parse
from collections.abc import Iterable
from types import TracebackType
from typing import Final

from ._connection import Connection
from ._control import Control
from ._faults import Fault, FaultPlan, Injection, make_action
from ._network import NetworkProfile
from ._served import Served

__all__ = ["FaultProxy"]

_log = logging.getLogger("asyncstream.testing")

_START_TIMEOUT: Final = 30.0
_CLOSE_TIMEOUT: Final = 5.0
_HEAD_LIMIT: Final = 64 * 1024


class FaultProxy(Served):
    """An HTTP/1.1 proxy on loopback that forwards to an S3 server and injects faults.

    Use it as a context manager (or ``async with``), or call :meth:`start` and
    :meth:`close`. A closed proxy cannot be started again.

    Example::

        with FaultProxy(s3.endpoint_url, profile=NetworkProfile.s3_like()) as proxy:
            client = sync_client(S3Options(endpoint_url=proxy.endpoint_url).resolve())
            proxy.inject(Fault.RESET, match="shard-0003.tar")
            ...

    Args:
        upstream: the S3 server's URL, ``http://HOST:PORT``. The proxy connects there and
            forwards each request's ``Host`` header unchanged.
        faults: seeded fault rates for ``GET`` requests; ``None`` for none.
        profile: network shaping; ``None`` for none (:meth:`NetworkProfile.loopback`).
        seed: seeds the fault draws and, separately, the latency draws of the profile.
        capacity: the most ``GET`` requests served at once; one beyond it gets ``503 Slow
            Down`` (``None``: no limit).
        tls: ``(cert_pem, key_pem)``: listen with TLS (``endpoint_url`` is then
            ``https://``; see :func:`make_test_certificates`); the upstream is still
            spoken to in plain HTTP. ``None``: plain HTTP.
        strip_request_headers: header names (any case) removed from every request
            before it is forwarded: ``("if-match",)`` models a server (or a proxy in front
            of one) that ignores ``If-Match``.

    Raises:
        ValueError: a bad argument; ``tls`` files that do not load (``ssl.SSLError``,
            ``OSError``).
    """

    def __init__(
        self,
        upstream: str,
        *,
        faults: FaultPlan | None = None,
        profile: NetworkProfile | None = None,
        seed: int = 0,
        capacity: int | None = None,
        tls: tuple[str, str] | None = None,
        strip_request_headers: Iterable[str] = (),
    ) -> None:
        split = urllib.parse.urlsplit(upstream)
        if split.scheme != "http" or not split.hostname:
            raise ValueError(f"upstream must be an http://HOST[:PORT] URL, got {upstream!r}")
        if faults is not None and not isinstance(faults, FaultPlan):
            raise TypeError(f"faults must be a FaultPlan or None, got {faults!r}")
        if profile is not None and not isinstance(profile, NetworkProfile):
            raise TypeError(f"profile must be a NetworkProfile or None, got {profile!r}")
        if capacity is not None and (isinstance(capacity, bool) or capacity < 1):
            raise ValueError(f"capacity must be an int >= 1 or None, got {capacity!r}")
        if isinstance(strip_request_headers, str):
            raise TypeError("strip_request_headers must be a collection of header names")
        self.upstream = upstream
        self.tls = tls
        self.strip_request_headers = frozenset(h.lower() for h in strip_request_headers)
        self._ssl: ssl.SSLContext | None = None
        if tls is not None:
            cert, key = tls
            self._ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self._ssl.load_cert_chain(cert, key)
        self._up_host = split.hostname
        self._up_port = split.port or 80
        self._plan = faults if faults is not None else FaultPlan()
        self._profile = profile if profile is not None else NetworkProfile()
        self.seed = seed
        self._control = Control(self._plan, self._profile, seed, capacity)
        self._lock = threading.Lock()
        self._closed = False
        self._endpoint: str | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        # Owned by the proxy's loop thread:
        self._tasks: set[asyncio.Task[None]] = set()
        self._transports: set[asyncio.WriteTransport] = set()

    def __repr__(self) -> str:
        state = "closed" if self._closed else (self._endpoint or "not started")
        return f"FaultProxy(upstream={self.upstream!r}, {state}, faults={self._plan!r})"

    @property
    def endpoint_url(self) -> str:
        """The proxy's URL, ``http://127.0.0.1:PORT`` (``https://`` with ``tls``);
        ``RuntimeError`` unless running."""
        if self._endpoint is None or self._closed:
            raise RuntimeError("FaultProxy is not running; call start() or use it with 'with'")
        return self._endpoint

    @property
    def capacity(self) -> int | None:
        """The most ``GET`` requests served at once (``None``: no limit); settable while
        the proxy runs, e.g. to end throttling."""
        return self._control.capacity

    @capacity.setter
    def capacity(self, value: int | None) -> None:
        if value is not None and (isinstance(value, bool) or value < 1):
            raise ValueError(f"capacity must be an int >= 1 or None, got {value!r}")
        self._control.capacity = value

    @property
    def faults(self) -> FaultPlan:
        """The seeded fault plan (all rates zero when none was given)."""
        return self._plan

    @property
    def profile(self) -> NetworkProfile:
        """The network profile (no shaping when none was given)."""
        return self._profile

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> FaultProxy:
        """Start serving, in a thread of its own, and wait until it listens.

        Returns:
            ``self``. Starting a running proxy does nothing.

        Raises:
            RuntimeError: the proxy was closed, or could not start.
        """
        if self._closed:
            raise RuntimeError("this FaultProxy was closed; make a new one")
        if self._thread is not None:
            return self
        ready = threading.Event()
        thread = threading.Thread(
            target=self._run, args=(ready,), name=f"FaultProxy({self.upstream})", daemon=True
        )
        self._thread = thread
        thread.start()
        if not ready.wait(_START_TIMEOUT):
            self.close()
            raise RuntimeError(f"FaultProxy did not start within {_START_TIMEOUT:.0f} s")
        if self._error is not None:
            self.close()
            raise RuntimeError(f"FaultProxy could not start: {self._error!r}") from self._error
        return self

    def close(self) -> None:
        """Stop serving: close every connection (stalled ones too) and end the thread.

        Safe to call more than once; waits at most a few seconds.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        loop, stop, thread = self._loop, self._stop, self._thread
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                loop.call_soon_threadsafe(stop.set)
        if thread is not None:
            thread.join(_CLOSE_TIMEOUT + 5.0)
            if thread.is_alive():
                _log.warning("FaultProxy: the proxy thread did not end in time")
        self._endpoint = None

    async def __aenter__(self) -> FaultProxy:
        return await asyncio.to_thread(self.start)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.close)

    # ---------------------------------------------------------------- fault control

    def inject(
        self,
        kind: Fault | str,
        count: int = 1,
        *,
        match: str | None = None,
        method: str | None = None,
        seconds: float | None = None,
        body_fraction: float | None = None,
        after_bytes: int | None = None,
        status: int | None = None,
        code: str | None = None,
        message: str | None = None,
    ) -> None:
        """Give the next ``count`` matching requests this fault, exactly.

        Queued faults are tried in the order they were injected, before the seeded plan;
        one request gets at most one fault.

        Args:
            kind: the fault, a :class:`Fault` or its value (``"slowdown"``).
            count: how many requests get it.
            match: only requests whose target (path and query, raw or percent-decoded)
                contains this substring; ``None`` for any.
            method: only requests with this HTTP method (``"GET"``); ``None`` for any.
            seconds: the delay of ``latency`` (default 1 s) or the length of ``stall``
                (default 3600 s).
            body_fraction: for ``reset``, ``truncate`` and ``stall``: the fraction of the
                response body sent before the fault fires (default 0.5).
            after_bytes: instead of ``body_fraction``, the number of body bytes sent first.
            status: for ``status``: the HTTP status to answer (required).
            code: for ``status``: the S3 error code (default: S3's for that status).
            message: for ``status``: the error message (default: S3's for that status).

        Raises:
            ValueError: an unknown kind, or a parameter that does not fit the kind.
            RuntimeError: the proxy was closed.
        """
        fault = Fault(kind)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"count must be an int >= 1, got {count!r}")
        action = make_action(
            fault,
            seconds=seconds,
            body_fraction=body_fraction,
            after_bytes=after_bytes,
            status=status,
            code=code,
            message=message,
        )
        injection = Injection(action, count, match, method.upper() if method else None)
        with self._lock:
            if self._closed:
                raise RuntimeError("this FaultProxy was closed")
            self._control.queue(injection)

    def clear(self) -> None:
        """Drop every fault queued with :meth:`inject` that has not fired yet."""
        self._control.clear()

    def pending(self) -> int:
        """How many injected faults have not fired yet (summed over their counts)."""
        return self._control.pending()

    def stats(self) -> dict[str, int]:
        """Counts since the proxy was made; safe to call from any thread.

        Returns:
            A new dict with one key per :class:`Fault` value (how many requests got that
            fault, injected or drawn) and ``requests`` (requests received), ``forwarded``
            (requests sent to the upstream server), ``bytes_forwarded`` (response body
            bytes sent from the server to clients), ``connections`` (client
            connections accepted) and ``throttled`` (``GET`` requests refused for want of
            ``capacity``; also counted as ``slowdown``).
        """
        return self._control.stats()

    def requests(self) -> list[tuple[str, str, int]]:
        """Every request answered so far, in order: ``(method, path, status)``.

        ``path`` is the percent-decoded path of the target, without the query
        (``/bucket/train/shard-0001.tar``), so requests can be counted per object; the
        status is that of the response head sent (an injected error's, or the server's:
        a body cut short by a fault still shows 200 or 206). Safe from any thread. The log
        grows with the requests for the proxy's life: it is meant for tests.
        """
        return self._control.requests()

    def ranged_requests(self) -> list[tuple[str, str, str | None, int]]:
        """:meth:`requests` with each request's ``Range`` header (``None`` without one):
        ``(method, path, range, status)``, so a test can tell a retry of one chunk (the same
        range asked again) from the other chunks of its object."""
        return self._control.ranged_requests()

    # ---------------------------------------------------------------- internals

    def _track(self, transport: asyncio.WriteTransport) -> None:
        self._transports.add(transport)

    def _untrack(self, transport: asyncio.WriteTransport) -> None:
        self._transports.discard(transport)

    def _run(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main(ready))
        except BaseException as exc:  # reported by start(); the thread must not die noisily
            self._error = exc
            _log.debug("FaultProxy: loop failed", exc_info=True)
        finally:
            ready.set()
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()

    async def _main(self, ready: threading.Event) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(
            self._accept, "127.0.0.1", 0, limit=_HEAD_LIMIT, ssl=self._ssl
        )
        try:
            port = server.sockets[0].getsockname()[1]
            self._endpoint = f"{'https' if self._ssl else 'http'}://127.0.0.1:{port}"
            ready.set()
            await self._stop.wait()
        finally:
            # Stop accepting first, and let connections accepted already get their
            # transport: on Python 3.11 a transport made after server.close() fails half
            # way (Server._attach) and leaks its socket (ResourceWarning: unclosed
            # transport). _accept aborts them, as the proxy is stopping.
            loop = asyncio.get_running_loop()
            for sock in server.sockets:
                loop.remove_reader(sock.fileno())
            for _ in range(3):
                await asyncio.sleep(0)
            server.close()
            tasks = set(self._tasks)
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=_CLOSE_TIMEOUT)
            for transport in self._transports:
                transport.abort()
            self._transports.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), _CLOSE_TIMEOUT)
            # Let the transports' connection_lost callbacks run, which close the sockets
            # (an aborted transport closes its socket in a callback of a later iteration;
            # a loop closed before it runs leaves the socket to the garbage collector,
            # which warns: ResourceWarning, "unclosed transport").
            await asyncio.sleep(0.05)

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._stop is None or self._stop.is_set():
            writer.transport.abort()
            return
        self._track(writer.transport)
        self._control.count("connections")
        task = asyncio.get_running_loop().create_task(self._serve(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = Connection(self, self._control, reader, writer)
        transport = writer.transport
        try:
            await connection.serve()
            # serve() closed the connection; wait until its last bytes are out.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), _CLOSE_TIMEOUT)
        except asyncio.CancelledError:  # the proxy is closing
            transport.abort()
            connection.close_upstream(abort=True)
            raise
        except Exception:
            _log.exception("FaultProxy: unexpected error on a connection")
            connection.close_upstream(abort=True)
        transport.abort()  # no-op once closed
        self._untrack(transport)
