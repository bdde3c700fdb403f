"""The HTTP/1.1 that a :class:`~asyncstream.testing.FaultProxy` speaks: parsing request and
response heads (framing, keep-alive, hop-by-hop headers), rewriting them for the other
side, and the synthetic responses it answers itself (S3 XML errors, plain errors)."""

from __future__ import annotations

import email.utils
import http
import urllib.parse
from dataclasses import dataclass
from typing import Final
from xml.sax.saxutils import escape

from ._faults import S3_REASONS

__all__ = [
    "CHUNKED",
    "LENGTH",
    "UNTIL_CLOSE",
    "BadMessage",
    "Request",
    "Response",
    "chunk_size",
    "error_response",
    "matches",
    "plain_response",
]

_HOP_BY_HOP: Final = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "upgrade", "proxy-authorization"}
)


class BadMessage(Exception):
    """A message that does not parse; ``status`` is what to answer the client."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status


def matches(match: str | None, target: str) -> bool:
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
            raise BadMessage(400, f"malformed header line {line!r}")
        headers.append((name, value.strip()))
    return headers


def _split_head(head: bytes) -> tuple[str, list[tuple[str, str]]]:
    lines = head.lstrip(b"\r\n").split(b"\r\n")
    while lines and lines[-1] == b"":
        lines.pop()
    if not lines:
        raise BadMessage(400, "empty message head")
    return lines[0].decode("latin-1"), _parse_headers(lines[1:])


@dataclass
class Request:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]
    length: int | None  # body length; None: chunked
    keep_alive: bool
    expect_continue: bool

    @classmethod
    def parse(cls, head: bytes) -> Request:
        start, headers = _split_head(head)
        parts = start.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise BadMessage(400, f"malformed request line {start!r}")
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
                raise BadMessage(501, f"unsupported Transfer-Encoding {transfer!r}")
            length = None
            headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
        else:
            declared = _header(headers, "content-length")
            try:
                length = int(declared) if declared is not None else 0
            except ValueError:
                raise BadMessage(400, f"bad Content-Length {declared!r}") from None
            if length < 0:
                raise BadMessage(400, f"bad Content-Length {declared!r}")
        return cls(method, target, version, headers, length, keep_alive, expect)

    def upstream_head(self, strip: frozenset[str] = frozenset()) -> bytes:
        drop = _HOP_BY_HOP | _connection_tokens(self.headers) | strip
        if self.expect_continue:
            drop = drop | {"expect"}
        lines = [f"{self.method} {self.target} HTTP/1.1"]
        lines += [f"{k}: {v}" for k, v in self.headers if k.lower() not in drop]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


LENGTH, CHUNKED, UNTIL_CLOSE = "length", "chunked", "until-close"


@dataclass
class Response:
    status: int
    reason: str
    headers: list[tuple[str, str]]
    framing: str
    length: int | None
    reusable: bool

    @classmethod
    def parse(cls, head: bytes, method: str) -> Response:
        start, headers = _split_head(head)
        version, _, rest = start.partition(" ")
        code, _, reason = rest.partition(" ")
        if not version.startswith("HTTP/1.") or not code.isdigit():
            raise BadMessage(502, f"malformed status line {start!r}")
        status = int(code)
        transfer = _header(headers, "transfer-encoding")
        declared = _header(headers, "content-length")
        length: int | None = None
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            framing, length = LENGTH, 0
        elif transfer is not None:
            framing = (
                CHUNKED if transfer.lower().split(",")[-1].strip() == "chunked" else UNTIL_CLOSE
            )
        elif declared is not None:
            try:
                framing, length = LENGTH, int(declared)
            except ValueError:
                raise BadMessage(502, f"bad Content-Length {declared!r} upstream") from None
        else:
            framing = UNTIL_CLOSE
        tokens = _connection_tokens(headers)
        reusable = (
            framing != UNTIL_CLOSE
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


def error_response(
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
    reason = S3_REASONS.get(status, phrase)
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


def plain_response(status: int, text: str) -> bytes:
    body = text.encode()
    phrase = http.HTTPStatus(status).phrase
    head = (
        f"HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


def chunk_size(line: bytes) -> int:
    try:
        size = int(line.split(b";", 1)[0].strip(), 16)
    except ValueError:
        raise BadMessage(400, f"malformed chunk size line {line[:40]!r}") from None
    if size < 0:
        raise BadMessage(400, f"malformed chunk size line {line[:40]!r}")
    return size


# --------------------------------------------------------------------------- the proxy
