"""A real HTTP proxy on loopback that injects S3 faults and shapes the network, for tests.

:class:`FaultProxy` sits between an S3 client (botocore, aiobotocore, or anything that
speaks HTTP/1.1 with path-style addressing) and an S3 server such as the embedded moto
server of :class:`asyncstream._local.LocalS3`. Point the client's ``endpoint_url`` at
:attr:`FaultProxy.endpoint_url`; requests are forwarded byte for byte (the ``Host``
header unchanged, so SigV4 signatures stay valid) and response bodies are streamed in
chunks, never buffered whole.

Faults are injected at the HTTP layer, which is where real S3 and real networks fail:

* imperatively, exactly, for the next matching requests::

      with LocalS3() as s3, FaultProxy(s3.endpoint_url) as proxy:
          client = sync_client(S3Options(endpoint_url=proxy.endpoint_url).resolve())
          proxy.inject(Fault.SLOWDOWN, count=2, match="shard-0001.tar")
          proxy.inject("reset", body_fraction=0.25)
          ...
          assert proxy.stats()["slowdown"] == 2

* at seeded rates for ``GET`` requests, with :class:`FaultPlan`::

      plan = FaultPlan(slowdown=0.05, reset=0.01, match=".tar")
      with FaultProxy(s3.endpoint_url, faults=plan, seed=7) as proxy:
          ...

  Every eligible request (a ``GET`` whose target contains ``match``) consumes exactly
  one draw of a ``random.Random(seed)``, so the same seed and the same sequence of
  requests give the same faulted requests. With concurrent clients the sequence is the
  order in which requests reach the proxy.

The kinds of :class:`Fault`, and what they do to a request:

``slowdown``
    ``503 Slow Down`` with S3's XML error body (``<Code>SlowDown</Code>``); the request
    is not forwarded and the connection stays open. botocore and aiobotocore raise
    ``ClientError`` with code ``SlowDown`` (for ``HEAD``, which has no body: ``"503"``).
``internal_error``
    ``500 Internal Server Error`` with ``<Code>InternalError</Code>``; not forwarded.
    ``ClientError`` with code ``InternalError``.
``status``
    Any status (``inject("status", status=403)``) with an S3 XML error body whose code and
    message are S3's for that status unless given; not forwarded. ``ClientError`` (or its
    modelled subclass, such as ``NoSuchKey``) with that code.
``reset``
    The response head and part of the body (``body_fraction``, default half, or
    ``after_bytes``) are forwarded, then the client connection is aborted with a TCP RST.
    As with a real reset, bytes still in flight are lost, so a client that reads slowly
    receives fewer. botocore: ``get_object`` returns, then ``Body.read()`` raises
    ``ResponseStreamingError`` (urllib3's ``ProtocolError`` around
    ``ConnectionResetError``); aiobotocore: ``read()`` raises
    ``aiohttp.ClientPayloadError``.
``truncate``
    The response head (with the full ``Content-Length``) and part of the body are
    forwarded, then the connection is closed cleanly (FIN). botocore: ``Body.read()``
    raises ``ResponseStreamingError`` (``IncompleteRead(N bytes read, M more
    expected)``); aiobotocore: ``aiohttp.ClientPayloadError`` (``ContentLengthError``).
``stall``
    The response head and part of the body are forwarded, then nothing is sent for
    ``seconds`` (default one hour; a stall always ends when the proxy closes), then the
    rest of the response follows. Clients raise ``botocore.exceptions.ReadTimeoutError``
    (aiobotocore: its subclass ``AioReadTimeoutError``) after their ``read_timeout``.
``latency``
    The response starts ``seconds`` later than it would have (default 1 s).

Faults that cut a body short (``reset``, ``truncate``) close the client connection;
clients open a new one for their next request. Every fault is counted in
:meth:`FaultProxy.stats`.

Throttling: ``FaultProxy(..., capacity=N)`` serves at most ``N`` ``GET`` requests at once
and answers any ``GET`` beyond that with ``503 Slow Down`` at once, as S3 does for a
prefix pushed past its request rate; those are counted as ``slowdown`` and ``throttled``.
Unlike a seeded ``slowdown`` rate, how many requests it rejects depends on the client's
concurrency, which is what adaptive concurrency is measured against.

Network shaping: ``FaultProxy(..., profile=NetworkProfile.s3_like())`` adds a random
first-byte latency to every response and paces each connection's response bodies with a
token bucket, so a benchmark on loopback shows why concurrent connections matter.

TLS: ``FaultProxy(..., tls=(cert_pem, key_pem))`` listens with TLS (its ``endpoint_url``
is ``https://``) and still speaks plain HTTP to its upstream, so every fault above works
behind a real TLS listener; :func:`make_test_certificates` makes a test CA and a
certificate for ``127.0.0.1`` and ``localhost`` at run time, and clients verify it with
``S3Options(ca_bundle=certs.ca)``. ``FaultProxy(..., strip_request_headers=("if-match",))``
drops request headers before forwarding: a server that ignores ``If-Match``.

The proxy runs its own event loop in its own thread, so it serves sync tests and code
that runs its own loop alike. :meth:`FaultProxy.close` stops it: every connection is
closed, stalls included, and the thread ends; all its waits are bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import enum
import http
import logging
import math
import random
import socket
import ssl
import struct
import threading
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from types import TracebackType
from typing import Final
from xml.sax.saxutils import escape

from ._testcerts import TestCertificates, make_test_certificates

__all__ = [
    "Fault",
    "FaultPlan",
    "FaultProxy",
    "NetworkProfile",
    "TestCertificates",
    "make_test_certificates",
]

_log = logging.getLogger(__name__)

_START_TIMEOUT: Final = 30.0
_CLOSE_TIMEOUT: Final = 5.0
_HEAD_LIMIT: Final = 64 * 1024
_UPSTREAM_LIMIT: Final = 1024 * 1024
_CHUNK: Final = 1024 * 1024
_HOP_BY_HOP: Final = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "upgrade", "proxy-authorization"}
)


class Fault(enum.StrEnum):
    """The kinds of fault a :class:`FaultProxy` injects.

    Functions that take a kind accept a member or its string value (``"slowdown"``).
    The module docstring describes what each does to a request.
    """

    SLOWDOWN = "slowdown"
    INTERNAL_ERROR = "internal_error"
    STATUS = "status"
    RESET = "reset"
    TRUNCATE = "truncate"
    STALL = "stall"
    LATENCY = "latency"


_PLAN_ORDER: Final = (
    Fault.SLOWDOWN,
    Fault.INTERNAL_ERROR,
    Fault.RESET,
    Fault.TRUNCATE,
    Fault.STALL,
    Fault.LATENCY,
)
_ERROR_KINDS: Final = frozenset({Fault.SLOWDOWN, Fault.INTERNAL_ERROR, Fault.STATUS})
_BODY_KINDS: Final = frozenset({Fault.RESET, Fault.TRUNCATE, Fault.STALL})

# S3's own error codes and messages, for synthetic error responses.
_S3_ERRORS: Final[Mapping[int, tuple[str, str]]] = {
    400: ("InvalidRequest", "Invalid Request"),
    403: ("AccessDenied", "Access Denied"),
    404: ("NoSuchKey", "The specified key does not exist."),
    409: (
        "OperationAborted",
        "A conflicting conditional operation is currently in progress against this "
        "resource. Try again.",
    ),
    412: ("PreconditionFailed", "At least one of the pre-conditions you specified did not hold"),
    416: ("InvalidRange", "The requested range is not satisfiable"),
    500: ("InternalError", "We encountered an internal error. Please try again."),
    501: ("NotImplemented", "A header you provided implies functionality that is not implemented"),
    503: ("SlowDown", "Please reduce your request rate."),
}
_S3_REASONS: Final[Mapping[int, str]] = {503: "Slow Down"}


def _check_rate(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and 0.0 <= value <= 1.0):
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")


def _check_seconds(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and 0.0 <= value < math.inf):
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")


@dataclass(frozen=True, kw_only=True, repr=False)
class FaultPlan:
    """Seeded fault rates for the ``GET`` requests that a :class:`FaultProxy` sees.

    Each eligible request draws one number from the proxy's ``random.Random(seed)`` and
    gets at most one fault; the rates are probabilities per request and must add up to
    at most 1. A fault queued with :meth:`FaultProxy.inject` takes precedence, but the
    request still consumes its draw, so injections never shift the seeded sequence.

    Example::

        FaultPlan(slowdown=0.05, reset=0.01, match=".tar")

    Args:
        slowdown: rate of ``503 SlowDown`` responses.
        internal_error: rate of ``500 InternalError`` responses.
        reset: rate of responses cut short by a TCP RST.
        truncate: rate of responses cut short by a clean close.
        stall: rate of responses that stop for ``stall_seconds``.
        latency: rate of responses delayed by ``latency_seconds``.
        match: only ``GET`` requests whose target (path and query, raw or percent-decoded)
            contains this substring are eligible; ``None`` means every ``GET``.
        latency_seconds: the delay of a ``latency`` fault.
        stall_seconds: the length of a ``stall`` fault.
        body_fraction: the fraction of the response body sent before a ``reset``,
            ``truncate`` or ``stall`` fault fires.
    """

    slowdown: float = 0.0
    internal_error: float = 0.0
    reset: float = 0.0
    truncate: float = 0.0
    stall: float = 0.0
    latency: float = 0.0
    match: str | None = None
    latency_seconds: float = 1.0
    stall_seconds: float = 3600.0
    body_fraction: float = 0.5

    def __post_init__(self) -> None:
        for kind in _PLAN_ORDER:
            _check_rate(kind.value, getattr(self, kind.value))
        if self.total_rate > 1.0 + 1e-9:
            raise ValueError(f"the fault rates add up to {self.total_rate:g}, more than 1")
        if self.match is not None and not isinstance(self.match, str):
            raise TypeError(f"match must be a string or None, got {self.match!r}")
        _check_seconds("latency_seconds", self.latency_seconds)
        _check_seconds("stall_seconds", self.stall_seconds)
        _check_rate("body_fraction", self.body_fraction)

    def __repr__(self) -> str:
        parts = [
            f"{f.name}={getattr(self, f.name)!r}"
            for f in fields(self)
            if getattr(self, f.name) != f.default
        ]
        return f"FaultPlan({', '.join(parts)})"

    @property
    def total_rate(self) -> float:
        """The probability that an eligible request gets some fault."""
        return float(sum(getattr(self, kind.value) for kind in _PLAN_ORDER))

    def draw(self, rng: random.Random) -> Fault | None:
        """Draw the fault of one request; consumes exactly one ``rng.random()``.

        Args:
            rng: the random source.

        Returns:
            The fault kind, or ``None`` for a request that passes unharmed.
        """
        u = rng.random()
        edge = 0.0
        for kind in _PLAN_ORDER:
            edge += getattr(self, kind.value)
            if u < edge:
                return kind
        return None


@dataclass(frozen=True, kw_only=True)
class NetworkProfile:
    """How the network between the proxy's clients and the S3 server should behave.

    Args:
        first_byte_latency: ``(low, high)`` seconds; every response starts a uniformly
            drawn time in this range later than the server answered.
        bandwidth_bytes_per_s: the rate each client connection's response bodies are paced
            to (a token bucket), or ``None`` for no limit. Request bodies are not paced.
    """

    first_byte_latency: tuple[float, float] = (0.0, 0.0)
    bandwidth_bytes_per_s: float | None = None

    def __post_init__(self) -> None:
        low, high = self.first_byte_latency
        _check_seconds("first_byte_latency[0]", low)
        _check_seconds("first_byte_latency[1]", high)
        if high < low:
            raise ValueError(f"first_byte_latency must be (low, high), got {(low, high)!r}")
        rate = self.bandwidth_bytes_per_s
        if rate is not None and not (isinstance(rate, int | float) and 0 < rate < math.inf):
            raise ValueError(f"bandwidth_bytes_per_s must be > 0 or None, got {rate!r}")

    @classmethod
    def s3_like(cls) -> NetworkProfile:
        """Roughly S3 seen from EC2 in the same region: 20-50 ms to first byte, 90 MB/s."""
        return cls(first_byte_latency=(0.020, 0.050), bandwidth_bytes_per_s=90e6)

    @classmethod
    def loopback(cls) -> NetworkProfile:
        """No shaping at all (the default)."""
        return cls()

    @property
    def shaped(self) -> bool:
        """Whether this profile changes anything."""
        return self.first_byte_latency[1] > 0 or self.bandwidth_bytes_per_s is not None


# --------------------------------------------------------------------------- internals


@dataclass(frozen=True)
class _Action:
    kind: Fault
    seconds: float = 0.0
    body_fraction: float = 0.5
    after_bytes: int | None = None
    status: int = 500
    code: str = ""
    message: str = ""


@dataclass
class _Injection:
    action: _Action
    remaining: int
    match: str | None
    method: str | None


class _Abort(Exception):
    """Ends a client connection: with a TCP RST (``rst``) or a clean close."""

    def __init__(self, *, rst: bool) -> None:
        super().__init__("rst" if rst else "fin")
        self.rst = rst


class _BadMessage(Exception):
    """A message that does not parse; ``status`` is what to answer the client."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status


