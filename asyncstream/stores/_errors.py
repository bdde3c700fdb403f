"""The one table from third-party errors to asyncstream's, for every path to the store.

Whatever failed (a listing or HEAD on botocore's client, a chunk on the store's own HTTP
client or on botocore's aiohttp request, a local file), :func:`verdict` decides three
things once: the *cause* (a short name that also keys the retry statistics), the
asyncstream exception that says what happened, naming the shard or prefix, and whether a
retry can help.

Retried (transient): ``slowdown`` (503 SlowDown, 429 and other throttling),
``server_error`` (500, 502, 504, InternalError, ServiceUnavailable), ``request_timeout``
(S3's 400 RequestTimeout), ``connection`` (refused, reset, closed mid-response),
``truncated`` (fewer bytes than the range), ``stall`` (no byte for ``Timeouts.stall``
seconds), ``first_byte`` (no response headers within ``Timeouts.first_byte``),
``chunk_timeout`` and ``length`` (a response of another length than asked for).
``open_deadline`` (a request at open that outlasted its whole deadline, retries
included: :mod:`._limits`) is a :class:`TransientFetchError` raised at once.
An :class:`HTTPErrorResponse` (any web server's error answer) is judged by its status as
S3's are; its ``Retry-After`` lengthens the wait before the retry (:mod:`._retry`).

Raised at once (permanent): 400 (other codes), 403 (also bad credentials and expired
tokens; 401, a web server asking for credentials; a local file it may not read), 404
(NoSuchKey, NoSuchBucket; a local file or folder that is not there),
``no_ranges`` (a server that answers a ranged GET with the whole object: it cannot be
read by range, and a retry would only download it whole again), ``range`` (a ``206``
whose ``Content-Range`` is missing or names other bytes than those asked for:
:func:`check_range`), ``changed`` (412, or an
ETag or total size that differs from the listing: the object was replaced since it was
listed, whether or not the server honours ``If-Match``), ``tls`` (a certificate that
does not verify, TLS against a plain port or the reverse), ``clock``
(RequestTimeTooSkewed: this machine's clock is off) and anything that is not an I/O
failure (a bug must not be retried into a hang).
"""

from __future__ import annotations

import asyncio
import re
import ssl
import sys
from dataclasses import dataclass

import botocore.exceptions

from .._exceptions import (
    AccessDeniedError,
    FetchError,
    NotFoundError,
    PermanentFetchError,
    TransientFetchError,
)
from ._origin import Origin, TLSMismatch, tls_failure

__all__ = [
    "ChunkFailure",
    "HTTPErrorResponse",
    "S3ErrorResponse",
    "Verdict",
    "check_range",
    "verdict",
]

_THROTTLE = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded"}
_SERVER = {"InternalError", "ServiceUnavailable", "BadGateway", "GatewayTimeout"}
_NOT_FOUND = {"NoSuchKey", "NoSuchBucket", "NotFound", "404", "NoSuchUpload"}
_CONTENT_RANGE = re.compile(r"^bytes\s+(\d+)-(\d+)/(\d+|\*)$")
_DENIED = {
    "AccessDenied",
    "403",
    "Forbidden",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "AllAccessDisabled",
}


class ChunkFailure(Exception):
    """A failure of one attempt that the fetch code itself detected (short body, stall...).

    Attributes:
        cause: the cause name (see the module docstring); ``"changed"``, ``"no_ranges"``
            and ``"range"`` are permanent, every other is retried.
    """

    def __init__(self, cause: str, message: str) -> None:
        super().__init__(message)
        self.cause = cause


class S3ErrorResponse(Exception):
    """An S3 error response read by the store's own HTTP client.

    Attributes:
        status: the HTTP status.
        code: the ``<Code>`` of its error document (empty if it had none).
        detail: its ``<Message>``, or the reason phrase.
    """

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(f"{code or 'error'} (HTTP {status}): {detail}")
        self.status = status
        self.code = code
        self.detail = detail


class HTTPErrorResponse(S3ErrorResponse):
    """Any web server's error answer (no S3 error document), judged by its status.

    Attributes:
        retry_after: the seconds its ``Retry-After`` asks to wait (``None``: none given).
    """

    def __init__(self, status: int, detail: str, *, retry_after: float | None = None) -> None:
        super().__init__(status, "", detail)
        self.retry_after = retry_after


