"""What the web store (:mod:`._webstore`) shares between its two halves: its settings,
the headers of a request (and what a redirect may carry on), an object's version tag, and
what an error status means.

Settings (``configure_store("https", ...)``, and the same for ``"http"``):

* ``token``: a bearer token, sent as ``Authorization: Bearer ...`` to the hosts of the
  shard URLs (never past a redirect to another origin). Without it, the Hugging Face
  Hub's hosts (``huggingface.co``, ``hf.co`` and their subdomains) get ``HF_TOKEN`` (or
  ``HUGGING_FACE_HUB_TOKEN``, or the token file ``huggingface-cli login`` wrote).
* ``headers``: extra request headers, sent to the shard URLs' own origins (never past a
  redirect to another origin: a header may carry a key, ``X-Api-Key``, as well as
  ``Authorization`` and ``Cookie`` do).
* ``ca_bundle``: a PEM file of the certificate authorities to trust (default: the
  system's, or ``SSL_CERT_FILE``); ``verify=False`` turns verification off (test
  servers only).
* ``max_redirects``: the most redirects one request follows (default 10).
* ``withhold``: origins (``scheme://host:port``) that get none of the above credentials
  and headers, nor the Hugging Face token: those that only an index named (the opened
  dataset's, put here by the registry, :func:`~._registry.store_settings`).
* ``max_open_bytes``: the largest body read whole at open (an index file, a manifest;
  default 64 MiB): a larger one is refused, never read (:mod:`._limits`).
* ``open_deadline``: seconds one request at open (a ``HEAD``, an index ``GET``) may
  take, from connect to last byte, its redirects and retries included (default 60).

An object's version tag (:attr:`Shard.etag <asyncstream.Shard.etag>`) is its ``ETag``
or, from a server that sends none, ``last-modified:`` and its ``Last-Modified`` date.
"""

from __future__ import annotations

import email.utils
import os
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

from .._exceptions import (
    AccessDeniedError,
    FetchError,
    NotFoundError,
    PermanentFetchError,
    ShardURLError,
    redact_url,
)
from ._errors import HTTPErrorResponse
from ._limits import MAX_OPEN_BYTES, OPEN_DEADLINE
from ._origin import Origin

__all__ = [
    "LAST_MODIFIED",
    "REDIRECTS",
    "WebSettings",
    "error_for",
    "is_redirect",
    "next_url",
    "refuse_userinfo",
    "retry_after",
    "same_tag",
    "version_of",
]

LAST_MODIFIED = "last-modified:"  # a version tag made of a Last-Modified date
REDIRECTS = frozenset({301, 302, 303, 307, 308})
# What a request carries past a redirect to another origin: the request's own protocol
# fields, nothing configured (a configured header may be a key: X-Api-Key) or credential.
_CROSS_ORIGIN = frozenset(
    {"user-agent", "accept-encoding", "range", "if-match", "if-unmodified-since"}
)
_HUB_HOSTS = ("huggingface.co", "hf.co")
_KNOWN = {
    "token",
    "headers",
    "ca_bundle",
    "verify",
    "max_redirects",
    "max_open_bytes",
    "open_deadline",
    "withhold",
}


def _hub_token() -> str | None:
    """The Hugging Face token of this environment, as ``huggingface_hub`` finds it."""
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        if os.environ.get(name):
            return os.environ[name].strip()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    path = Path(os.environ.get("HF_TOKEN_PATH") or os.path.join(home, "token"))
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _is_hub(host: str) -> bool:
    return any(host == h or host.endswith("." + h) for h in _HUB_HOSTS)


@dataclass(frozen=True)
class WebSettings:
    """The web store's settings (module docstring); :meth:`of` reads them."""

    scheme: str = "https"
    token: str | None = field(default=None, repr=False)
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    ca_bundle: str | None = None
    verify: bool = True
    max_redirects: int = 10
    hub_token: str | None = field(default=None, repr=False)
    withhold: frozenset[str] = frozenset()
    max_open_bytes: int = MAX_OPEN_BYTES
    open_deadline: float = OPEN_DEADLINE

    @classmethod
    def of(cls, scheme: str, given: Mapping[str, Any]) -> WebSettings:
        """The settings given with ``configure_store(scheme, ...)``, and the environment's
        Hugging Face token.

        Raises:
            ValueError: a setting the web store does not know, or of the wrong type.
        """
        unknown = sorted(set(given) - _KNOWN)
        if unknown:
            raise ValueError(
                f"configure_store({scheme!r}): unknown settings {unknown}; the web store "
                f"reads {sorted(_KNOWN)}"
            )
        headers = given.get("headers") or {}
        if not isinstance(headers, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        ):
            raise ValueError(f"configure_store({scheme!r}): headers must map strings to strings")
        token = given.get("token")
        redirects = given.get("max_redirects", 10)
        if isinstance(redirects, bool) or not isinstance(redirects, int) or redirects < 0:
            raise ValueError(f"configure_store({scheme!r}): max_redirects must be an int >= 0")
        cap = given.get("max_open_bytes", MAX_OPEN_BYTES)
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise ValueError(f"configure_store({scheme!r}): max_open_bytes must be an int >= 1")
        deadline = given.get("open_deadline", OPEN_DEADLINE)
        if isinstance(deadline, bool) or not isinstance(deadline, int | float) or deadline <= 0:
            raise ValueError(f"configure_store({scheme!r}): open_deadline must be seconds > 0")
        return cls(
            scheme=scheme,
            max_open_bytes=cap,
            open_deadline=float(deadline),
            token=str(token) if token else None,
            headers=dict(headers),
            ca_bundle=given.get("ca_bundle"),
            verify=bool(given.get("verify", True)),
            max_redirects=redirects,
            hub_token=None if token else _hub_token(),
            withhold=frozenset(str(o) for o in given.get("withhold", ())),
        )

    def headers_for(self, url: str) -> dict[str, str]:
        """The headers of a request for ``url`` (a shard URL, not a redirect's target)."""
        headers = {"User-Agent": "asyncstream", "Accept-Encoding": "identity"}
        if self.withhold and str(Origin.of(url)) in self.withhold:
            return headers  # only an index named this origin: none of the user's credentials
        headers.update(self.headers)
        host = urlsplit(url).hostname or ""
        token = self.token or (self.hub_token if _is_hub(host) else None)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def ssl_context(self) -> ssl.SSLContext:
        """The TLS context of ``https://`` requests."""
        context = ssl.create_default_context(cafile=self.ca_bundle)
        if not self.verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context

    def credentials_hint(self, url: str) -> str:
        """What to do about a 401 or 403 for ``url``."""
        host = urlsplit(url).hostname or ""
        how = f"configure_store({self.scheme!r}, token=...)"
        if _is_hub(host):
            how = f"HF_TOKEN (or {how}), for a token that may read this repository"
        sent = self.token or (self.hub_token if _is_hub(host) else None)
        return f"{'the token sent was refused' if sent else 'no token was sent'}: give {how}"


