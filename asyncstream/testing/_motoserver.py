"""moto's threaded S3 server, over HTTP or TLS, for :class:`~asyncstream.testing.LocalS3`
(in this process, or in its child: ``_s3child.py``), closed to web browsers and to
moto's admin endpoints but for the admin token's holder (:mod:`._guard`).

moto is imported when a server is made, never when asyncstream is; where it (or its
``server`` extra: Flask, flask-cors) is missing, :func:`require_moto` says what to install.
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
import threading
from typing import Any

from ._guard import BrowserGuard

__all__ = ["MOTO_REQUIREMENT", "MotoServer", "require_moto"]

MOTO_REQUIREMENT = "moto[server]>=5.0,<6"
"""What asyncstream's embedded server needs (a dependency of asyncstream itself)."""


def require_moto() -> None:
    """Import moto's server, or say exactly what to install.

    Raises:
        ImportError: moto or a package of its ``server`` extra is missing.
    """
    try:
        import moto.server  # noqa: F401
        import werkzeug.serving  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"the embedded S3 server (LocalS3, asyncstream demo, asyncstream serve) needs "
            f"moto with its server extra, which did not import ({exc}): "
            f"pip install '{MOTO_REQUIREMENT}'"
        ) from exc


class MotoServer:
    """moto's WSGI app under werkzeug's threaded server, serving from a thread of its own.

    Unlike moto's ``ThreadedMotoServer``, the socket is bound in :meth:`start`'s thread, so
    an address in use (or any other bind failure) raises there instead of hanging it.

    Args:
        host: the address to bind.
        port: the port; ``0`` for a free one.
        tls: ``(cert_pem, key_pem)``: serve HTTPS with this certificate.
        admin_token: what opens moto's ``/moto-api/`` (in the header
            :data:`~._guard.ADMIN_HEADER`); ``None``: closed to all. Browsers are refused
            (:class:`~._guard.BrowserGuard`).
    """

    def __init__(
        self,
        host: str,
        port: int,
        tls: tuple[str, str] | None,
        admin_token: str | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.tls = tls
        self.admin_token = admin_token
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Bind and serve.

        Raises:
            ImportError: moto's server is not installed (see :func:`require_moto`).
            OSError: the address cannot be bound (in use, not this machine's, ...).
            ssl.SSLError: ``tls``'s files do not load.
        """
        require_moto()
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server

        context = None
        if self.tls is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(*self.tls)
        # Bound here, not by werkzeug, which prints and calls sys.exit(1) when it cannot.
        with _listen(self.host, self.port) as sock:
            address = str(sock.getsockname()[0]).partition("%")[0]
            app = BrowserGuard(
                DomainDispatcherApplication(create_backend_app),
                host=self.host,
                loopback=ipaddress.ip_address(address).is_loopback,
                admin_token=self.admin_token,
            )
            self._server = make_server(
                self.host,
                self.port,
                app,
                threaded=True,
                request_handler=MotoRequestHandler,
                ssl_context=context,
                fd=sock.fileno(),  # werkzeug listens on a duplicate of it
            )
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="asyncstream-local-s3", daemon=True
        )
        self._thread.start()

    def get_host_and_port(self) -> tuple[str, int]:
        """The address bound: ``(host, port)``."""
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def stop(self) -> None:
        """Stop serving and close the listening socket; safe to call more than once."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        if self._thread is not None:
            self._thread.join()
        server.server_close()


def _listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port``, or an ``OSError`` naming the address."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    return sock
