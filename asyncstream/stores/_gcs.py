"""What both halves of the Google Cloud Storage store share: its settings, its URLs, its
credentials and the mapping of its error answers onto asyncstream's exception tree.

Settings (``configure_store("gs", ...)``, beside Google's standard environment):

``endpoint``
    The JSON API's origin: ``https://storage.googleapis.com`` unless given, or
    ``STORAGE_EMULATOR_HOST`` (``host:port`` or a URL) where that is set, as Google's own
    libraries read it.
``credentials``
    A credentials file (a service-account key, or any file ``gcloud`` writes); else
    Application Default Credentials: ``GOOGLE_APPLICATION_CREDENTIALS``, then gcloud's
    ``application_default_credentials.json``, then the metadata server of a Google VM.
``anonymous``
    Send no credentials: the default where ``STORAGE_EMULATOR_HOST`` is set and no
    ``credentials`` file is given (emulators take none), else ``False``.
``project``
    The project billed for requests (``x-goog-user-project``, for requester-pays buckets).
``page_size``
    Objects per listing request (1 to 1000, the API's most; the default).
``open_deadline``
    Seconds one request at open (object metadata, a listing page, the ``GET`` of an index
    file or manifest) may take in all, its retries included, however slowly the server
    trickles bytes (default 60: :mod:`._deadline`).

``google.auth`` is imported here only when credentials are needed, and nothing else of
Google's: an anonymous store (an emulator) loads no Google library at all.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from .._exceptions import AccessDeniedError, NotFoundError, ShardURLError
from ._errors import ChunkFailure, S3ErrorResponse
from ._limits import OPEN_DEADLINE

__all__ = [
    "GCSSettings",
    "GoogleAuth",
    "gcs_error",
    "object_path",
    "parse_gs_url",
]

DEFAULT_ENDPOINT = "https://storage.googleapis.com"
SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
_BUCKET_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_.")


def parse_gs_url(url: str) -> tuple[str, str]:
    """``gs://bucket/name`` -> ``(bucket, name)`` (the name may be empty or a prefix).

    Raises:
        ShardURLError: not a ``gs://`` URL, or no valid bucket name.
    """
    if not url.startswith("gs://"):
        raise ShardURLError(f"{url!r}: not a gs:// URL")
    bucket, _, name = url[len("gs://") :].partition("/")
    if not (3 <= len(bucket) <= 222) or not set(bucket) <= _BUCKET_CHARS:
        raise ShardURLError(
            f"{url!r}: {bucket!r} is not a Cloud Storage bucket name (3 to 222 lowercase "
            "letters, digits, '-', '_' and '.')"
        )
    return bucket, name


def object_path(bucket: str, name: str) -> str:
    """The JSON API's path part for an object: ``b/{bucket}/o/{name, percent-encoded}``."""
    return f"b/{bucket}/o/{quote(name, safe='')}"


