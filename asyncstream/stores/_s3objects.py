"""The S3 store's blocking half: listing, HEAD and whole small objects, at open.

These run in the consumer's process, on a path-style endpoint as the store's own requests
(:mod:`._s3rest`: no botocore client to make), elsewhere on botocore's synchronous client
(AWS's own endpoints, virtual hosts, proxies, and the uploads of ``pack``), with botocore's
own retries off: :func:`~._retry.retrying_sync` retries them under the same one table as the
chunks (:mod:`._errors`), so a certificate that does not verify, a 403 or a 404 is
raised at once instead of after botocore's attempts, and throttling and 5xx are retried.

A TLS mismatch is told apart from a network fault once per endpoint, with the probes of
the store's own HTTP client (:mod:`._http`), each bounded to about a second: before the
first request to an ``https://`` endpoint, a handshake (a plain-HTTP port that waits for
more bytes would otherwise hold botocore for its whole connect and read timeouts); and
after the first connection failure on an ``http://`` endpoint, a TLS probe of the port
(a TLS server resets or closes a plain request, which looks like a network fault).

Every request at open (a ``HEAD``, a listing page, the ``GET`` of a small object), its
retries included, ends within ``S3Options.open_deadline`` seconds (:mod:`._deadline`):
botocore's ``before-send`` event hands it to :class:`_Sender`, which sends it as botocore's
own sender would, on connections that the deadline shuts (except through an HTTP proxy,
where botocore sends it, bounded by its per-read timeouts only). Uploads are not bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, TypeVar
from urllib.parse import urlsplit

import botocore.exceptions
import urllib3
from botocore.awsrequest import AWSRequest, AWSResponse

from .._exceptions import FetchError, NotFoundError
from ..shards._urls import Shard
from ._deadline import attempt_under, bounded, current, watched
from ._errors import verdict
from ._http import ConnectionPool
from ._limits import MAX_OPEN_BYTES, Pages, too_large
from ._origin import Origin
from ._retry import RetryPolicy, Timeouts, retrying_sync
from ._s3 import S3Options, fetch_error_from, parse_s3_url, ssl_context, sync_client
from ._s3rest import Listed, S3Rest

__all__ = ["S3Objects"]

T = TypeVar("T")
_PAGE = 1000  # keys per listing page (S3's most)
_ERROR_BYTES = 64 << 10  # the most of an error's document read


class S3Objects:
    """Listing, HEAD and whole objects on an S3-compatible endpoint (module docstring).

    Args:
        options: how to reach the store (resolved).
    """

    def __init__(self, options: S3Options) -> None:
        self.options = options
        self._client: Any = None
        self._rest: S3Rest | None = None
        self._policy = RetryPolicy(max_attempts=options.metadata_attempts, base_delay=0.1)
        self._checked: set[Origin] = set()
        self._lock = threading.Lock()
        self._client_lock = threading.Lock()
        self._sender_lock = threading.Lock()
        self._sender: _Sender | None = None

    @property
    def client(self) -> Any:
        """The botocore client (its retries off: ours run), made on first use: one, even
        when the first requests come from several threads at once."""
        if self._client is None:
            with self._client_lock:
                if self._client is None:
                    client = sync_client(replace(self.options, metadata_attempts=1))
                    client.meta.events.register("before-send.s3", self.sender)
                    self._client = client
        return self._client

    @property
    def sender(self) -> _Sender:
        """The deadline-bounded sender of the requests at open, made on first use."""
        if self._sender is None:
            with self._sender_lock:  # not the client's: its making asks for the sender
                if self._sender is None:
                    self._sender = _Sender(self.options)
        return self._sender

    def rest(self, bucket: str) -> S3Rest | None:
        """The store's own requests for ``bucket`` (:mod:`._s3rest`), where its objects'
        URLs follow from the options (a path-style endpoint) and no proxy is in the way;
        else None: botocore's client."""
        endpoint = self.options.endpoint_url
        if endpoint is None or self.options.path_base(bucket) is None:
            return None
        if self._rest is None:
            if _proxied(Origin.of(endpoint)):
                return None
            self._rest = S3Rest(self.options, self.sender.send)
        return self._rest

    def close(self) -> None:
        """Close the connections of the requests at open (botocore's own are its)."""
        if self._sender is not None:
            self._sender.manager.clear()

    # -- the store's blocking half -----------------------------------------------------------

    def list(self, url: str) -> list[Shard]:
        bucket, prefix = parse_s3_url(url)

        shards = []
        token = ""
        pages = Pages(url)
        while True:  # a page per request, each under its own deadline and retries

            def page(token: str = token) -> Listed:
                return self._page(bucket, prefix, token, _PAGE)

            listed = self.call(url, page, bounded=True)
            for key, size, etag in listed.objects:
                shards.append(Shard(f"s3://{bucket}/{key}", size, etag))
            token = listed.token
            if not token:
                break
            pages.follow(token)
        if not shards:
            self._check_bucket(bucket, url)
        return sorted(shards, key=lambda s: s.url)

    def _page(self, bucket: str, prefix: str, token: str, max_keys: int) -> Listed:
        """One listing page, by the store's own request or botocore's."""
        rest = self.rest(bucket)
        if rest is not None:
            return rest.list_page(bucket, prefix, token, max_keys)
        more = {"ContinuationToken": token} if token else {}
        answer = self.client.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=max_keys, **more)
        objects = [
            (obj["Key"], int(obj["Size"]), obj.get("ETag")) for obj in answer.get("Contents", [])
        ]
        following = answer.get("NextContinuationToken", "") if answer.get("IsTruncated") else ""
        return Listed(objects, following, int(answer.get("KeyCount", len(objects))))

    def _head(self, bucket: str, key: str) -> tuple[int, str | None]:
        rest = self.rest(bucket)
        if rest is not None:
            return rest.head(bucket, key)
        answer = self.client.head_object(Bucket=bucket, Key=key)
        return int(answer["ContentLength"]), answer.get("ETag")

    def head(self, url: str) -> Shard:
        bucket, key = parse_s3_url(url)
        try:
            size, etag = self.call(url, lambda: self._head(bucket, key), bounded=True)
        except NotFoundError:
            # HEAD has no body to tell a missing bucket from a missing key: ask the bucket.
            self._check_bucket(bucket, url)
            raise NotFoundError(
                f"{url}: no such key in bucket {bucket!r}{self._prefix_hint(bucket, key)}",
                url=url,
            ) from None
        return Shard(url, size, etag)

    def _prefix_hint(self, bucket: str, key: str) -> str:
        """Where a missing key names a folder: say that a prefix ends with ``/``."""
        if not key or key.endswith("/"):
            return ""
        prefix = f"s3://{bucket}/{key}/"
        listed = self.call(prefix, lambda: self._page(bucket, f"{key}/", "", 1), bounded=True)
        if listed.count:
            return f"; objects are under {prefix}: a prefix needs its trailing '/'"
        return ""

    def _get(self, bucket: str, key: str, most: int) -> tuple[int | None, bytes]:
        """An object's declared length and at most ``most`` + 1 of its bytes."""
        rest = self.rest(bucket)
        if rest is not None:
            return rest.get(bucket, key, most)
        answer = self.client.get_object(Bucket=bucket, Key=key)
        with contextlib.closing(answer["Body"]) as body:
            declared = answer.get("ContentLength")
            if isinstance(declared, int) and declared > most:
                return declared, b""
            return declared if isinstance(declared, int) else None, body.read(most + 1)

    def read(self, url: str) -> bytes | None:
        bucket, key = parse_s3_url(url)

        def get() -> bytes:
            declared, data = self._get(bucket, key, MAX_OPEN_BYTES)  # never more held
            if declared is not None and declared > MAX_OPEN_BYTES:
                raise too_large(url, MAX_OPEN_BYTES, declared)
            if len(data) > MAX_OPEN_BYTES:
                raise too_large(url, MAX_OPEN_BYTES)
            return data

        try:
            return self.call(url, get, bounded=True)
        except NotFoundError as exc:
            if "NoSuchBucket" in str(exc):
                raise
            return None

    def write(self, url: str, data: bytes) -> None:
        bucket, key = parse_s3_url(url)
        self.call(url, lambda: self.client.put_object(Bucket=bucket, Key=key, Body=data))

    def delete(self, urls: Iterable[str]) -> None:
        for url in urls:
            bucket, key = parse_s3_url(url)

            def remove(bucket: str = bucket, key: str = key) -> Any:
                return self.client.delete_object(Bucket=bucket, Key=key)

            self.call(url, remove)

    def check_bucket(self, url: str) -> None:
        """Raise ``NotFoundError`` unless the bucket of ``url`` exists (and is allowed)."""
        bucket = parse_s3_url(url)[0]
        self.call(url, lambda: self._head_bucket(bucket), bounded=True)

    def _head_bucket(self, bucket: str) -> None:
        rest = self.rest(bucket)
        if rest is not None:
            rest.head_bucket(bucket)
        else:
            self.client.head_bucket(Bucket=bucket)

    def _check_bucket(self, bucket: str, url: str) -> None:
        try:
            self.call(url, lambda: self._head_bucket(bucket), bounded=True)
        except NotFoundError:
            raise NotFoundError(f"{url}: no such bucket {bucket!r}", url=url) from None

    # -- retries and TLS checks --------------------------------------------------------------

    def call(self, url: str, call: Callable[[], T], *, bounded: bool = False) -> T:
        """``call`` (a request on :attr:`client` about ``url``), retried under the one
        table; a TLS mismatch raised at once. For requests the store has no method for
        (``pack``'s uploads). ``bounded``: a request at open, which ends within
        ``open_deadline`` seconds, its retries included (:mod:`._deadline`)."""
        origin = self._origin()
        if origin is not None and origin.tls:
            self._check(origin, "handshake")

        def on_failure(exc: Exception) -> None:
            if origin is not None and not origin.tls and isinstance(exc, _CONNECTION):
                self._check(origin, "tls")

        seconds = self.options.open_deadline
        scope = bounded_scope(seconds) if bounded else contextlib.nullcontext(None)
        try:
            with scope as deadline:
                return retrying_sync(
                    attempt_under(deadline, call),
                    url=url,
                    policy=self._policy,
                    on_failure=on_failure,
                    until=None if deadline is None else deadline.until,
                    endpoint=self.options.endpoint_url,
                )
        except FetchError:
            raise
        except Exception as exc:  # pragma: no cover - retrying_sync maps every Exception
            raise fetch_error_from(exc, url) from exc

    def _origin(self) -> Origin | None:
        endpoint = self.options.endpoint_url
        return Origin.of(endpoint) if endpoint else None

    def _check(self, origin: Origin, what: str) -> None:
        """Probe ``origin`` once (see the module docstring); raises PermanentFetchError
        naming the endpoint when it speaks the other protocol."""
        with self._lock:
            if origin in self._checked:
                return
            self._checked.add(origin)
        pool = ConnectionPool(origin, ssl_context=ssl_context(self.options) if origin.tls else None)
        quick = Timeouts(connect=2.0, first_byte=2.0, stall=2.0, chunk=4.0)

        async def probe() -> None:
            if what == "handshake":
                await pool.confirm_tls(quick)
            else:
                await pool.probe_tls(quick)

        try:
            with ThreadPoolExecutor(1) as thread:  # a loop of its own, whatever runs here
                thread.submit(asyncio.run, probe()).result()
        except Exception as exc:
            judged = verdict(exc, str(origin))
            if judged.cause == "tls":
                raise judged.error from exc
            # anything else (the endpoint unreachable, say) is for the request to meet