def check_range(
    status: int, content_range: str | None, offset: int, length: int, size: int | None
) -> None:
    """What every store's ranged GET checks before a byte of its body is used: the answer
    is for exactly the bytes ``offset`` to ``offset + length - 1`` asked for, of an object
    of ``size`` bytes (where known).

    A ``206`` must carry ``Content-Range: bytes FIRST-LAST/TOTAL`` with exactly the start
    and end asked for (a server, or something between, that answers other bytes of the
    right length would otherwise hand them over as the range); a total other than
    ``size`` means the object was replaced. A ``200`` is the whole object (a server that
    ignores ``Range``): right only where the range asked for was the whole object.

    Raises:
        ChunkFailure: ``range`` (permanent) for a missing, malformed or other range;
            ``changed`` for another total; ``no_ranges`` for a ``200`` to a part.
    """
    if status == 200:
        if offset != 0 or (size is not None and length != size):
            raise ChunkFailure(
                "no_ranges", f"asked for bytes {offset}-{offset + length - 1}, got the whole object"
            )
        return
    asked = f"bytes {offset}-{offset + length - 1}"
    answered = (content_range or "").strip()
    match = _CONTENT_RANGE.match(answered)
    if match is None:
        raise ChunkFailure(
            "range",
            f"asked for {asked}, the {status} answer has Content-Range {content_range!r}",
        )
    first, last, total = match.groups()
    if total.isdigit() and size is not None and int(total) != size:
        raise ChunkFailure("changed", f"its size is {total}, it was {size}")
    if int(first) != offset or int(last) != offset + length - 1:
        raise ChunkFailure("range", f"asked for {asked}, the answer is for {answered!r}")


@dataclass(frozen=True)
class Verdict:
    """What a failure was: its cause, the error that says so, and whether to retry."""

    cause: str
    error: FetchError
    retry: bool


def _s3(code: str, status: int | None, detail: str, url: str) -> Verdict:
    what = f"{code or 'error'} (HTTP {status}): {detail or code}"
    if code in _THROTTLE or status == 429 or (status == 503 and code != "NotImplemented"):
        return Verdict("slowdown", TransientFetchError(f"{url}: {what}", url=url), True)
    if code == "RequestTimeout":
        return Verdict("request_timeout", TransientFetchError(f"{url}: {what}", url=url), True)
    if code in _SERVER or (status is not None and status >= 500):
        return Verdict("server_error", TransientFetchError(f"{url}: {what}", url=url), True)
    if code == "PreconditionFailed" or status == 412:
        return _changed(url, "its ETag no longer matches")
    if code in _NOT_FOUND or status == 404:
        return Verdict("not_found", NotFoundError(f"{url}: not found: {what}", url=url), False)
    if code in _DENIED or status in (401, 403):
        message = f"{url}: access denied, check the credentials and permissions: {what}"
        return Verdict("denied", AccessDeniedError(message, url=url), False)
    if code == "RequestTimeTooSkewed":
        message = f"{url}: this machine's clock is too far from the store's: {what}"
        return Verdict("clock", PermanentFetchError(message, url=url), False)
    return Verdict(code or str(status), PermanentFetchError(f"{url}: {what}", url=url), False)


def _changed(url: str, how: str) -> Verdict:
    message = (
        f"{url}: the object changed since it was listed ({how}); a shard replaced "
        "mid-epoch cannot be read consistently: list the dataset again"
    )
    return Verdict("changed", PermanentFetchError(message, url=url), False)


def _no_ranges(url: str, how: str) -> Verdict:
    message = (
        f"{url}: {how}; asyncstream reads shards by byte range: serve them from a server "
        "that honours Range requests (nginx, S3, a CDN, the Hugging Face Hub), or copy "
        "them to local disk"
    )
    return Verdict("no_ranges", PermanentFetchError(message, url=url), False)


def _tls(exc: BaseException, url: str) -> Verdict:
    """A TLS failure met by botocore's clients, said as the store's own client says it."""
    cause, origin = _ssl_cause(exc)
    message = f"TLS failed: {exc}"
    if cause is not None and origin is not None:
        message = str(tls_failure(origin, cause))
    return Verdict("tls", PermanentFetchError(f"{url}: {message}", url=url), False)


def _ssl_cause(exc: BaseException) -> tuple[ssl.SSLError | None, object | None]:
    """The ``ssl`` module's own error behind a wrapped TLS failure (aiohttp's and urllib3's
    subclass it but carry no reason), and the endpoint's origin where the wrappers say."""
    cause: ssl.SSLError | None = None
    origin: object | None = None
    todo: list[object] = [exc]
    seen: set[int] = set()
    while todo:
        current = todo.pop(0)
        if not isinstance(current, BaseException) or id(current) in seen:
            continue
        seen.add(id(current))
        if origin is None and isinstance(current, botocore.exceptions.SSLError):
            endpoint = current.kwargs.get("endpoint_url")
            if isinstance(endpoint, str) and endpoint.startswith(("http://", "https://")):
                origin = Origin.of(endpoint)
        if origin is None and isinstance(current, _aiohttp("ClientConnectorError")):
            host, port = getattr(current, "host", ""), getattr(current, "port", None)
            origin = Origin("https", str(host), int(port or 443))
        if isinstance(current, ssl.SSLError) and type(current).__module__ == "ssl":
            cause = cause or current
        if isinstance(current, botocore.exceptions.BotoCoreError):
            todo.append(current.kwargs.get("error"))
        todo += [
            getattr(current, "certificate_error", None),
            getattr(current, "os_error", None),
            current.__cause__,
            current.__context__,
            *current.args,
        ]
    return cause, origin