@dataclass(frozen=True)
class GCSSettings:
    """The store's settings, resolved (module docstring).

    Attributes:
        endpoint: the JSON API's origin, no trailing slash.
        credentials: a credentials file, or ``None`` for Application Default Credentials.
        anonymous: send no credentials.
        project: the project billed (``x-goog-user-project``), if any.
        page_size: objects per listing request.
        open_deadline: seconds one request at open may take, retries included.
    """

    endpoint: str = DEFAULT_ENDPOINT
    credentials: str | None = None
    anonymous: bool = False
    project: str | None = None
    page_size: int = 1000
    open_deadline: float = OPEN_DEADLINE

    @classmethod
    def of(cls, given: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> GCSSettings:
        """Settings from ``configure_store("gs", ...)`` and the environment.

        Raises:
            ValueError: an unknown setting, or a value of the wrong kind.
        """
        environ = os.environ if environ is None else environ
        known = {"endpoint", "credentials", "anonymous", "project", "page_size", "open_deadline"}
        unknown = set(given) - known
        if unknown:
            raise ValueError(
                f"unknown gs:// store settings {sorted(unknown)}; expected endpoint, "
                "credentials, anonymous, project, page_size, open_deadline"
            )
        emulator = environ.get("STORAGE_EMULATOR_HOST", "").strip()
        endpoint = str(given.get("endpoint") or emulator or DEFAULT_ENDPOINT)
        if "://" not in endpoint:
            endpoint = f"http://{endpoint}"
        if not endpoint.startswith(("http://", "https://")):
            raise ValueError(f"the gs:// endpoint must be http:// or https://, got {endpoint!r}")
        credentials = given.get("credentials")
        anonymous = given.get("anonymous")
        if anonymous is None:
            anonymous = bool(emulator) and credentials is None
        page_size = int(given.get("page_size", 1000))
        if not 1 <= page_size <= 1000:
            raise ValueError(f"page_size must be 1 to 1000, got {page_size}")
        deadline = given.get("open_deadline", OPEN_DEADLINE)
        if isinstance(deadline, bool) or not isinstance(deadline, int | float) or deadline <= 0:
            raise ValueError("configure_store('gs'): open_deadline must be seconds > 0")
        return cls(
            endpoint=endpoint.rstrip("/"),
            credentials=None if credentials is None else os.fspath(credentials),
            anonymous=bool(anonymous),
            project=given.get("project") or None,
            page_size=page_size,
            open_deadline=float(deadline),
        )

    def describe(self) -> str:
        """The store, as error messages name it."""
        return f"Google Cloud Storage at {self.endpoint}"


class GoogleAuth:
    """The store's Google credentials, loaded on first use and refreshed when expired:
    the ``Authorization`` (and billing) headers of a request. Thread-safe.

    Args:
        settings: the store's settings (``anonymous``: no headers at all).
    """

    def __init__(self, settings: GCSSettings) -> None:
        self.settings = settings
        self._credentials: Any = None
        self._lock = threading.Lock()

    def headers(self, url: str) -> dict[str, str]:
        """The headers that authorise a request about ``url`` (blocking: a refresh asks
        Google's token endpoint).

        Raises:
            AccessDeniedError: no credentials could be found or loaded, or the token
                endpoint refused them.
            ConnectionError: the token endpoint could not be reached (transient).
        """
        headers = {"x-goog-user-project": self.settings.project} if self.settings.project else {}
        if self.settings.anonymous:
            return headers
        import google.auth.exceptions
        from google.auth.transport.requests import Request

        with self._lock:
            try:
                credentials = self._load(url)
                if not credentials.valid:
                    credentials.refresh(Request())
                token = str(credentials.token)
            except google.auth.exceptions.TransportError as exc:
                message = f"Google's token endpoint could not be reached: {exc}"
                raise ConnectionError(message) from exc
            except google.auth.exceptions.RefreshError as exc:
                if getattr(exc, "retryable", False):
                    raise ConnectionError(f"Google's token endpoint failed: {exc}") from exc
                raise AccessDeniedError(
                    f"{url}: {self.settings.describe()}: the credentials "
                    f"({self._source()}) were refused by Google's token endpoint: {exc}",
                    url=url,
                ) from exc
        headers["Authorization"] = f"Bearer {token}"
        return headers

    def ready(self) -> dict[str, str] | None:
        """:meth:`headers` where they need no blocking call (anonymous, or a token that is
        still valid), else ``None``: then ask :meth:`headers` in a thread."""
        credentials = self._credentials
        if self.settings.anonymous:
            return {"x-goog-user-project": self.settings.project} if self.settings.project else {}
        if credentials is None or not credentials.valid:
            return None
        headers = {"Authorization": f"Bearer {credentials.token}"}
        if self.settings.project:
            headers["x-goog-user-project"] = self.settings.project
        return headers

    def _source(self) -> str:
        if self.settings.credentials:
            return f"file {self.settings.credentials}"
        return "Application Default Credentials"

    def _load(self, url: str) -> Any:
        if self._credentials is not None:
            return self._credentials
        import google.auth
        import google.auth.exceptions

        try:
            if self.settings.credentials:
                found = _from_file(self.settings.credentials)
            else:
                found, _ = google.auth.default(scopes=[SCOPE])
        except (google.auth.exceptions.GoogleAuthError, OSError, ValueError, KeyError) as exc:
            raise AccessDeniedError(
                f"{url}: {self.settings.describe()}: no usable Google credentials "
                f"({self._source()}; set GOOGLE_APPLICATION_CREDENTIALS, run "
                "`gcloud auth application-default login`, or "
                f'configure_store("gs", credentials=...)): {type(exc).__name__}: {exc}',
                url=url,
            ) from exc
        self._credentials = found
        return found


def _from_file(path: str) -> Any:
    """The credentials in a service-account key or a ``gcloud`` user's file, loaded by
    their own type's loader (google-auth's generic one is deprecated: it would take any
    type, such as an external account that runs a command).

    Raises:
        ValueError: another type of file (Application Default Credentials read those).
    """
    with open(path) as f:
        kind = json.load(f).get("type")
    load: Callable[..., Any] | None = None
    if kind == "service_account":
        from google.oauth2 import service_account

        load = service_account.Credentials.from_service_account_file
    elif kind == "authorized_user":
        from google.oauth2 import credentials

        load = credentials.Credentials.from_authorized_user_file
    if load is not None:
        return load(path, scopes=[SCOPE])
    raise ValueError(
        f"a credentials file of type {kind!r}: give a service_account or authorized_user "
        "file, or point GOOGLE_APPLICATION_CREDENTIALS at it"
    )


def gcs_error(status: int, body: bytes, url: str, settings: GCSSettings) -> Exception:
    """What an error answer of the JSON API means, for :func:`._errors.verdict`:
    ``AccessDeniedError`` (401, 403), ``NotFoundError`` (404), a permanent ``changed``
    :class:`ChunkFailure` (412: the generation no longer matches), else an
    :class:`S3ErrorResponse` classified by its status (429 and 503 throttling, 5xx,
    408 retried; other 4xx permanent)."""
    reason, message = _error_document(body)
    what = f"{message or reason or 'error'} (HTTP {status})"
    where = settings.describe()
    if status in (401, 403):
        return AccessDeniedError(
            f"{url}: {where}: access denied, check the credentials and permissions: {what}",
            url=url,
        )
    if status == 404:
        return NotFoundError(f"{url}: {where}: not found: {what}", url=url)
    if status == 412:
        return ChunkFailure("changed", f"its generation no longer matches: {what}")
    code = "RequestTimeout" if status == 408 else reason
    return S3ErrorResponse(status, code, f"{where}: {message or reason or f'HTTP {status}'}")


def _error_document(body: bytes) -> tuple[str, str]:
    """The ``reason`` and ``message`` of a JSON API error document (empty where none)."""
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return "", body[:200].decode("utf-8", "replace").strip()
    if not isinstance(error, dict):
        return "", str(error)[:200]
    errors = error.get("errors") or [{}]
    reason = errors[0].get("reason", "") if isinstance(errors[0], dict) else ""
    return str(reason), str(error.get("message", ""))
