"""What the embedded S3 server answers a web browser, and who may reset it.

moto's server (under :class:`~asyncstream.testing.LocalS3` and ``asyncstream serve``)
checks no signature, answers every ``Origin`` with a matching
``Access-Control-Allow-Origin`` (flask-cors) and serves its ``/moto-api/`` admin
endpoints (reset, the dashboard, every backend's data). Any web page the user opens could
then read, write or reset the buckets of a server on the user's own loopback, through
CORS, a form, or DNS rebinding (a name of the page's made to resolve to 127.0.0.1).
:class:`BrowserGuard`, a WSGI middleware in front of moto's app, answers 403 (an S3
``AccessDenied`` error) to:

* a request whose ``Origin`` is not the server's own (``scheme://Host``), every CORS
  preflight (``Access-Control-Request-Method``) and every request a browser marks as sent
  by another site (``Sec-Fetch-Site``);
* on a server bound to loopback, a request whose ``Host`` is not a loopback name (an IP
  address, ``localhost`` or ``*.localhost``, the name it was bound to): a rebound name is
  refused. A server bound to another address is reachable by anyone on that network
  anyway, by whatever name, so it takes any;
* ``/moto-api/``, unless the request carries the server's random admin token (a header
  only :meth:`LocalS3.reset <asyncstream.testing.LocalS3.reset>` knows);

and strips every ``Access-Control-*`` header from what moto answers. Clients that are not
browsers (botocore, the AWS CLI, curl) send no ``Origin``, and are served as before.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Callable, Iterable
from typing import Any
from xml.sax.saxutils import escape

__all__ = ["ADMIN_HEADER", "ADMIN_TOKEN_ENV", "BrowserGuard"]

ADMIN_HEADER = "X-Asyncstream-Admin"
"""The header that carries a server's admin token to ``/moto-api/``."""

ADMIN_TOKEN_ENV = "ASYNCSTREAM_LOCAL_S3_ADMIN_TOKEN"
"""The environment variable that hands the token to ``LocalS3``'s child process."""

_ADMIN_KEY = "HTTP_" + ADMIN_HEADER.upper().replace("-", "_")
_CROSS_SITE = ("cross-site", "same-site")
_DEFAULT_PORTS = {"http": 80, "https": 443}

App = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def _split_host(value: str, scheme: str) -> tuple[str, int] | None:
    """``host[:port]`` (IPv6 in brackets) as a lowercase name and a port, or ``None``."""
    value = value.strip().lower()
    if value.startswith("["):
        name, _, rest = value[1:].partition("]")
        port = rest.removeprefix(":")
    else:
        name, _, port = value.partition(":")
    if not name or (port and not port.isdigit()):
        return None
    return name.rstrip("."), int(port) if port else _DEFAULT_PORTS.get(scheme, 0)


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class BrowserGuard:
    """moto's WSGI app, closed to web browsers and to admin requests (see the module).

    Args:
        app: the WSGI app it guards.
        host: the address or name the server was told to listen on.
        loopback: whether the address it listens on is a loopback one (then a ``Host``
            that is not a loopback name is refused).
        admin_token: the token that opens ``/moto-api/``; ``None``: never opened.
    """

    def __init__(self, app: App, *, host: str, loopback: bool, admin_token: str | None) -> None:
        self.app = app
        self.admin_token = admin_token
        self.loopback = loopback
        name = host.strip("[]").lower().rstrip(".")
        self.names = {"localhost"} | ({name} if name and not _is_ip(name) else set())

    def refusal(self, environ: dict[str, Any]) -> str | None:
        """Why the request is refused; ``None`` where it is served."""
        scheme = str(environ.get("wsgi.url_scheme", "http"))
        given = environ.get("HTTP_HOST")
        host = None if given is None else _split_host(str(given), scheme)
        if given is not None and host is None:
            return "its Host header is malformed"
        if self.loopback and host is not None and not self._local_name(host[0]):
            return f"on loopback it answers loopback names only, not Host {host[0]!r}"
        origin = environ.get("HTTP_ORIGIN")
        if origin is not None:
            own = None if host is None else (scheme, *host)
            theirs_scheme, _, theirs_host = str(origin).partition("://")
            theirs = _split_host(theirs_host, theirs_scheme.lower())
            if theirs is None or own != (theirs_scheme.lower(), *theirs):
                return "it refuses requests from web pages of other origins (CORS)"
        if "HTTP_ACCESS_CONTROL_REQUEST_METHOD" in environ:
            return "it answers no CORS preflight"
        if str(environ.get("HTTP_SEC_FETCH_SITE", "")).lower() in _CROSS_SITE:
            return "it refuses requests a browser sends for another site"
        path = str(environ.get("PATH_INFO", ""))
        if path.startswith("/moto-api") and not self._admin(environ):
            return "moto's admin endpoints (/moto-api/) are closed"
        return None

    def _local_name(self, name: str) -> bool:
        if _is_ip(name):
            return True
        return any(name == n or name.endswith("." + n) for n in self.names)

    def _admin(self, environ: dict[str, Any]) -> bool:
        given = str(environ.get(_ADMIN_KEY, ""))
        return self.admin_token is not None and hmac.compare_digest(
            given.encode(), self.admin_token.encode()
        )

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        why = self.refusal(environ)
        if why is not None:
            body = (
                '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>'
                f"<Message>asyncstream's local S3 server: {escape(why)}</Message></Error>"
            ).encode()
            start_response(
                "403 Forbidden",
                [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))],
            )
            return [] if environ.get("REQUEST_METHOD") == "HEAD" else [body]

        def start(status: str, headers: list[tuple[str, str]], *exc_info: Any) -> Any:
            kept = [(k, v) for k, v in headers if not k.lower().startswith("access-control-")]
            return start_response(status, kept, *exc_info)

        return self.app(environ, start)
