"""Where S3 is and how to talk to it: options, client factories, error mapping.

This is the one edge where botocore's exceptions become asyncstream's. Nothing else in
the package reads the AWS environment: :meth:`S3Options.resolve` does, once, when a
stream or command is opened.

Which layer retries what:
    * Listing, HEAD and the uploads of ``asyncstream pack`` run on a synchronous botocore
      client with botocore's own ``standard`` retry mode (up to ``metadata_attempts``).
    * Chunk downloads in the fetch engine run with botocore's retries switched off
      (``total_max_attempts=1``); the engine's :class:`~asyncstream.RetryPolicy` is the
      only retry layer there, so the two never multiply.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import botocore.config
import botocore.exceptions
import botocore.session

from ._exceptions import (
    AccessDeniedError,
    FetchError,
    NotFoundError,
    PermanentFetchError,
    TransientFetchError,
)

__all__ = ["S3Credentials", "S3Options", "fetch_error_from", "sync_client"]

_NOT_FOUND = {"NoSuchKey", "NoSuchBucket", "NotFound", "404", "NoSuchUpload"}
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
_TRANSIENT = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "InternalError",
    "ServiceUnavailable",
    "503",
    "500",
    "502",
    "504",
}


@dataclass(frozen=True)
class S3Credentials:
    """Explicit credentials, for stores outside the standard AWS chain (the embedded server).

    The repr shows neither the secret nor the session token, and only the start of the key id.
    """

    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        return f"S3Credentials(access_key_id='{self.access_key_id[:4]}...', secret=***)"


@dataclass(frozen=True, kw_only=True)
class S3Options:
    """How to reach the object store.

    Credentials come from botocore's standard chain (environment, shared files, profile,
    instance roles) unless ``credentials`` gives them explicitly; either way no repr and
    no error message shows a secret.

    Args:
        endpoint_url: an S3-compatible endpoint (MinIO, moto, R2, ...). ``None`` means
            ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` if set, else AWS itself.
        region_name: the region; ``None`` means the standard AWS configuration, or
            ``us-east-1`` where that names none.
        profile: a named profile of the shared AWS configuration files.
        addressing_style: ``"path"`` or ``"virtual"``; ``"auto"`` picks path-style for a
            custom endpoint (what MinIO and moto need) and virtual-hosted for AWS.
        max_pool_connections: size of the HTTP connection pool of one client.
        connect_timeout: seconds to open a connection.
        read_timeout: seconds without a byte before botocore gives up on a response.
        metadata_attempts: botocore's attempts for listing, HEAD and uploads.
        credentials: explicit credentials instead of the standard chain.
    """

    endpoint_url: str | None = None
    region_name: str | None = None
    profile: str | None = None
    addressing_style: Literal["auto", "path", "virtual"] = "auto"
    max_pool_connections: int = 64
    connect_timeout: float = 10.0
    read_timeout: float = 60.0
    metadata_attempts: int = 5
    credentials: S3Credentials | None = None

    def __post_init__(self) -> None:
        if self.endpoint_url is not None and not self.endpoint_url.startswith(
            ("http://", "https://")
        ):
            raise ValueError(
                f"endpoint_url must start with http:// or https://, got {self.endpoint_url!r}"
            )
        if self.addressing_style not in ("auto", "path", "virtual"):
            raise ValueError(
                "addressing_style must be 'auto', 'path' or 'virtual', "
                f"got {self.addressing_style!r}"
            )
        if self.max_pool_connections < 1:
            raise ValueError(f"max_pool_connections must be >= 1, got {self.max_pool_connections}")
        if self.metadata_attempts < 1:
            raise ValueError(f"metadata_attempts must be >= 1, got {self.metadata_attempts}")

    def resolve(self, environ: Mapping[str, str] | None = None) -> S3Options:
        """Fill the endpoint and region from the environment where they were left unset.

        Args:
            environ: the environment to read; ``os.environ`` by default.

        Returns:
            A copy with ``endpoint_url`` and ``region_name`` decided.
        """
        env = os.environ if environ is None else environ
        endpoint = (
            self.endpoint_url
            or env.get("AWS_ENDPOINT_URL_S3")
            or env.get("AWS_ENDPOINT_URL")
            or None
        )
        region = self.region_name or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
        return replace(self, endpoint_url=endpoint, region_name=region)

    def client_kwargs(self, *, retries: bool = True) -> dict[str, Any]:
        """Keyword arguments for ``session.create_client("s3", ...)``.

        Args:
            retries: ``False`` switches botocore's own retries off (one attempt), for
                callers that retry with their own policy.
        """
        style = self.addressing_style
        if style == "auto":
            style = "path" if self.endpoint_url else "virtual"
        attempts = self.metadata_attempts if retries else 1
        config = botocore.config.Config(
            max_pool_connections=self.max_pool_connections,
            connect_timeout=self.connect_timeout,
            read_timeout=self.read_timeout,
            retries={"mode": "standard", "total_max_attempts": attempts},
            s3={"addressing_style": style},
            # Response checksums cost CPU per byte; the engine validates length and ETag
            # itself, and only where the server offers them (see _fetch.py).
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        kwargs: dict[str, Any] = {"config": config}
        if self.endpoint_url:
            kwargs["endpoint_url"] = self.endpoint_url
        kwargs["region_name"] = self.region_name or "us-east-1"
        if self.credentials is not None:
            kwargs["aws_access_key_id"] = self.credentials.access_key_id
            kwargs["aws_secret_access_key"] = self.credentials.secret_access_key
            kwargs["aws_session_token"] = self.credentials.session_token
        return kwargs


def sync_client(options: S3Options) -> Any:
    """A synchronous botocore S3 client for listing, HEAD and uploads.

    Args:
        options: resolved options (see :meth:`S3Options.resolve`).
    """
    session = botocore.session.Session(profile=options.profile)
    return session.create_client("s3", **options.client_kwargs(retries=True))


def error_code(exc: BaseException) -> tuple[str, int | None]:
    """The S3 error code and HTTP status of a botocore ``ClientError`` (else ``("", None)``)."""
    if isinstance(exc, botocore.exceptions.ClientError):
        err = exc.response.get("Error", {})
        meta = exc.response.get("ResponseMetadata", {})
        status = meta.get("HTTPStatusCode")
        return str(err.get("Code", "")), int(status) if status is not None else None
    return "", None


def fetch_error_from(exc: BaseException, url: str) -> FetchError:
    """Map a botocore/aiohttp/OS error to the asyncstream exception tree.

    The caller raises the result ``from exc``. The message always names ``url``.

    Args:
        exc: the third-party exception.
        url: the shard or prefix the request was for.
    """
    if isinstance(exc, FetchError):
        return exc
    code, status = error_code(exc)
    if isinstance(exc, botocore.exceptions.ClientError):
        detail = exc.response.get("Error", {}).get("Message") or code
        what = f"{code or 'error'} (HTTP {status}): {detail}"
        if code in _NOT_FOUND or status == 404:
            return NotFoundError(f"{url}: not found: {what}", url=url)
        if code in _DENIED or status == 403:
            return AccessDeniedError(
                f"{url}: access denied, check the credentials and permissions: {what}", url=url
            )
        if code in _TRANSIENT or (status is not None and status >= 500):
            return TransientFetchError(f"{url}: {what}", url=url)
        return PermanentFetchError(f"{url}: {what}", url=url)
    if isinstance(
        exc, botocore.exceptions.NoCredentialsError | botocore.exceptions.PartialCredentialsError
    ):
        return AccessDeniedError(
            f"{url}: no usable AWS credentials found (environment, shared files or profile): {exc}",
            url=url,
        )
    if isinstance(exc, botocore.exceptions.ProfileNotFound):
        return AccessDeniedError(f"{url}: {exc}", url=url)
    if isinstance(exc, botocore.exceptions.ParamValidationError):
        return PermanentFetchError(f"{url}: invalid request: {exc}", url=url)
    return TransientFetchError(f"{url}: {type(exc).__name__}: {exc}", url=url)
