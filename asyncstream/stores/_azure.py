"""Where Azure Blob Storage is and how to sign in: URLs, settings, credentials, errors.

The one place the Azure store reads a URL, its settings and the Azure environment; it
imports no Azure library (the store's modules do, when an ``az://`` URL is met).

URLs, one convention: the **container** is the URL's host, the **account** comes from the
settings or the environment (as ``adlfs`` and ``az storage`` do)::

    az://container/path/to/shard-0000.tar
    abfs://container@account.dfs.core.windows.net/path/   (also abfss://, and .blob.)

``abfs[s]://`` URLs, as Spark and Data Lake users write them, name their account in the
host; they are read as the same blobs (the ``blob`` endpoint of that account, unless an
endpoint is configured). ``az://account/container/path`` cannot be told from a container
with a folder, so it is read as container ``account``; ``az://container@account...`` is
refused with what to write instead.

Credentials, first found wins (:meth:`AzureConfig.resolve`): the settings of
``configure_store("az", ...)`` (``connection_string``, ``account``, ``key``,
``sas_token``, ``endpoint``), then ``AZURE_STORAGE_CONNECTION_STRING``,
``AZURE_STORAGE_ACCOUNT`` / ``AZURE_STORAGE_KEY``, ``AZURE_STORAGE_SAS_TOKEN`` (and
``AZURE_STORAGE_BLOB_ENDPOINT``); with neither a key nor a SAS token, azure-identity's
``DefaultAzureCredential`` (environment, workload or managed identity, Azure CLI).
``open_deadline`` (seconds, default 60) bounds each request at open, its retries
included (:mod:`._deadline`); it is not a credential, and may be given with the
environment's credentials.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote, urlsplit

from .._exceptions import ShardURLError
from ._errors import S3ErrorResponse
from ._limits import OPEN_DEADLINE

__all__ = [
    "DEV_ACCOUNT",
    "DEV_KEY",
    "AzureConfig",
    "BlobPath",
    "azure_error",
    "error_answer",
    "parse_blob_url",
]

#: the storage emulator's well-known development account and its published key
DEV_ACCOUNT = "devstoreaccount1"
DEV_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
_DEV_ENDPOINT = f"http://127.0.0.1:10000/{DEV_ACCOUNT}"

_CONTAINER = re.compile(r"^(?:[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){2,62}|\$root|\$web|\$logs)$")
_ABFS_HOST = re.compile(r"^(?P<account>[a-z0-9]{3,24})\.(?:dfs|blob)\.(?P<suffix>.+)$")
_SETTINGS = frozenset(
    {"connection_string", "account", "key", "sas_token", "endpoint", "open_deadline"}
)
_ENV = {
    "connection_string": "AZURE_STORAGE_CONNECTION_STRING",
    "account": "AZURE_STORAGE_ACCOUNT",
    "key": "AZURE_STORAGE_KEY",
    "sas_token": "AZURE_STORAGE_SAS_TOKEN",
    "endpoint": "AZURE_STORAGE_BLOB_ENDPOINT",
}


@dataclass(frozen=True)
class BlobPath:
    """What an ``az://`` or ``abfs[s]://`` URL names.

    Attributes:
        container: the container.
        key: the blob name or prefix (may be empty).
        account: the account the URL names (``abfs``), else ``None`` (the configured one).
        suffix: the endpoint suffix of an ``abfs`` host (``core.windows.net``).
    """

    container: str
    key: str
    account: str | None = None
    suffix: str = "core.windows.net"


def parse_blob_url(url: str) -> BlobPath:
    """Split an ``az://container/key`` or ``abfs[s]://container@account.dfs.SUFFIX/key`` URL.

    Raises:
        ShardURLError: another form, or an invalid container or account name.
    """
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("az", "abfs", "abfss"):
        raise ShardURLError(f"{url!r} is not an az:// or abfs:// URL")
    host, _, key = rest.partition("/")
    account: str | None = None
    suffix = "core.windows.net"
    if scheme == "az":
        if "@" in host:
            raise ShardURLError(
                f"{url!r}: az:// URLs are az://container/path, the account configured "
                "(AZURE_STORAGE_ACCOUNT or configure_store('az', account=...)); a URL naming "
                "its account is abfs://container@account.dfs.core.windows.net/path"
            )
        container = host
    else:
        container, at, where = host.partition("@")
        found = _ABFS_HOST.match(where.lower())
        if not at or found is None:
            raise ShardURLError(
                f"{url!r}: an {scheme}:// URL is {scheme}://container@account.dfs."
                "core.windows.net/path"
            )
        account, suffix = found["account"], found["suffix"]
    if not container:
        raise ShardURLError(f"{url!r}: no container name after {scheme}://")
    if not _CONTAINER.match(container):
        raise ShardURLError(
            f"{url!r}: {container!r} is not a valid container name (3 to 63 lowercase "
            "letters, digits and single hyphens)"
        )
    return BlobPath(container, key, account, suffix)


def _parse_connection_string(text: str) -> dict[str, str]:
    """A connection string's fields, by lower-case name.

    Raises:
        ValueError: a part that is not ``Name=value``.
    """
    fields: dict[str, str] = {}
    for part in text.strip().strip(";").split(";"):
        name, eq, value = part.partition("=")
        if not eq or not name.strip():
            raise ValueError("an Azure connection string is Name=value pairs separated by ';'")
        fields[name.strip().lower()] = value.strip()
    return fields


@dataclass(frozen=True, repr=False)
class AzureConfig:
    """How to reach an Azure storage account and sign in (resolved: module docstring).

    Attributes:
        account: the storage account (``None``: known only from ``abfs`` URLs).
        endpoint: the account's blob endpoint (``None``: ``https://ACCOUNT.blob.SUFFIX``);
            Azurite's is ``http://127.0.0.1:10000/devstoreaccount1``.
        key: the account key (signs requests; the engine reads with a SAS made from it).
        sas_token: a shared access signature (query string, without ``?``).
        source: where the credentials came from, for messages (never the secret).
        open_deadline: seconds one request at open may take, its retries included.
    """

    account: str | None = None
    endpoint: str | None = None
    key: str | None = None
    sas_token: str | None = None
    source: str = "DefaultAzureCredential"
    open_deadline: float = OPEN_DEADLINE

    def __repr__(self) -> str:  # no secret in a repr
        return (
            f"AzureConfig(account={self.account!r}, endpoint={self.endpoint!r}, "
            f"auth={self.auth!r}, source={self.source!r})"
        )

    @property
    def auth(self) -> Literal["key", "sas", "token"]:
        """How requests are authorised: account key, SAS token or a bearer token."""
        return "key" if self.key else "sas" if self.sas_token else "token"

    @classmethod
    def resolve(cls, settings: Mapping[str, Any], environ: Mapping[str, str]) -> AzureConfig:
        """The settings of ``configure_store`` if any, else the environment.

        Raises:
            ValueError: an unknown setting or a malformed connection string.
        """
        unknown = set(settings) - _SETTINGS
        if unknown:
            raise ValueError(
                f"unknown Azure store settings {sorted(unknown)}; expected some of "
                f"{sorted(_SETTINGS)}"
            )
        deadline = settings.get("open_deadline", OPEN_DEADLINE)
        if isinstance(deadline, bool) or not isinstance(deadline, int | float) or deadline <= 0:
            raise ValueError("configure_store('az'): open_deadline must be seconds > 0")
        given = {k: str(v) for k, v in settings.items() if v and k != "open_deadline"}
        source = "configure_store('az')"
        if not given:
            given = {k: environ[v] for k, v in _ENV.items() if environ.get(v)}
            source = "environment (" + ", ".join(_ENV[k] for k in sorted(given)) + ")"
        if not given:
            return cls(open_deadline=float(deadline))
        fields: dict[str, str] = {}
        if "connection_string" in given:
            fields = _parse_connection_string(given["connection_string"])
        if fields.get("usedevelopmentstorage", "").lower() == "true":
            fields = {
                "accountname": DEV_ACCOUNT,
                "accountkey": DEV_KEY,
                "blobendpoint": _DEV_ENDPOINT,
            }
        account = given.get("account") or fields.get("accountname")
        key = given.get("key") or fields.get("accountkey")
        sas = given.get("sas_token") or fields.get("sharedaccesssignature")
        endpoint = given.get("endpoint") or fields.get("blobendpoint")
        if not endpoint and account and fields.get("endpointsuffix"):
            protocol = fields.get("defaultendpointsprotocol", "https")
            endpoint = f"{protocol}://{account}.blob.{fields['endpointsuffix']}"
        if endpoint and not account:
            account = _account_of_endpoint(endpoint)
        return cls(
            account=account or None,
            endpoint=endpoint.rstrip("/") if endpoint else None,
            key=key or None,
            sas_token=sas.lstrip("?") if sas else None,
            source=source,
            open_deadline=float(deadline),
        )

    def account_of(self, path: BlobPath, url: str) -> str:
        """The account that serves ``path``.

        Raises:
            ShardURLError: none is known, or an ``abfs`` URL names another account than
                the configured one.
        """
        if path.account and self.account and path.account != self.account:
            raise ShardURLError(
                f"{url!r} names the account {path.account!r}, but the Azure store is "
                f"configured for {self.account!r} ({self.source})"
            )
        account = path.account or self.account
        if not account:
            raise ShardURLError(
                f"{url!r}: no Azure storage account: set AZURE_STORAGE_ACCOUNT (or "
                "AZURE_STORAGE_CONNECTION_STRING), configure_store('az', account=...), or "
                "write abfs://container@account.dfs.core.windows.net/path"
            )
        return account

    def endpoint_of(self, path: BlobPath, url: str) -> str:
        """The blob endpoint (no trailing ``/``) that serves ``path``."""
        account = self.account_of(path, url)
        if self.endpoint:
            return self.endpoint
        return f"https://{account}.blob.{path.suffix}"

    def blob_url(self, path: BlobPath, url: str) -> str:
        """The blob's HTTP(S) URL, without credentials."""
        return f"{self.endpoint_of(path, url)}/{path.container}/{quote(path.key, safe='/~')}"