def refuse_userinfo(url: str) -> None:
    """Refuse a web URL that carries ``user:password@``.

    Not turned into Basic auth: the URL is named in errors, checkpoints, the index cache
    and every sample's ``__url__``, so a password in it would travel with all of them;
    credentials are given apart (``token``, ``headers``), and sent only to the shard
    URLs' own origins.

    Raises:
        ShardURLError: the URL has a user part (a ``ValueError``).
    """
    parts = urlsplit(url)
    if "@" in parts.netloc:
        raise ShardURLError(
            f"{redact_url(url)!r}: a web shard URL carries no user:password@ (it would be "
            "named in errors, checkpoints and sample keys); give credentials apart: "
            f"configure_store({parts.scheme!r}, token=...) or headers={{'Authorization': "
            "...}, sent only to the shards' own origins"
        )


def is_redirect(status: int, fields: Mapping[str, str]) -> bool:
    return status in REDIRECTS and bool(fields.get("location"))


def next_url(url: str, location: str, headers: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """Where a redirect from ``url`` goes, and the headers that may go with it: to another
    origin (scheme, host and port), only the request's own protocol fields (``Range``,
    its conditions, ``User-Agent``, ``Accept-Encoding``): neither credentials
    (``Authorization``, ``Cookie``) nor any header configured for the store."""
    target = urljoin(url, location)
    if urlsplit(target).scheme not in ("http", "https"):
        raise ShardURLError(f"{url}: redirected to {target!r}, which is not an http(s) URL")
    if Origin.of(target) == Origin.of(url):
        return target, dict(headers)
    return target, {k: v for k, v in headers.items() if k.lower() in _CROSS_ORIGIN}


def version_of(fields: Mapping[str, str]) -> str | None:
    """An object's version tag from a response's fields (module docstring)."""
    if fields.get("etag"):
        return fields["etag"]
    if fields.get("last-modified"):
        return LAST_MODIFIED + fields["last-modified"]
    return None


def same_tag(listed: str, answered: str) -> bool:
    """Whether two ETags name one version (weakly: ``W/`` and quotes aside)."""

    def bare(tag: str) -> str:
        return tag.strip().removeprefix("W/").strip('"')

    return bare(listed) == bare(answered)


def retry_after(value: str | None) -> float | None:
    """The seconds a ``Retry-After`` field asks for (a number, or an HTTP date)."""
    if not value:
        return None
    if value.strip().isdigit():
        return float(value.strip())
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


def error_for(
    status: int,
    url: str,
    answered: str,
    settings: WebSettings,
    fields: Mapping[str, str],
    body: bytes = b"",
) -> FetchError | HTTPErrorResponse:
    """What an error status means for the shard ``url``, answered by ``answered`` (the
    URL asked last: a redirect's target, maybe). Throttling and server errors come back
    as :class:`HTTPErrorResponse` (retried by the one table of :mod:`._errors`), the rest
    as the error to raise.
    """
    where = f"HTTP {status} from {Origin.of(answered)}"
    if answered != url:
        where += f" (redirected to {answered.partition('?')[0]})"
    if status == 429 or status >= 500:
        detail = body[:200].decode("utf-8", "replace").strip() or where
        return HTTPErrorResponse(status, detail, retry_after=retry_after(fields.get("retry-after")))
    if status in (404, 410):
        return NotFoundError(f"{url}: not found ({where})", url=url)
    if status in (401, 403):
        hint = settings.credentials_hint(url)
        return AccessDeniedError(f"{url}: access denied ({where}); {hint}", url=url)
    detail = body[:200].decode("utf-8", "replace").strip()
    return PermanentFetchError(f"{url}: {where}" + (f": {detail}" if detail else ""), url=url)
