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
import re
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal
from urllib.parse import quote

from .._exceptions import FetchError, ShardURLError
from ._errors import verdict
from ._limits import OPEN_DEADLINE

__all__ = [
    "S3Credentials",
    "S3Options",
    "chain_credentials",
    "check_bucket",
    "fetch_error_from",
    "object_url",
    "parse_s3_url",
    "ssl_context",
    "sync_client",
]

_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")


def parse_s3_url(url: str) -> tuple[str, str]:
    """Split ``s3://bucket/key`` into ``(bucket, key)``; the key may be empty or a prefix.

    Raises:
        ShardURLError: not an ``s3://`` URL, or a missing or invalid bucket name.
    """
    if not url.startswith("s3://"):
        raise ShardURLError(f"{url!r} is not an s3:// URL")
    rest = url[len("s3://") :]
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise ShardURLError(f"{url!r}: no bucket name after s3://")
    try:
        check_bucket(bucket)
    except ShardURLError as exc:
        raise ShardURLError(f"{url!r}: {exc}") from None
    return bucket, key


def check_bucket(name: str) -> None:
    """Raise :class:`ShardURLError` unless ``name`` is a valid S3 bucket name."""
    if not _BUCKET_RE.match(name) or ".." in name:
        rule = "3 to 63 lowercase letters, digits, '.' and '-'"
        raise ShardURLError(f"{name!r} is not a valid bucket name ({rule})")


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
        ca_bundle: a PEM file of the certificate authorities to trust for ``https://``
            (a private CA, or a test server's self-signed certificate); ``None`` means
            ``AWS_CA_BUNDLE`` if set, else the system's.
        verify: ``False`` turns certificate verification off (test servers only).
        open_deadline: seconds one request at open (a ``HEAD``, a listing page, the
            ``GET`` of an index file or manifest) may take in all, its retries included,
            however slowly the server trickles bytes (:mod:`._deadline`).
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
    ca_bundle: str | None = None
    verify: bool = True
    open_deadline: float = OPEN_DEADLINE

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
        deadline = self.open_deadline
        if isinstance(deadline, bool) or not isinstance(deadline, int | float) or deadline <= 0:
            raise ValueError(f"open_deadline must be seconds > 0, got {deadline!r}")

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
        ca_bundle = self.ca_bundle or env.get("AWS_CA_BUNDLE") or None
        return replace(self, endpoint_url=endpoint, region_name=region, ca_bundle=ca_bundle)

    @property
    def signing_region(self) -> str:
        """The region requests are signed for: the one given, else ``us-east-1``
        (what :meth:`client_kwargs` hands botocore, so the two always agree)."""
        return self.region_name or "us-east-1"

    def path_base(self, bucket: str) -> str | None:
        """The start of the HTTP(S) URL of every object of ``bucket``, where it follows
        from the options alone: an endpoint with path-style addressing (the endpoint, its
        path with one ``/``, the bucket, ``/``). The object's URL is this and its key
        percent-encoded as botocore encodes it (:func:`object_url`); ``tests/test_s3_urls.py``
        checks the two against botocore's ``generate_presigned_url``. ``None`` (virtual
        hosts, AWS's own endpoints and their regional rules) leaves the URL to botocore.
        """
        if not self.endpoint_url or self._style() != "path":
            return None
        return f"{self.endpoint_url.rstrip('/')}/{bucket}/"

    def _style(self) -> str:
        style = self.addressing_style
        if style == "auto":
            style = "path" if self.endpoint_url else "virtual"
        return style

    def client_kwargs(self, *, retries: bool = True) -> dict[str, Any]:
        """Keyword arguments for ``session.create_client("s3", ...)``.

        Args:
            retries: ``False`` switches botocore's own retries off (one attempt), for
                callers that retry with their own policy.
        """
        style = self._style()
        import botocore.config  # here: opening local files never loads botocore's config

        attempts = self.metadata_attempts if retries else 1
        config = botocore.config.Config(
            max_pool_connections=self.max_pool_connections,
            connect_timeout=self.connect_timeout,
            read_timeout=self.read_timeout,
            retries={"mode": "standard", "total_max_attempts": attempts},
            s3={"addressing_style": style},
            # SigV4 everywhere, presigned URLs included (botocore would presign with SigV2).
            signature_version="s3v4",
            # Response checksums cost CPU per byte; the engine validates length and ETag
            # itself, and only where the server offers them (see _s3store.py).
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        verify: str | bool = (self.ca_bundle or True) if self.verify else False
        kwargs: dict[str, Any] = {"config": config, "verify": verify}
        if self.endpoint_url:
            kwargs["endpoint_url"] = self.endpoint_url
        kwargs["region_name"] = self.signing_region
        if self.credentials is not None:
            kwargs["aws_access_key_id"] = self.credentials.access_key_id
            kwargs["aws_secret_access_key"] = self.credentials.secret_access_key
            kwargs["aws_session_token"] = self.credentials.session_token
        return kwargs


_LOADER: list[Any] = []  # botocore's data loader, shared by every session made here
_LOADER_LOCK = threading.Lock()


def sync_client(options: S3Options) -> Any:
    """A synchronous botocore S3 client for listing, HEAD and uploads.

    Each client has a session of its own (which reads the credentials afresh), but every
    session shares one botocore data loader, kept for the process: a new loader reads the
    S3 service model from disk again, most of a client's cost (a second or more on a
    busy machine). Clients are made one at a time (botocore's sessions and loaders are
    not thread safe; the clients are).

    Args:
        options: resolved options (see :meth:`S3Options.resolve`).
    """
    import botocore.session  # here: a stream of local files never needs a client

    with _LOADER_LOCK:
        session = botocore.session.Session(profile=options.profile)
        if _LOADER:
            session.register_component("data_loader", _LOADER[0])
        else:
            _LOADER.append(session.get_component("data_loader"))
        return session.create_client("s3", **options.client_kwargs(retries=True))


def chain_credentials(options: S3Options) -> Any:
    """The standard chain's credentials for ``options.profile`` (botocore's, refreshable
    where the chain's are), or None where it finds none."""
    import botocore.session  # here: a stream of local files never needs it

    return botocore.session.Session(profile=options.profile).get_credentials()


def object_url(base: str, key: str) -> str:
    """An object's URL from its bucket's :meth:`S3Options.path_base`: the key encoded as
    botocore encodes a greedy path label (UTF-8, everything but ``/`` and ``~`` and the
    unreserved characters percent-encoded)."""
    return base + quote(key.encode(), safe="/~")


def fetch_error_from(exc: BaseException, url: str) -> FetchError:
    """Map a botocore/aiohttp/OS error to the asyncstream exception tree (the one table of
    :mod:`asyncstream.stores._errors`).

    The caller raises the result ``from exc``. The message always names ``url``.

    Args:
        exc: the third-party exception.
        url: the shard or prefix the request was for.
    """
    return verdict(exc, url).error


def ssl_context(options: S3Options) -> ssl.SSLContext:
    """The TLS context of ``options``: its CA bundle (else ``AWS_CA_BUNDLE``, else the
    system's), or no verification with ``verify=False``."""
    cafile = options.ca_bundle or os.environ.get("AWS_CA_BUNDLE") or None
    context = ssl.create_default_context(cafile=cafile)
    if not options.verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context