def bounded_scope(seconds: float) -> contextlib.AbstractContextManager[Any]:
    return bounded(seconds, f"S3Options(open_deadline={seconds:g})")


class _Sender:
    """botocore's ``before-send`` handler: a request at open (a :mod:`._deadline` scope
    runs on this thread) is sent here, on connections the deadline shuts, as botocore's
    own sender sends it (the same call of urllib3, the same errors); any other request,
    or one through an HTTP proxy, is left to botocore (``None``)."""

    def __init__(self, options: S3Options) -> None:
        self.options = options
        self.manager = watched(urllib3.PoolManager(maxsize=options.max_pool_connections))
        self.timeout = urllib3.Timeout(connect=options.connect_timeout, read=options.read_timeout)

    def _tls(self) -> None:
        """The TLS context, made before the first HTTPS pool: loading the CA bundle costs
        70 to 90 ms of a stream's open (cProfile, a fresh process), for nothing over HTTP."""
        kw = self.manager.connection_pool_kw
        if "ssl_context" not in kw:
            kw["ssl_context"] = ssl_context(self.options)

    def _urlopen(self, method: str, url: str, body: Any, headers: dict[str, str]) -> Any:
        if url.startswith("https:"):
            self._tls()
        pool = self.manager.connection_from_url(url)
        return pool.urlopen(
            method=method,
            url=_target(url),
            body=body,
            headers=headers,
            retries=urllib3.Retry(False),
            assert_same_host=False,
            preload_content=False,
            decode_content=False,
            enforce_content_length=False,
            timeout=self.timeout,
        )

    def __call__(self, request: Any, **kwargs: Any) -> AWSResponse | None:
        deadline = current()
        origin = Origin.of(request.url)
        if deadline is None or _proxied(origin):
            return None
        try:
            answer = self._urlopen(
                request.method, request.url, request.body, dict(request.headers.items())
            )
            response = AWSResponse(request.url, answer.status, answer.headers, answer)
            if not request.stream_output:
                response.content  # noqa: B018 - the body read now, under the deadline
            return response
        except Exception as exc:
            if deadline.expired:
                raise deadline.error() from exc
            raise _botocore_error(exc, request) from exc

    def send(
        self, method: str, url: str, headers: Mapping[str, str], most: int
    ) -> tuple[int, Mapping[str, str], bytes]:
        """One of the store's own requests at open (:mod:`._s3rest`): the status, the
        header fields (lower-case names) and at most ``most`` + 1 bytes of the body (an
        error's document: at most 64 kB; none where ``Content-Length`` says more: the
        caller refuses it by that); failures raised as botocore's sender raises them, so
        the one table judges both alike."""
        deadline = current()
        try:
            answer = self._urlopen(method, url, None, dict(headers))
            whole = False
            try:
                limit = most + 1 if answer.status < 300 else _ERROR_BYTES
                declared = str(answer.headers.get("content-length", ""))
                if method == "HEAD" or (declared.isdigit() and int(declared) >= limit):
                    body = b""  # too long by its own account: not read (the caller says so)
                else:
                    body = answer.read(limit)
                whole = method == "HEAD" or len(body) < limit  # read to its end
                fields = {name.lower(): value for name, value in answer.headers.items()}
            finally:
                if whole:
                    answer.release_conn()  # kept alive for the next request
                else:
                    answer.close()  # a body left unread: the connection is not reused
            return answer.status, fields, body
        except Exception as exc:
            if deadline is not None and deadline.expired:
                raise deadline.error() from exc
            raise _botocore_error(exc, AWSRequest(method=method, url=url)) from exc


