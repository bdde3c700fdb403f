"""Where requests go (:class:`Origin`), and what a failed TLS handshake with it means.

Apart from the HTTP client (:mod:`._http`) because the one error table (:mod:`._errors`)
names an origin and a TLS failure in the same words as the client, whichever client met
the failure, and the client classifies its own failures with that table: both stand on
this module, which stands on nothing of asyncstream.
"""

from __future__ import annotations

import functools
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["Origin", "TLSMismatch", "tls_failure"]


class TLSMismatch(Exception):
    """TLS cannot work with this endpoint: a certificate that does not verify, or one
    side speaking TLS to a plain-HTTP peer. Permanent."""


def tls_failure(origin: object, exc: ssl.SSLError) -> TLSMismatch:
    """What a failed TLS handshake with ``origin`` means, in the same words whichever
    client met it (this one, aiohttp's, urllib3's)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return TLSMismatch(
            f"{origin}: the server's certificate does not verify ({exc.verify_message}):"
            " give the CA bundle that signed it (S3Options(ca_bundle=...) or "
            "AWS_CA_BUNDLE), or verify=False for a test server"
        )
    return TLSMismatch(
        f"{origin}: the TLS handshake failed ({exc.reason or exc}): is this a "
        "plain-HTTP port? Use http:// for it"
    )


@dataclass(frozen=True)
class Origin:
    """Where requests go: scheme, host and port."""

    scheme: str
    host: str
    port: int

    @classmethod
    def of(cls, url: str) -> Origin:
        """The origin of ``url``, kept per URL: the web store asks for it at each GET of a
        shard, and parsing it with ``hostname`` and ``port`` each time was the larger part
        of that lookup.

        Raises:
            ValueError: not an http:// or https:// URL with a host.
        """
        return _origin_of(url)

    @property
    def tls(self) -> bool:
        return self.scheme == "https"

    def __str__(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"


@functools.lru_cache(maxsize=4096)
def _origin_of(url: str) -> Origin:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http:// or https:// URL: {url!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return Origin(parts.scheme, parts.hostname, port)