def _matches(match: str | None, target: str) -> bool:
    return match is None or match in target or match in urllib.parse.unquote(target)


def _header(headers: list[tuple[str, str]], name: str) -> str | None:
    value = None
    for key, val in headers:
        if key.lower() == name:
            value = val
    return value


def _connection_tokens(headers: list[tuple[str, str]]) -> set[str]:
    tokens: set[str] = set()
    for key, val in headers:
        if key.lower() == "connection":
            tokens.update(t.strip().lower() for t in val.split(",") if t.strip())
    return tokens


def _parse_headers(lines: list[bytes]) -> list[tuple[str, str]]:
    headers = []
    for raw in lines:
        line = raw.decode("latin-1")
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise _BadMessage(400, f"malformed header line {line!r}")
        headers.append((name, value.strip()))
    return headers


def _split_head(head: bytes) -> tuple[str, list[tuple[str, str]]]:
    lines = head.lstrip(b"\r\n").split(b"\r\n")
    while lines and lines[-1] == b"":
        lines.pop()
    if not lines:
        raise _BadMessage(400, "empty message head")
    return lines[0].decode("latin-1"), _parse_headers(lines[1:])


@dataclass
class _Request:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]
    length: int | None  # body length; None: chunked
    keep_alive: bool
    expect_continue: bool

    @classmethod
    def parse(cls, head: bytes) -> _Request:
        start, headers = _split_head(head)
        parts = start.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise _BadMessage(400, f"malformed request line {start!r}")
        method, target, version = parts
        if target.startswith(("http://", "https://")):  # absolute form: keep path and query
            split = urllib.parse.urlsplit(target)
            target = urllib.parse.urlunsplit(("", "", split.path or "/", split.query, ""))
        tokens = _connection_tokens(headers)
        keep_alive = "close" not in tokens if version == "HTTP/1.1" else "keep-alive" in tokens
        expect = (_header(headers, "expect") or "").lower() == "100-continue"
        transfer = _header(headers, "transfer-encoding")
        length: int | None
        if transfer is not None:
            if transfer.lower().split(",")[-1].strip() != "chunked":
                raise _BadMessage(501, f"unsupported Transfer-Encoding {transfer!r}")
            length = None
            headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
        else:
            declared = _header(headers, "content-length")
            try:
                length = int(declared) if declared is not None else 0
            except ValueError:
                raise _BadMessage(400, f"bad Content-Length {declared!r}") from None
            if length < 0:
                raise _BadMessage(400, f"bad Content-Length {declared!r}")
        return cls(method, target, version, headers, length, keep_alive, expect)

    def upstream_head(self, strip: frozenset[str] = frozenset()) -> bytes:
        drop = _HOP_BY_HOP | _connection_tokens(self.headers) | strip
        if self.expect_continue:
            drop = drop | {"expect"}
        lines = [f"{self.method} {self.target} HTTP/1.1"]
        lines += [f"{k}: {v}" for k, v in self.headers if k.lower() not in drop]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


