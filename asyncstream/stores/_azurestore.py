"""The Azure Blob store: ``az://container/path`` and ``abfs[s]://container@account.dfs...``.

Two halves, two clients, each chosen for its work (measured in ``bench/stores_azure.py``,
figures in the Stores guide and ``bench/RESULTS.md``):

* **blocking** (listing, properties, whole blobs, ``pack``'s uploads): the official SDK's
  synchronous client (:mod:`._azureobjects`), which knows Azure's paging, block uploads
  and every way of signing in;
* **the engine's ranged reads**: the project's own HTTP/1.1 client (:mod:`._http`, as the
  S3 store's direct transport): each ranged ``GET`` (``Range``, ``x-ms-version``) on a
  kept-alive connection, its body received straight into the ring slot, over TLS too.
  The SDK's ``aio`` client would hand the body over in ``bytes`` pieces to copy again,
  and run a pipeline of policies per request. Requests are authorised by a SAS made once
  per container from the account key (``generate_container_sas``: read only, renewed
  before it expires), by the configured SAS token, or by a bearer token from
  azure-identity's ``DefaultAzureCredential`` (renewed before it expires).

Checks, as on S3: every read carries ``If-Match`` with the listed ETag (Azure answers 412
ConditionNotMet for a replaced blob), and the answer's ETag and ``Content-Range`` total are
compared with the listing too: a replaced blob is a *permanent* ``changed`` failure, a
``Content-Range`` naming other bytes than those asked a permanent ``range`` one
(:func:`._errors.check_range`).
Errors are Azure's ``x-ms-error-code`` and status, read by the one table of
:mod:`._errors`: 429 and 503 (ServerBusy) retried as throttling, 404 (BlobNotFound,
ContainerNotFound) and 403 (AuthenticationFailed, AuthorizationFailure) raised at once.

Settings (``configure_store("az", ...)``; ``abfs``/``abfss`` URLs use those of ``az``
unless given their own): ``connection_string``, ``account``, ``key``, ``sas_token``,
``endpoint``; else the environment (:mod:`._azure`).
"""

from __future__ import annotations

import asyncio
import datetime
import os
import time
from pathlib import Path
from typing import Any

from ._azure import AzureConfig, BlobPath, azure_error, error_answer, parse_blob_url
from ._azureobjects import AzureObjects, default_credential
from ._errors import ChunkFailure, check_range
from ._httpconn import Reply, Scatter
from ._httpstore import ObjectStore
from ._origin import Origin
from ._registry import store_settings
from ._retry import Timeouts
from ._store import ChunkRequest, StoreSetup

__all__ = ["AzureStore"]

API_VERSION = "2023-11-03"  # x-ms-version of the engine's reads
_SAS_LIFETIME = datetime.timedelta(hours=8)
_RENEW_BEFORE = 3600.0  # seconds: a SAS or token is renewed this long before it expires
_TOKEN_SCOPE = "https://storage.azure.com/.default"