def _aiohttp(*names: str) -> tuple[type[BaseException], ...]:
    """aiohttp's exception classes of these names where aiohttp is loaded, else none: an
    aiohttp error can only come from a loaded aiohttp, so this module need not import it
    (a quarter of a second that a stream of local files, or the direct transport, never
    uses)."""
    module = sys.modules.get("aiohttp")
    return () if module is None else tuple(getattr(module, name) for name in names)


def verdict(exc: BaseException, url: str) -> Verdict:
    """Decide what a failure was (see the module docstring).

    Args:
        exc: what the attempt or call raised.
        url: the shard or prefix it was for, named in the error.
    """
    if isinstance(exc, FetchError):
        return Verdict("error", exc, isinstance(exc, TransientFetchError))
    if isinstance(exc, ChunkFailure):
        if exc.cause == "changed":
            return _changed(url, str(exc))
        if exc.cause == "no_ranges":
            return _no_ranges(url, str(exc))
        if exc.cause == "open_deadline":  # the time of a whole call is used up: no retry
            return Verdict(exc.cause, TransientFetchError(f"{url}: {exc}", url=url), False)
        if exc.cause == "range":
            message = f"{url}: the server answered other bytes than the range asked for ({exc})"
            return Verdict("range", PermanentFetchError(message, url=url), False)
        return Verdict(exc.cause, TransientFetchError(f"{url}: {exc}", url=url), True)
    if isinstance(exc, S3ErrorResponse):
        return _s3(exc.code, exc.status, exc.detail, url)
    if isinstance(exc, botocore.exceptions.ClientError):
        err = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code = str(err.get("Code", ""))
        return _s3(code, None if status is None else int(status), err.get("Message", ""), url)
    if isinstance(exc, TLSMismatch):
        return Verdict("tls", PermanentFetchError(f"{url}: {exc}", url=url), False)
    if isinstance(
        exc, botocore.exceptions.NoCredentialsError | botocore.exceptions.PartialCredentialsError
    ):
        message = (
            f"{url}: no usable AWS credentials found (environment, shared files or profile): {exc}"
        )
        return Verdict("denied", AccessDeniedError(message, url=url), False)
    if isinstance(exc, botocore.exceptions.ProfileNotFound):
        return Verdict("denied", AccessDeniedError(f"{url}: {exc}", url=url), False)
    if isinstance(exc, (botocore.exceptions.SSLError, *_aiohttp("ClientSSLError"))):
        return _tls(exc, url)
    if isinstance(exc, botocore.exceptions.ParamValidationError):
        message = f"{url}: invalid request: {exc}"
        return Verdict("invalid", PermanentFetchError(message, url=url), False)
    transient = TransientFetchError(f"{url}: {type(exc).__name__}: {exc}", url=url)
    if isinstance(exc, (botocore.exceptions.IncompleteReadError, *_aiohttp("ClientPayloadError"))):
        return Verdict("truncated", transient, True)
    if isinstance(
        exc,
        (
            botocore.exceptions.HTTPClientError,
            botocore.exceptions.ConnectionError,
            ConnectionError,
            asyncio.IncompleteReadError,
            *_aiohttp("ClientConnectionError"),
        ),
    ):
        return Verdict("connection", transient, True)
    if isinstance(exc, botocore.exceptions.ReadTimeoutError | TimeoutError):
        return Verdict("stall", transient, True)
    if isinstance(exc, FileNotFoundError | NotADirectoryError | IsADirectoryError):
        # A local shard (or its folder) gone since it was listed, as S3's 404: a retry
        # only delays the error by the whole retry budget.
        message = f"{url}: not found: {exc.strerror or exc}"
        return Verdict("not_found", NotFoundError(message, url=url), False)
    if isinstance(exc, PermissionError):
        message = f"{url}: access denied: {exc.strerror or exc}"
        return Verdict("denied", AccessDeniedError(message, url=url), False)
    if isinstance(exc, OSError):  # EIO, a stale NFS handle, a socket's error: may heal
        return Verdict("connection", transient, True)
    # Not an I/O failure we know: never retry it (it may be a bug), but keep its name.
    message = f"{url}: {type(exc).__name__}: {exc}"
    return Verdict(type(exc).__name__, PermanentFetchError(message, url=url), False)