_LENGTH, _CHUNKED, _UNTIL_CLOSE = "length", "chunked", "until-close"


@dataclass
class _Response:
    status: int
    reason: str
    headers: list[tuple[str, str]]
    framing: str
    length: int | None
    reusable: bool

    @classmethod
    def parse(cls, head: bytes, method: str) -> _Response:
        start, headers = _split_head(head)
        version, _, rest = start.partition(" ")
        code, _, reason = rest.partition(" ")
        if not version.startswith("HTTP/1.") or not code.isdigit():
            raise _BadMessage(502, f"malformed status line {start!r}")
        status = int(code)
        transfer = _header(headers, "transfer-encoding")
        declared = _header(headers, "content-length")
        length: int | None = None
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            framing, length = _LENGTH, 0
        elif transfer is not None:
            framing = (
                _CHUNKED if transfer.lower().split(",")[-1].strip() == "chunked" else _UNTIL_CLOSE
            )
        elif declared is not None:
            try:
                framing, length = _LENGTH, int(declared)
            except ValueError:
                raise _BadMessage(502, f"bad Content-Length {declared!r} upstream") from None
        else:
            framing = _UNTIL_CLOSE
        tokens = _connection_tokens(headers)
        reusable = (
            framing != _UNTIL_CLOSE
            and "close" not in tokens
            and (version == "HTTP/1.1" or "keep-alive" in tokens)
        )
        return cls(status, reason, headers, framing, length, reusable)

    def client_head(self, *, keep_alive: bool) -> bytes:
        drop = _HOP_BY_HOP | _connection_tokens(self.headers)
        lines = [f"HTTP/1.1 {self.status} {self.reason}".rstrip()]
        lines += [f"{k}: {v}" for k, v in self.headers if k.lower() not in drop]
        if not keep_alive:
            lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _error_response(
    status: int, code: str, message: str, *, request_id: str, head_only: bool, keep_alive: bool
) -> bytes:
    host_id = f"{request_id}/faultproxy"
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{escape(code)}</Code><Message>{escape(message)}</Message>"
        f"<RequestId>{request_id}</RequestId><HostId>{host_id}</HostId></Error>"
    ).encode()
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = "Error"
    reason = _S3_REASONS.get(status, phrase)
    lines = [
        f"HTTP/1.1 {status} {reason}",
        f"x-amz-request-id: {request_id}",
        f"x-amz-id-2: {host_id}",
        "Content-Type: application/xml",
        f"Content-Length: {0 if head_only else len(body)}",
        f"Date: {email.utils.formatdate(usegmt=True)}",
        "Server: AmazonS3",
    ]
    if not keep_alive:
        lines.append("Connection: close")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + body