class AzureStore(ObjectStore):
    """Blobs of Azure Blob Storage (see the module docstring).

    Args:
        config: the account, endpoint and credentials (resolved).
        timeouts: the time limits of one read.
        check_etag: require every chunk to come from the listed blob version.
        connections: the most kept-alive connections per endpoint.
    """

    hedgeable = True
    cacheable = True
    lists_folders = True
    coalesces = True

    def __init__(
        self,
        config: AzureConfig,
        *,
        timeouts: Timeouts | None = None,
        check_etag: bool = True,
        connections: int = 16,
    ) -> None:
        super().__init__(timeouts=timeouts, check_etag=check_etag, connections=connections)
        self.config = config
        self._objects = AzureObjects(config)  # the blocking half
        self._urls: dict[str, tuple[str, BlobPath]] = {}  # az:// URL -> blob URL, path
        self._sas: dict[tuple[str, str], tuple[str, float]] = {}  # (endpoint, container)
        self._token: tuple[str, float] | None = None
        self._credential: Any = None
        self._accounts: set[str] = set()

    @classmethod
    def from_setup(cls, setup: StoreSetup) -> AzureStore:
        settings = dict(setup.settings)
        if not settings:  # abfs:// and abfss:// URLs take the settings given for az://
            settings = dict(dict(store_settings()).get("az", ()))
        return cls(
            AzureConfig.resolve(settings, os.environ),
            timeouts=setup.timeouts,
            check_etag=setup.check_etag,
            connections=setup.connections,
        )

    @classmethod
    def canonical(cls, url: str) -> str:
        parse_blob_url(url)  # a malformed URL or container name fails here
        return url

    def is_folder(self, url: str) -> bool:
        key = parse_blob_url(url).key
        return not key or key.endswith("/")

    # -- at open: the blocking half (see :mod:`._azureobjects`) ------------------------------

    @property
    def objects(self) -> AzureObjects:
        return self._objects

    def prepare(self, url: str) -> None:
        self.objects.check_container(url)

    def upload(self, url: str, path: Path) -> str | None:
        return self.objects.upload(url, path)

    def close(self) -> None:
        self.objects.close()

    # -- in the fetch engine -------------------------------------------------------------------

    async def aclose(self) -> None:
        self._close_pools()
        credential, self._credential = self._credential, None
        if credential is not None:
            await asyncio.to_thread(credential.close)

    def stats(self) -> dict[str, Any]:
        return {
            "store": "azure-blob",
            "azure_accounts": sorted(self._accounts),
            "azure_auth": self.config.auth,
            "transport": "direct",
            **self._pool_stats(),
        }

    async def _get(self, request: ChunkRequest, view: Scatter) -> float:
        url, headers, account = await self._request(request, view.total)

        def accept(reply: Reply) -> None:  # before any byte lands in a slot
            self._check(request, reply, view.total)

        pool = self._pool(Origin.of(url))
        reply, headers_at = await pool.get(url, headers, view, self.timeouts, accept)
        if reply.status >= 300:
            raise error_answer(reply.status, reply.fields, reply.body, account)
        return headers_at

    async def _request(self, request: ChunkRequest, length: int) -> tuple[str, dict[str, str], str]:
        """The chunk's URL (with a SAS) and headers (with a bearer token), and its account."""
        found = self._urls.get(request.url)
        if found is None:
            path = parse_blob_url(request.url)
            found = self._urls[request.url] = (self.config.blob_url(path, request.url), path)
        url, path = found
        account = self.config.account_of(path, request.url)
        self._accounts.add(account)
        end = request.offset + length - 1
        # Range, not x-ms-range: the same to Azure, and what proxies and caches know.
        headers = {"x-ms-version": API_VERSION, "Range": f"bytes={request.offset}-{end}"}
        if self.check_etag and request.etag:
            headers["If-Match"] = request.etag
        auth = self.config.auth
        if auth == "key":
            url = f"{url}?{await self._container_sas(path, request.url, account)}"
        elif auth == "sas":
            url = f"{url}?{self.config.sas_token}"
        else:
            token = await self._bearer(request.url, path, account)
            headers["Authorization"] = f"Bearer {token}"
        return url, headers, account

    async def _container_sas(self, path: BlobPath, url: str, account: str) -> str:
        """A read-only SAS for the container, made from the account key (once; renewed an
        hour before it expires)."""
        key = (self.config.endpoint_of(path, url), path.container)
        found = self._sas.get(key)
        if found is None or found[1] - time.time() < _RENEW_BEFORE:
            from azure.storage.blob import ContainerSasPermissions, generate_container_sas

            now = datetime.datetime.now(datetime.UTC)
            sas = generate_container_sas(
                account,
                path.container,
                account_key=self.config.key,
                permission=ContainerSasPermissions(read=True),
                start=now - datetime.timedelta(minutes=15),  # clocks differ
                expiry=now + _SAS_LIFETIME,
            )
            found = self._sas[key] = (sas, (now + _SAS_LIFETIME).timestamp())
        return found[0]

    async def _bearer(self, url: str, path: BlobPath, account: str) -> str:
        """An OAuth token from DefaultAzureCredential (renewed before it expires).

        Raises:
            AccessDeniedError: no credential found one (or the endpoint is plain HTTP).
        """
        if self._token is None or self._token[1] - time.time() < _RENEW_BEFORE / 12:
            if self._credential is None:
                self._credential = default_credential(url, self.config.endpoint_of(path, url))
            try:
                token = await asyncio.to_thread(self._credential.get_token, _TOKEN_SCOPE)
            except Exception as exc:
                mapped = azure_error(exc, account)
                if mapped is None:
                    raise
                raise mapped from exc
            self._token = (str(token.token), float(token.expires_on))
        return self._token[0]

    def _check(self, request: ChunkRequest, reply: Reply, length: int) -> None:
        """The answer is for the listed blob version (else: permanent ``changed``) and
        exactly the range asked (else: permanent ``range``: :func:`._errors.check_range`)."""
        etag = reply.fields.get("etag")
        if self.check_etag and request.etag and etag not in (None, request.etag):
            raise ChunkFailure("changed", f"its ETag is {etag}, it was {request.etag}")
        content_range = reply.fields.get("content-range")
        check_range(reply.status, content_range, request.offset, length, request.size)