def _account_of_endpoint(endpoint: str) -> str | None:
    """The account an endpoint serves: ``https://ACCOUNT.blob...`` or, path-style (an
    emulator), ``http://host:port/ACCOUNT``."""
    parts = urlsplit(endpoint)
    first = parts.path.strip("/").split("/")[0]
    if first:
        return first
    host = parts.hostname or ""
    return host.split(".")[0] if ".blob." in host else None


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0].strip() if text.strip() else ""


def azure_error(exc: BaseException, account: str) -> BaseException | None:
    """An Azure SDK error as the one error table reads it (:mod:`._errors`): an HTTP
    answer as :class:`S3ErrorResponse` (its status and Azure's error code), a network
    failure as ``ConnectionError``; ``None`` for anything else (passed through)."""
    from azure.core.exceptions import (
        ClientAuthenticationError,
        HttpResponseError,
        ServiceRequestError,
        ServiceResponseError,
    )

    if isinstance(exc, HttpResponseError) and exc.status_code is not None:
        code = getattr(exc, "error_code", None) or ""
        code = str(getattr(code, "value", code))
        detail = _first_line(str(exc.reason or exc.message or ""))
        return S3ErrorResponse(
            int(exc.status_code), code, f"{detail} (Azure Blob Storage account {account!r})"
        )
    if isinstance(exc, ClientAuthenticationError):  # no token: DefaultAzureCredential found none
        return S3ErrorResponse(
            403, "NoCredentials", f"no usable Azure credentials for account {account!r}: {exc}"
        )
    if isinstance(exc, ServiceRequestError | ServiceResponseError):
        return ConnectionError(f"Azure Blob Storage (account {account!r}): {exc}")
    return None


def error_answer(status: int, fields: Mapping[str, str], body: bytes, account: str) -> Exception:
    """The error of an HTTP answer from Azure Blob Storage (the engine's own client): its
    ``x-ms-error-code`` and the ``<Message>`` of its XML document."""
    code = fields.get("x-ms-error-code", "")
    text = body.decode("utf-8", "replace")
    found = re.search(r"<Message>(.*?)</Message>", text, flags=re.DOTALL)
    if not code:
        code_found = re.search(r"<Code>(.*?)</Code>", text)
        code = code_found[1] if code_found else ""
    detail = _first_line(found[1]) if found else f"HTTP {status}"
    return S3ErrorResponse(status, code, f"{detail} (Azure Blob Storage account {account!r})")