def _plain_response(status: int, text: str) -> bytes:
    body = text.encode()
    phrase = http.HTTPStatus(status).phrase
    head = (
        f"HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


class _Pacer:
    """A token bucket: ``take(n)`` sleeps until ``n`` more bytes fit the rate."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        # One slice is ~2 ms of traffic: few wake-ups, smooth enough for any test.
        self.slice = int(min(max(rate * 0.002, 16 * 1024), 1024 * 1024))
        self.capacity = float(self.slice)
        self.tokens = self.capacity
        self.stamp = asyncio.get_running_loop().time()

    async def take(self, n: int) -> None:
        now = asyncio.get_running_loop().time()
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        self.tokens -= n
        if self.tokens < 0:
            await asyncio.sleep(-self.tokens / self.rate)


def _set_rst(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


class _Connection:
    """One client connection and the upstream connection that serves it."""

    def __init__(
        self, proxy: FaultProxy, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.proxy = proxy
        self.reader = reader
        self.writer = writer
        rate = proxy.profile.bandwidth_bytes_per_s
        self.pacer = _Pacer(rate) if rate is not None else None
        self.up_reader: asyncio.StreamReader | None = None
        self.up_writer: asyncio.StreamWriter | None = None
        # State of the body being forwarded.
        self.fault: _Action | None = None
        self.cut: int | None = None
        self.sent = 0

    async def serve(self) -> None:
        try:
            while True:
                try:
                    head = await self.reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return  # the client closed the connection
                except asyncio.LimitOverrunError:
                    await self._send_raw(_plain_response(431, "request head too large\n"))
                    return
                try:
                    request = _Request.parse(head)
                except _BadMessage as exc:
                    await self._send_raw(_plain_response(exc.status, f"{exc}\n"))
                    return
                if not await self._exchange(request):
                    return
        except _Abort as abort:
            if abort.rst:
                _set_rst(self.writer)
                self.writer.transport.abort()
            self._close_upstream(abort=True)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, _BadMessage) as e:
            _log.debug("FaultProxy: connection ended: %r", e)
            self.writer.transport.abort()
            self._close_upstream(abort=True)
        finally:
            self.writer.close()
            self._close_upstream(abort=False)

    async def _send_raw(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def _exchange(self, request: _Request) -> bool:
        """Serve one request; returns whether the client connection stays open."""
        action, delay, request_id = self.proxy._decide(request)
        keep_alive = request.keep_alive
        if action is not None and action.kind in _ERROR_KINDS:
            self.proxy._log_request(request, action.status)
            if request.expect_continue:
                keep_alive = False  # the client waits to send its body; never read it
            else:
                await self._copy_request_body(request, None)
            if delay > 0:
                await asyncio.sleep(delay)
            await self._send_raw(
                _error_response(
                    action.status,
                    action.code,
                    action.message,
                    request_id=request_id,
                    head_only=request.method == "HEAD",
                    keep_alive=keep_alive,
                )
            )
            return keep_alive

        counted = request.method == "GET"
        if counted:
            self.proxy._count_active(1)
        try:
            return await self._forward(request, action, delay, keep_alive)
        finally:
            if counted:
                self.proxy._count_active(-1)

    async def _forward(
        self, request: _Request, action: _Action | None, delay: float, keep_alive: bool
    ) -> bool:
        if request.expect_continue and request.version == "HTTP/1.1":
            await self._send_raw(b"HTTP/1.1 100 Continue\r\n\r\n")
        try:
            response = await self._roundtrip(request)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            _log.debug("FaultProxy: upstream failed: %r", exc)
            self.proxy._log_request(request, 502)
            self._close_upstream(abort=True)
            await self._send_raw(_plain_response(502, f"upstream failed: {exc!r}\n"))
            return False
        except _BadMessage as exc:
            self.proxy._log_request(request, exc.status)
            self._close_upstream(abort=True)
            await self._send_raw(_plain_response(exc.status, f"{exc}\n"))
            return False
        self.proxy._log_request(request, response.status)
        if action is not None and action.kind is Fault.LATENCY:
            delay += action.seconds
        if delay > 0:
            await asyncio.sleep(delay)
        keep_alive = keep_alive and response.framing != _UNTIL_CLOSE
        await self._send_raw(response.client_head(keep_alive=keep_alive))
        await self._forward_body(response, action)
        if not response.reusable:
            self._close_upstream(abort=False)
        return keep_alive

    # ---------------------------------------------------------------- upstream side

    async def _roundtrip(self, request: _Request) -> _Response:
        """Send the request upstream and read the response head."""
        retry = request.length == 0  # nothing consumed from the client: safe to resend
        while True:
            reused, up_reader, up_writer = await self._open_upstream()
            try:
                up_writer.write(request.upstream_head(self.proxy.strip_request_headers))
                await up_writer.drain()
                await self._copy_request_body(request, up_writer)
                self.proxy._count("forwarded")
                while True:
                    head = await up_reader.readuntil(b"\r\n\r\n")
                    response = _Response.parse(head, request.method)
                    if not 100 <= response.status < 200 or response.status == 101:
                        return response
            except (OSError, asyncio.IncompleteReadError) as exc:
                partial = isinstance(exc, asyncio.IncompleteReadError) and exc.partial
                if not (reused and retry and not partial):
                    raise
                _log.debug("FaultProxy: stale upstream connection, reconnecting: %r", exc)
                self._close_upstream(abort=True)
                retry = False

    async def _open_upstream(self) -> tuple[bool, asyncio.StreamReader, asyncio.StreamWriter]:
        """The upstream connection, opened if need be, and whether it was reused."""
        reader, writer = self.up_reader, self.up_writer
        if reader is not None and writer is not None and not reader.at_eof():
            return True, reader, writer
        self._close_upstream(abort=True)
        proxy = self.proxy
        reader, writer = await asyncio.open_connection(
            proxy._up_host, proxy._up_port, limit=_UPSTREAM_LIMIT
        )
        proxy._track(writer.transport)
        self.up_reader, self.up_writer = reader, writer
        return False, reader, writer

    def _close_upstream(self, *, abort: bool) -> None:
        writer, self.up_writer, self.up_reader = self.up_writer, None, None
        if writer is not None:
            if abort:
                writer.transport.abort()
            else:
                writer.close()
            self.proxy._untrack(writer.transport)

    async def _copy_request_body(
        self, request: _Request, sink: asyncio.StreamWriter | None
    ) -> None:
        """Copy (or, with no sink, discard) the request body, keeping its framing."""
        reader = self.reader
        if request.length is not None:
            remaining = request.length
            while remaining:
                data = await reader.read(min(remaining, _CHUNK))
                if not data:
                    raise asyncio.IncompleteReadError(b"", remaining)
                remaining -= len(data)
                if sink is not None:
                    sink.write(data)
                    await sink.drain()
            return
        while True:  # chunked
            line = await reader.readuntil(b"\r\n")
            size = _chunk_size(line)
            parts = [line]
            if size == 0:
                while True:
                    trailer = await reader.readuntil(b"\r\n")
                    parts.append(trailer)
                    if trailer == b"\r\n":
                        break
            if sink is not None:
                sink.write(b"".join(parts))
            if size == 0:
                if sink is not None:
                    await sink.drain()
                return
            remaining = size
            while remaining:
                data = await reader.read(min(remaining, _CHUNK))
                if not data:
                    raise asyncio.IncompleteReadError(b"", remaining)
                remaining -= len(data)
                if sink is not None:
                    sink.write(data)
                    await sink.drain()
            crlf = await reader.readexactly(2)
            if crlf != b"\r\n":
                raise _BadMessage(400, "malformed chunked body")
            if sink is not None:
                sink.write(crlf)

    # ---------------------------------------------------------------- response body

    async def _forward_body(self, response: _Response, action: _Action | None) -> None:
        self.sent = 0
        self.fault = action if action is not None and action.kind in _BODY_KINDS else None
        self.cut = None
        if self.fault is not None:
            if self.fault.after_bytes is not None:
                self.cut = self.fault.after_bytes
            elif response.length is not None:
                self.cut = int(response.length * self.fault.body_fraction)
            else:
                self.cut = 0
            if self.cut == 0:
                await self._fire()
        reader = self.up_reader
        assert reader is not None
        if response.framing == _LENGTH:
            assert response.length is not None
            await self._copy_payload(reader, response.length)
        elif response.framing == _CHUNKED:
            while True:
                line = await reader.readuntil(b"\r\n")
                size = _chunk_size(line)
                await self._write(line)
                if size == 0:
                    while True:
                        trailer = await reader.readuntil(b"\r\n")
                        await self._write(trailer)
                        if trailer == b"\r\n":
                            break
                    break
                await self._copy_payload(reader, size)
                await self._write(await reader.readexactly(2))
        else:
            while data := await reader.read(_CHUNK):
                await self._payload(data)
        if self.fault is not None:
            await self._fire()

    async def _copy_payload(self, reader: asyncio.StreamReader, size: int) -> None:
        remaining = size
        while remaining:
            data = await reader.read(min(remaining, _CHUNK))
            if not data:
                raise asyncio.IncompleteReadError(b"", remaining)
            remaining -= len(data)
            await self._payload(data)

    async def _payload(self, data: bytes) -> None:
        if self.fault is not None and self.cut is not None and self.sent + len(data) >= self.cut:
            head, data = data[: self.cut - self.sent], data[self.cut - self.sent :]
            await self._write(head)
            self.sent += len(head)
            self.proxy._count("bytes_forwarded", len(head))
            await self._fire()
        if data:
            await self._write(data)
            self.sent += len(data)
            self.proxy._count("bytes_forwarded", len(data))

    async def _write(self, data: bytes) -> None:
        writer = self.writer
        if self.pacer is None:
            writer.write(data)
            await writer.drain()
            return
        step = self.pacer.slice
        for start in range(0, len(data), step):
            piece = data[start : start + step]
            await self.pacer.take(len(piece))
            writer.write(piece)
            await writer.drain()

    async def _fire(self) -> None:
        """Act out the pending body fault, now that its share of the body is out."""
        fault, self.fault = self.fault, None
        assert fault is not None
        # Push everything buffered into the kernel first, so the client gets those bytes.
        # (Over TLS, as far as the TLS layer: asyncio's SSL transport pauses at a buffer
        # size >= its high-water mark, so a mark of 0 would pause it for good.)
        transport = self.writer.transport
        tls = self.writer.get_extra_info("sslcontext") is not None
        transport.set_write_buffer_limits(high=1 if tls else 0, low=0)
        await self.writer.drain()
        transport.set_write_buffer_limits()
        if fault.kind is Fault.RESET:
            raise _Abort(rst=True)
        if fault.kind is Fault.TRUNCATE:
            raise _Abort(rst=False)
        await asyncio.sleep(fault.seconds)  # a stall; cancelled when the proxy closes


def _chunk_size(line: bytes) -> int:
    try:
        size = int(line.split(b";", 1)[0].strip(), 16)
    except ValueError:
        raise _BadMessage(400, f"malformed chunk size line {line[:40]!r}") from None
    if size < 0:
        raise _BadMessage(400, f"malformed chunk size line {line[:40]!r}")
    return size


# --------------------------------------------------------------------------- the proxy


class FaultProxy:
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
        self.capacity = capacity
        self.tls = tls
        self.strip_request_headers = frozenset(h.lower() for h in strip_request_headers)
        self._ssl: ssl.SSLContext | None = None
        if tls is not None:
            cert, key = tls
            self._ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self._ssl.load_cert_chain(cert, key)
        self._active_gets = 0
        self._up_host = split.hostname
        self._up_port = split.port or 80
        self._plan = faults if faults is not None else FaultPlan()
        self._profile = profile if profile is not None else NetworkProfile()
        self.seed = seed
        self._fault_rng = random.Random(seed)
        self._profile_rng = random.Random(f"profile-{seed}")
        self._lock = threading.Lock()
        self._injections: list[_Injection] = []
        self._counts = dict.fromkeys(_STAT_KEYS, 0)
        self._answered: list[tuple[str, str, int]] = []
        self._request_ids = 0
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

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

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
        if seconds is not None and fault not in (Fault.LATENCY, Fault.STALL):
            raise ValueError(f"seconds applies to latency and stall, not {fault.value}")
        if (body_fraction is not None or after_bytes is not None) and fault not in _BODY_KINDS:
            raise ValueError(
                f"body_fraction/after_bytes apply to reset, truncate and stall, not {fault.value}"
            )
        if body_fraction is not None and after_bytes is not None:
            raise ValueError("give body_fraction or after_bytes, not both")
        if fault is not Fault.STATUS and (status, code, message) != (None, None, None):
            raise ValueError("status, code and message apply to the status fault only")
        if fault is Fault.STATUS and (
            status is None or isinstance(status, bool) or not 400 <= status <= 599
        ):
            raise ValueError(f"the status fault needs status=400..599, got {status!r}")
        if seconds is not None:
            _check_seconds("seconds", seconds)
        if body_fraction is not None:
            _check_rate("body_fraction", body_fraction)
        if after_bytes is not None and (isinstance(after_bytes, bool) or after_bytes < 0):
            raise ValueError(f"after_bytes must be an int >= 0, got {after_bytes!r}")
        if fault is Fault.STATUS:
            assert status is not None
            default_code, default_message = _default_error(status)
            action = _Action(
                fault, status=status, code=code or default_code, message=message or default_message
            )
        else:
            plan = FaultPlan()
            action = self._action(
                fault,
                latency_seconds=seconds if seconds is not None else plan.latency_seconds,
                stall_seconds=seconds if seconds is not None else plan.stall_seconds,
                body_fraction=body_fraction if body_fraction is not None else plan.body_fraction,
                after_bytes=after_bytes,
            )
        injection = _Injection(action, count, match, method.upper() if method else None)
        with self._lock:
            if self._closed:
                raise RuntimeError("this FaultProxy was closed")
            self._injections.append(injection)

    def clear(self) -> None:
        """Drop every fault queued with :meth:`inject` that has not fired yet."""
        with self._lock:
            self._injections.clear()

    def pending(self) -> int:
        """How many injected faults have not fired yet (summed over their counts)."""
        with self._lock:
            return sum(i.remaining for i in self._injections)

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
        with self._lock:
            return dict(self._counts)

    def requests(self) -> list[tuple[str, str, int]]:
        """Every request answered so far, in order: ``(method, path, status)``.

        ``path`` is the percent-decoded path of the target, without the query
        (``/bucket/train/shard-0001.tar``), so requests can be counted per object; the
        status is that of the response head sent (an injected error's, or the server's:
        a body cut short by a fault still shows 200 or 206). Safe from any thread. The log
        grows with the requests for the proxy's life: it is meant for tests.
        """
        with self._lock:
            return list(self._answered)

    # ---------------------------------------------------------------- internals

    def _log_request(self, request: _Request, status: int) -> None:
        path = urllib.parse.unquote(urllib.parse.urlsplit(request.target).path)
        with self._lock:
            self._answered.append((request.method, path, status))

    @staticmethod
    def _action(
        kind: Fault,
        *,
        latency_seconds: float,
        stall_seconds: float,
        body_fraction: float,
        after_bytes: int | None,
    ) -> _Action:
        if kind is Fault.SLOWDOWN or kind is Fault.INTERNAL_ERROR:
            status = 503 if kind is Fault.SLOWDOWN else 500
            code, message = _S3_ERRORS[status]
            return _Action(kind, status=status, code=code, message=message)
        if kind is Fault.LATENCY:
            return _Action(kind, seconds=latency_seconds)
        seconds = stall_seconds if kind is Fault.STALL else 0.0
        return _Action(kind, seconds=seconds, body_fraction=body_fraction, after_bytes=after_bytes)

    def _decide(self, request: _Request) -> tuple[_Action | None, float, str]:
        """The fault for a request, its first-byte delay and a request id (loop thread)."""
        plan = self._plan
        low, high = self._profile.first_byte_latency
        with self._lock:
            self._counts["requests"] += 1
            self._request_ids += 1
            request_id = f"FAULTPROXY{self._request_ids:08X}"
            drawn = None
            if (
                plan.total_rate > 0
                and request.method == "GET"
                and _matches(plan.match, request.target)
            ):
                drawn = plan.draw(self._fault_rng)
            action = None
            for injection in self._injections:
                if _matches(injection.match, request.target) and injection.method in (
                    None,
                    request.method,
                ):
                    action = injection.action
                    injection.remaining -= 1
                    if injection.remaining == 0:
                        self._injections.remove(injection)
                    break
            throttled = (
                action is None
                and self.capacity is not None
                and request.method == "GET"
                and self._active_gets >= self.capacity
            )
            if throttled:
                self._counts["throttled"] += 1
                action = self._action(
                    Fault.SLOWDOWN,
                    latency_seconds=0.0,
                    stall_seconds=0.0,
                    body_fraction=0.0,
                    after_bytes=None,
                )
            elif action is None and drawn is not None:
                action = self._action(
                    drawn,
                    latency_seconds=plan.latency_seconds,
                    stall_seconds=plan.stall_seconds,
                    body_fraction=plan.body_fraction,
                    after_bytes=None,
                )
            if action is not None:
                self._counts[action.kind.value] += 1
            delay = self._profile_rng.uniform(low, high) if high > 0 else 0.0
        return action, delay, request_id

    def _count_active(self, n: int) -> None:
        with self._lock:
            self._active_gets += n

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._counts[key] += n

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
        self._count("connections")
        task = asyncio.get_running_loop().create_task(self._serve(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = _Connection(self, reader, writer)
        transport = writer.transport
        try:
            await connection.serve()
            # serve() closed the connection; wait until its last bytes are out.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), _CLOSE_TIMEOUT)
        except asyncio.CancelledError:  # the proxy is closing
            transport.abort()
            connection._close_upstream(abort=True)
            raise
        except Exception:
            _log.exception("FaultProxy: unexpected error on a connection")
            connection._close_upstream(abort=True)
        transport.abort()  # no-op once closed
        self._untrack(transport)


_STAT_KEYS: Final = (
    *(kind.value for kind in Fault),
    "requests",
    "forwarded",
    "bytes_forwarded",
    "connections",
    "throttled",
)


def _default_error(status: int) -> tuple[str, str]:
    if status in _S3_ERRORS:
        return _S3_ERRORS[status]
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        return str(status), f"HTTP {status}"
    return "".join(phrase.split()), phrase
