"""The S3 store's blocking half: listing, HEAD and whole small objects, at open.

These run in the consumer's process on botocore's synchronous client, with botocore's own
retries off: :func:`~._retry.retrying_sync` retries them under the same one table as the
chunks (:mod:`._errors`), so a certificate that does not verify, a 403 or a 404 is
raised at once instead of after botocore's attempts, and throttling and 5xx are retried.

A TLS mismatch is told apart from a network fault once per endpoint, with the probes of
the store's own HTTP client (:mod:`._http`), each bounded to about a second: before the
first request to an ``https://`` endpoint, a handshake (a plain-HTTP port that waits for
more bytes would otherwise hold botocore for its whole connect and read timeouts); and
after the first connection failure on an ``http://`` endpoint, a TLS probe of the port
(a TLS server resets or closes a plain request, which looks like a network fault).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, TypeVar

import botocore.exceptions

from .._exceptions import FetchError, NotFoundError
from ..shards._urls import Shard
from ._errors import verdict
from ._http import ConnectionPool
from ._limits import MAX_OPEN_BYTES, too_large
from ._origin import Origin
from ._retry import RetryPolicy, Timeouts, retrying_sync
from ._s3 import S3Options, fetch_error_from, parse_s3_url, ssl_context, sync_client

__all__ = ["S3Objects"]

T = TypeVar("T")


class S3Objects:
    """Listing, HEAD and whole objects on an S3-compatible endpoint (module docstring).

    Args:
        options: how to reach the store (resolved).
        client: a synchronous botocore client to use instead of making one.
    """

    def __init__(self, options: S3Options, client: Any = None) -> None:
        self.options = options
        self._client = client
        self._policy = RetryPolicy(max_attempts=options.metadata_attempts, base_delay=0.1)
        self._checked: set[Origin] = set()
        self._lock = threading.Lock()
        self._client_lock = threading.Lock()

    @property
    def client(self) -> Any:
        """The botocore client (its retries off: ours run), made on first use: one, even
        when the first requests come from several threads at once."""
        if self._client is None:
            with self._client_lock:
                if self._client is None:
                    self._client = sync_client(replace(self.options, metadata_attempts=1))
        return self._client

    # -- the store's blocking half -----------------------------------------------------------

    def list(self, url: str) -> list[Shard]:
        bucket, prefix = parse_s3_url(url)

        def listing() -> list[Shard]:
            shards = []
            paginator = self.client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
                for obj in page.get("Contents", []):
                    shards.append(
                        Shard(f"s3://{bucket}/{obj['Key']}", int(obj["Size"]), obj.get("ETag"))
                    )
            return shards

        shards = self.call(url, listing)
        if not shards:
            self._check_bucket(bucket, url)
        return sorted(shards, key=lambda s: s.url)

    def head(self, url: str) -> Shard:
        bucket, key = parse_s3_url(url)
        try:
            head = self.call(url, lambda: self.client.head_object(Bucket=bucket, Key=key))
        except NotFoundError:
            # HEAD has no body to tell a missing bucket from a missing key: ask the bucket.
            self._check_bucket(bucket, url)
            raise NotFoundError(
                f"{url}: no such key in bucket {bucket!r}{self._prefix_hint(bucket, key)}",
                url=url,
            ) from None
        return Shard(url, int(head["ContentLength"]), head.get("ETag"))

    def _prefix_hint(self, bucket: str, key: str) -> str:
        """Where a missing key names a folder: say that a prefix ends with ``/``."""
        if not key or key.endswith("/"):
            return ""
        prefix = f"s3://{bucket}/{key}/"
        listed = self.call(
            prefix,
            lambda: self.client.list_objects_v2(Bucket=bucket, Prefix=f"{key}/", MaxKeys=1),
        )
        if listed.get("KeyCount", 0):
            return f"; objects are under {prefix}: a prefix needs its trailing '/'"
        return ""

    def read(self, url: str) -> bytes | None:
        bucket, key = parse_s3_url(url)

        def get() -> bytes:
            answer = self.client.get_object(Bucket=bucket, Key=key)
            with contextlib.closing(answer["Body"]) as body:
                declared = answer.get("ContentLength")
                if isinstance(declared, int) and declared > MAX_OPEN_BYTES:
                    raise too_large(url, MAX_OPEN_BYTES, declared)
                data: bytes = body.read(MAX_OPEN_BYTES + 1)  # never more held
                if len(data) > MAX_OPEN_BYTES:
                    raise too_large(url, MAX_OPEN_BYTES)
            return data

        try:
            return self.call(url, get)
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
        self.call(url, lambda: self.client.head_bucket(Bucket=bucket))

    def _check_bucket(self, bucket: str, url: str) -> None:
        try:
            self.call(url, lambda: self.client.head_bucket(Bucket=bucket))
        except NotFoundError:
            raise NotFoundError(f"{url}: no such bucket {bucket!r}", url=url) from None

    # -- retries and TLS checks --------------------------------------------------------------

    def call(self, url: str, call: Callable[[], T]) -> T:
        """``call`` (a request on :attr:`client` about ``url``), retried under the one
        table; a TLS mismatch raised at once. For requests the store has no method for
        (``pack``'s uploads)."""
        origin = self._origin()
        if origin is not None and origin.tls:
            self._check(origin, "handshake")

        def on_failure(exc: Exception) -> None:
            if origin is not None and not origin.tls and isinstance(exc, _CONNECTION):
                self._check(origin, "tls")

        try:
            return retrying_sync(call, url=url, policy=self._policy, on_failure=on_failure)
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


_CONNECTION = (
    botocore.exceptions.HTTPClientError,
    botocore.exceptions.ConnectionError,
    ConnectionError,
)
