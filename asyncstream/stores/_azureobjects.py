"""The Azure Blob store's blocking half: listing, properties, whole blobs and uploads, at open
and in ``pack`` and ``index``, on the official SDK's synchronous client
(``azure-storage-blob``).

The SDK's own retries are off (``retry_total=0``): :func:`~._retry.retrying_sync` retries
under the one table of :mod:`._errors`, as for S3, so a 403 or a 404 is raised at once and
throttling (429, 503 ServerBusy) and 5xx are retried with backoff. SDK errors are read at
this edge (:func:`~._azure.azure_error`), named by the ``az://`` URL and the account.

Every request at open (properties, a listing page, a small blob's ``GET`` and its body),
its retries included, ends within the setting ``open_deadline`` (:mod:`._deadline`): the
SDK sends on azure-core's ``RequestsTransport`` over a session whose connections the
deadline shuts. Uploads are not bounded.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from .._exceptions import AccessDeniedError, FetchError, NotFoundError
from ..shards._urls import Shard
from ._azure import AzureConfig, BlobPath, azure_error, parse_blob_url
from ._deadline import attempt_under, bounded, deadline_session
from ._limits import MAX_OPEN_BYTES, Pages, too_large
from ._retry import RetryPolicy, retrying_sync

__all__ = ["AzureObjects", "quoted"]

T = TypeVar("T")
_PAGE = 5000  # blobs per listing page (Azure's most)
_UPLOAD_THREADS = 4


def quoted(etag: str | None) -> str | None:
    """An ETag as HTTP writes it (the SDK's listing leaves the quotes off)."""
    if not etag:
        return None
    return etag if etag.startswith(('"', 'W/"')) else f'"{etag}"'


class AzureObjects:
    """Listing, properties and whole blobs (module docstring).

    Args:
        config: the account, endpoint and credentials (resolved).
        attempts: tries per request, the first included.
    """

    def __init__(self, config: AzureConfig, *, attempts: int = 5) -> None:
        self.config = config
        self._policy = RetryPolicy(max_attempts=attempts, base_delay=0.1)
        self._clients: dict[str, Any] = {}  # endpoint -> BlobServiceClient
        self._credential: Any = None
        self._lock = threading.Lock()

    def _service(self, path: BlobPath, url: str) -> Any:
        """The SDK's client for the account serving ``path`` (one per endpoint)."""
        endpoint = self.config.endpoint_of(path, url)
        with self._lock:
            client = self._clients.get(endpoint)
            if client is None:
                from azure.core.pipeline.transport import RequestsTransport
                from azure.storage.blob import BlobServiceClient

                transport = RequestsTransport(session=deadline_session(), session_owner=True)
                client = BlobServiceClient(
                    endpoint,
                    credential=self._sdk_credential(path, url),
                    retry_total=0,
                    transport=transport,
                )
                self._clients[endpoint] = client
        return client

    def _sdk_credential(self, path: BlobPath, url: str) -> Any:
        config = self.config
        if config.key:
            return {"account_name": config.account_of(path, url), "account_key": config.key}
        if config.sas_token:
            return config.sas_token
        if self._credential is None:
            self._credential = default_credential(url, config.endpoint_of(path, url))
        return self._credential

    def blob(self, url: str) -> Any:
        """The SDK's ``BlobClient`` of ``url``."""
        path = parse_blob_url(url)
        return self._service(path, url).get_blob_client(path.container, path.key)

    def container(self, url: str) -> Any:
        """The SDK's ``ContainerClient`` of ``url``'s container."""
        path = parse_blob_url(url)
        return self._service(path, url).get_container_client(path.container)

    # -- the store's blocking half -----------------------------------------------------------

    def list(self, url: str) -> list[Shard]:
        path = parse_blob_url(url)
        base = url[: len(url) - len(path.key)]  # az://container/ or abfs://c@host/

        shards: list[Shard] = []
        token: str | None = None
        pages = Pages(url)
        while True:  # a page per request, each under its own deadline and retries

            def page(token: str | None = token) -> tuple[list[Shard], str | None]:
                blobs = self.container(url).list_blobs(
                    name_starts_with=path.key or None, results_per_page=_PAGE
                )
                pages = blobs.by_page(continuation_token=token)
                found = [Shard(base + b.name, int(b.size), quoted(b.etag)) for b in next(pages)]
                return found, pages.continuation_token

            try:
                found, token = self.call(url, page, at_open=True)
            except NotFoundError:
                raise NotFoundError(self._no_container(url, path), url=url) from None
            shards.extend(found)
            if not token:
                break
            pages.follow(token)
        return sorted(shards, key=lambda s: s.url)

    def head(self, url: str) -> Shard:
        try:
            props = self.call(url, lambda: self.blob(url).get_blob_properties(), at_open=True)
        except NotFoundError:
            self.check_container(url)
            path = parse_blob_url(url)
            raise NotFoundError(
                f"{url}: no such blob in container {path.container!r} "
                f"(Azure Blob Storage account {self._account(url)!r})",
                url=url,
            ) from None
        return Shard(url, int(props.size), quoted(props.etag))

    def read(self, url: str) -> bytes | None:
        def get() -> bytes:
            download = self.blob(url).download_blob(max_concurrency=1)
            if download.size > MAX_OPEN_BYTES:  # the blob's size, before its body is read
                raise too_large(url, MAX_OPEN_BYTES, download.size)
            data: bytes = download.readall()
            return data

        try:
            return self.call(url, get, at_open=True)
        except NotFoundError as exc:
            if "ContainerNotFound" in str(exc):
                raise NotFoundError(self._no_container(url), url=url) from None
            return None

    def write(self, url: str, data: bytes) -> None:
        self.call(url, lambda: self.blob(url).upload_blob(data, overwrite=True))

    def upload(self, url: str, path: Path) -> str | None:
        """Store the local file as one blob (blocks in parallel above the SDK's single-put
        size, committed at once: no partial blob is ever visible); its ETag."""

        def put() -> Any:
            with path.open("rb") as body:
                return self.blob(url).upload_blob(
                    body, overwrite=True, max_concurrency=_UPLOAD_THREADS
                )

        answer = self.call(url, put)
        path.unlink()
        return quoted(answer.get("etag"))

    def delete(self, urls: Iterable[str]) -> None:
        for url in urls:
            with contextlib.suppress(NotFoundError):
                self.call(url, self.blob(url).delete_blob)

    def check_container(self, url: str) -> None:
        """Raise ``NotFoundError`` unless ``url``'s container exists (and is allowed)."""
        try:
            self.call(url, self.container(url).get_container_properties, at_open=True)
        except NotFoundError:
            raise NotFoundError(self._no_container(url), url=url) from None

    def close(self) -> None:
        """Close the SDK's clients and credential."""
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
            credential, self._credential = self._credential, None
        for client in clients:
            client.close()
        if credential is not None:
            credential.close()

    # -- errors and retries ------------------------------------------------------------------

    def _account(self, url: str) -> str:
        return self.config.account_of(parse_blob_url(url), url)

    def _no_container(self, url: str, path: BlobPath | None = None) -> str:
        path = path or parse_blob_url(url)
        return (
            f"{url}: no such container {path.container!r} in Azure Blob Storage account "
            f"{self._account(url)!r} ({self.config.endpoint_of(path, url)})"
        )

    def call(self, url: str, call: Callable[[], T], *, at_open: bool = False) -> T:
        """``call`` (a request about ``url`` on the SDK's client), its errors read as the
        one table reads them, retried under it; ``at_open``: all within ``open_deadline``
        seconds (:mod:`._deadline`)."""
        account = self._account(url)

        def attempt() -> T:
            try:
                return call()
            except FetchError:
                raise
            except Exception as exc:
                mapped = azure_error(exc, account)
                if mapped is None:
                    raise
                raise mapped from exc

        if not at_open:
            return retrying_sync(attempt, url=url, policy=self._policy)
        seconds = self.config.open_deadline
        with bounded(seconds, f"configure_store('az', open_deadline={seconds:g})") as deadline:
            once = attempt_under(deadline, attempt)
            return retrying_sync(once, url=url, policy=self._policy, until=deadline.until)


def default_credential(url: str, endpoint: str) -> Any:
    """azure-identity's ``DefaultAzureCredential`` (no key or SAS token was given).

    Raises:
        AccessDeniedError: azure-identity is not installed, or the endpoint is plain HTTP
            (Azure sends bearer tokens over HTTPS only).
    """
    if not endpoint.startswith("https://"):
        raise AccessDeniedError(
            f"{url}: no Azure key, SAS token or connection string is configured, and a "
            f"bearer token (DefaultAzureCredential) needs an https:// endpoint, not {endpoint}",
            url=url,
        )
    try:
        from azure.identity import DefaultAzureCredential
    except ImportError:
        raise AccessDeniedError(
            f"{url}: no Azure key, SAS token or connection string is configured, and "
            "azure-identity (for DefaultAzureCredential) is not installed: pip install "
            "'asyncstream[azure]', or set AZURE_STORAGE_CONNECTION_STRING",
            url=url,
        ) from None
    return DefaultAzureCredential()
