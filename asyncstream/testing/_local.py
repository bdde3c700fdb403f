"""An embedded S3-compatible server (moto's server mode) on a free loopback port.

Used by ``asyncstream demo``, the benchmark and the tests, so that everything runs with
no cloud account. Two modes:

* ``"thread"``: moto's werkzeug server in a thread of this process. Starts in
  milliseconds; right for tests. moto keeps its state per process, so thread-mode
  servers of one process share their buckets, and closing one resets them all.
* ``"process"``: the same server in a child process, so that serving bytes does not
  compete for this process's GIL; right for the demo and benchmarks. The child exits
  when its stdin closes, so it cannot outlive a parent killed with SIGKILL.

``tls=(cert_pem, key_pem)`` serves HTTPS instead (werkzeug's ``ssl_context``), in either
mode, for tests of TLS against moto (see :func:`asyncstream.testing.make_test_certificates`).

Ranged GETs read only their range (:mod:`._moto_ranges`; moto itself reads the whole
object and slices it). Objects are held in the server's memory; :meth:`LocalS3.close`
resets it, so nothing is left behind (moto spills large objects to anonymous temporary
files, which the reset closes).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import ssl
import subprocess
import sys
import threading
import urllib.request
from types import TracebackType
from typing import IO, Any, Literal

from . import _moto_ranges
from ._s3 import S3Credentials, S3Options, sync_client

__all__ = ["LOCAL_CREDENTIALS", "LocalS3"]

LOCAL_CREDENTIALS = S3Credentials("asyncstream-local", "asyncstream-local")

_START_TIMEOUT = 60.0


class LocalS3:
    """A local S3 server, as a context manager.

    Example::

        with LocalS3() as s3:
            client = s3.client()
            client.create_bucket(Bucket="data")

    Args:
        mode: ``"thread"`` (in this process) or ``"process"`` (a child process).
        host: the loopback address to bind.
        require_auth: check request signatures against moto's IAM (process mode only), so
            that unknown credentials are refused with 403 as real S3 does.
        tls: ``(cert_pem, key_pem)``: serve HTTPS with this certificate.
        ca_bundle: the CA that signed ``tls``'s certificate, for :meth:`options`,
            :meth:`client` and :meth:`reset` (without it they cannot verify the server).

    Attributes:
        endpoint_url: ``http://127.0.0.1:PORT`` (``https://`` with ``tls``) once started.
    """

    def __init__(
        self,
        *,
        mode: Literal["thread", "process"] = "thread",
        host: str = "127.0.0.1",
        require_auth: bool = False,
        tls: tuple[str, str] | None = None,
        ca_bundle: str | None = None,
    ):
        if mode not in ("thread", "process"):
            raise ValueError(f"mode must be 'thread' or 'process', got {mode!r}")
        if require_auth and mode != "process":
            raise ValueError("require_auth=True needs mode='process' (moto reads it per process)")
        self.mode = mode
        self.require_auth = require_auth
        self.host = host
        self.tls = tls
        self.ca_bundle = ca_bundle
        self._server: Any = None
        self._proc: subprocess.Popen[str] | None = None
        self._endpoint: str | None = None
        self._closed = False

    def __repr__(self) -> str:
        state = "closed" if self._closed else (self._endpoint or "not started")
        return f"LocalS3(mode={self.mode!r}, {state})"

    @property
    def endpoint_url(self) -> str:
        """The server's URL; ``RuntimeError`` before :meth:`start`."""
        if self._endpoint is None:
            raise RuntimeError("LocalS3 is not running: call start() or use it in a with block")
        return self._endpoint

    def start(self) -> LocalS3:
        """Start the server and wait until it answers. Returns ``self``."""
        if self._closed:
            raise RuntimeError("this LocalS3 was closed; make a new one")
        if self._endpoint is not None:
            return self
        if self.mode == "thread":
            # One line per request on stderr is noise for an embedded server.
            logging.getLogger("werkzeug").setLevel(logging.WARNING)
            _moto_ranges.install()
            server = _moto_server(self.host, self.tls)
            server.start()
            self._server = server
            host, port = server.get_host_and_port()
        else:
            host, port = self._start_process()
        self._endpoint = f"{'https' if self.tls else 'http'}://{host}:{port}"
        return self

    def _start_process(self) -> tuple[str, int]:
        env = dict(os.environ)
        if self.require_auth:
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = "0"
        tls = ["--cert", self.tls[0], "--key", self.tls[1]] if self.tls else []
        proc = subprocess.Popen(
            [sys.executable, "-m", "asyncstream._local", "--host", self.host, *tls],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self._proc = proc
        if proc.stdout is None:
            raise RuntimeError("no pipe to the local S3 server")
        line = wait_for_line(proc.stdout, "READY ", _START_TIMEOUT)
        if line is None:
            self._stop_process()
            raise RuntimeError(f"the local S3 server did not start within {_START_TIMEOUT:.0f} s")
        _, host, port = line.split()
        return host, int(port)

    def options(self) -> S3Options:
        """:class:`S3Options` for this server.

        Without ``require_auth`` the server takes any signature, so the options carry
        fixed local credentials and work on a machine with no AWS configuration at all.
        With it, credentials come from the standard chain, as for a real store.
        """
        credentials = None if self.require_auth else LOCAL_CREDENTIALS
        return S3Options(
            endpoint_url=self.endpoint_url, credentials=credentials, ca_bundle=self.ca_bundle
        ).resolve()

    def client(self) -> Any:
        """A synchronous botocore S3 client for this server (see :meth:`options`)."""
        return sync_client(self.options())

    def reset(self) -> None:
        """Delete every bucket and object on the server."""
        request = urllib.request.Request(f"{self.endpoint_url}/moto-api/reset", method="POST")
        context = None
        if self.tls is not None:
            context = ssl.create_default_context(cafile=self.ca_bundle)
            if self.ca_bundle is None:  # our own loopback server: its address is enough
                context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        with urllib.request.urlopen(request, timeout=30, context=context) as response:
            response.read()

    def close(self) -> None:
        """Reset and stop the server; safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        if self._endpoint is not None and self.mode == "thread":
            with contextlib.suppress(OSError):
                self.reset()
        if self._server is not None:
            self._server.stop()
            self._server._server.server_close()
            self._server = None
        self._stop_process()
        self._endpoint = None

    def _stop_process(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_child(proc)

    def __enter__(self) -> LocalS3:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def wait_for_line(stream: IO[str], prefix: str, timeout: float) -> str | None:
    """The first line of a child's output that starts with ``prefix`` (its "ready" line),
    or ``None`` if none comes within ``timeout`` seconds (or the output ends first)."""
    found: list[str] = []

    def read() -> None:
        for line in stream:
            if line.startswith(prefix):
                found.append(line)
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout)
    return found[0] if found else None


def stop_child(proc: subprocess.Popen[str], timeout: float = 10.0) -> None:
    """Stop a server child that exits when its stdin closes (killed after ``timeout``),
    and close its pipes."""
    if proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def _moto_server(host: str, tls: tuple[str, str] | None) -> Any:
    """moto's threaded server on a free port of ``host``, over TLS with ``tls``."""
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from moto.server import ThreadedMotoServer
    from werkzeug.serving import make_server

    if tls is None:
        return ThreadedMotoServer(ip_address=host, port=0, verbose=False)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*tls)

    class TLSMotoServer(ThreadedMotoServer):
        """moto's own server entry, with werkzeug's ``ssl_context`` (it takes none)."""

        def _server_entry(self) -> None:
            app = DomainDispatcherApplication(create_backend_app)
            self._server = make_server(
                self._ip_address,
                self._port,
                app,
                threaded=True,
                request_handler=MotoRequestHandler,
                ssl_context=context,
            )
            self._server_ready_event.set()
            self._server.serve_forever()

    return TLSMotoServer(ip_address=host, port=0, verbose=False)


def _serve(host: str, tls: tuple[str, str] | None) -> None:
    """Child-process entry: serve until stdin closes (the parent closed it or died)."""
    _moto_ranges.install()
    server = _moto_server(host, tls)
    server.start()
    bound_host, port = server.get_host_and_port()
    print(f"READY {bound_host} {port}", flush=True)
    sys.stdin.read()  # blocks until EOF
    server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="embedded S3 server (internal)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--cert")
    parser.add_argument("--key")
    args = parser.parse_args()
    _serve(args.host, (args.cert, args.key) if args.cert else None)