def _target(url: str) -> str:
    """A URL's request target (path and query), as botocore sends it."""
    parts = urlsplit(url)
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def _proxied(origin: Origin) -> bool:
    """Whether an HTTP(S) proxy is configured for this origin (botocore would use it)."""
    return origin.scheme in urllib.request.getproxies() and not urllib.request.proxy_bypass(
        origin.host
    )


def _botocore_error(exc: Exception, request: Any) -> Exception:
    """The error botocore's own sender raises for what urllib3 raised."""
    errors, url = botocore.exceptions, request.url
    error: Exception
    if isinstance(exc, urllib3.exceptions.SSLError):
        error = errors.SSLError(endpoint_url=url, error=exc)
    elif isinstance(exc, urllib3.exceptions.NewConnectionError | socket.gaierror):
        error = errors.EndpointConnectionError(endpoint_url=url, error=exc)
    elif isinstance(exc, urllib3.exceptions.ConnectTimeoutError):
        error = errors.ConnectTimeoutError(endpoint_url=url, error=exc)
    elif isinstance(exc, urllib3.exceptions.ReadTimeoutError):
        error = errors.ReadTimeoutError(endpoint_url=url, error=exc)
    elif isinstance(exc, urllib3.exceptions.ProtocolError):
        error = errors.ConnectionClosedError(error=exc, request=request, endpoint_url=url)
    else:
        error = errors.HTTPClientError(error=exc)
    return error


_CONNECTION = (
    botocore.exceptions.HTTPClientError,
    botocore.exceptions.ConnectionError,
    ConnectionError,
)
