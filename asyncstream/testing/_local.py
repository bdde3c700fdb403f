"""An embedded S3-compatible server (moto's server mode) on a free loopback port.

Used by ``asyncstream demo``, ``asyncstream serve``, the benchmark and the tests, so that
everything runs with no cloud account. Two modes:

* ``"thread"``: moto's werkzeug server in a thread of this process. Starts in
  milliseconds; right for tests. moto keeps its state per process, so thread-mode
  servers of one process share their buckets, and closing one resets them all.
* ``"process"``: the same server in a child process (``_s3child.py``), so that serving
  bytes does not compete for this process's GIL; right for the demo and benchmarks. The
  child exits when its stdin closes, so it cannot outlive a parent killed with SIGKILL. If
  it fails to start, the error carries the end of what it wrote on stderr.

The server is closed to web browsers and to moto's admin endpoints (:mod:`._guard`):
only :meth:`LocalS3.reset` knows the random token that opens ``/moto-api/reset``. It
checks no signature (but with ``require_auth``): whoever reaches its port reads and
writes every bucket, so it listens on loopback unless told otherwise.

``tls=(cert_pem, key_pem)`` serves HTTPS instead (werkzeug's ``ssl_context``), in either
mode, for tests of TLS against moto (see :func:`asyncstream.testing.make_test_certificates`).

Ranged GETs read only their range (:mod:`._moto_ranges`, where the installed moto is one
it was written against; moto itself reads the whole object and slices it). Objects are
held in the server's memory; :meth:`LocalS3.close` resets it, so nothing is left behind
(moto spills large objects to anonymous temporary files, which the reset closes).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import ssl
import subprocess
import tempfile
import threading
import urllib.request
import warnings
from typing import IO, Any, Literal

from ..engine._launch import python_command
from ..stores._s3 import S3Credentials, S3Options, sync_client
from . import _moto_ranges
from ._guard import ADMIN_HEADER, ADMIN_TOKEN_ENV
from ._motoserver import MotoServer, require_moto
from ._served import Served

__all__ = ["LOCAL_CREDENTIALS", "LocalS3", "stop_child", "wait_for_line"]

LOCAL_CREDENTIALS = S3Credentials("asyncstream-local", "asyncstream-local")
"""What :meth:`LocalS3.options` signs with (the server takes any signature)."""

_START_TIMEOUT = 60.0
_STDERR_TAIL = 4000  # characters of a failed child's stderr that its error carries
_relayed: set[str] = set()  # warnings of children already raised again in this process


class LocalS3(Served):
    """A local S3 server, as a context manager.

    Example::

        with LocalS3() as s3:
            client = s3.client()
            client.create_bucket(Bucket="data")

    Args:
        mode: ``"thread"`` (in this process) or ``"process"`` (a child process).
        host: the address to bind (loopback by default: the server checks no signature).
        port: the port to bind; ``0`` (the default) for a free one.
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
        port: int = 0,
        require_auth: bool = False,
        tls: tuple[str, str] | None = None,
        ca_bundle: str | None = None,
    ):
        if mode not in ("thread", "process"):
            raise ValueError(f"mode must be 'thread' or 'process', got {mode!r}")
        if require_auth and mode != "process":
            raise ValueError("require_auth=True needs mode='process' (moto reads it per process)")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"port must be an int in [0, 65535], got {port!r}")
        self.mode = mode
        self.port = port
        self.require_auth = require_auth
        self.host = host
        self.tls = tls
        self.ca_bundle = ca_bundle
        self._server: MotoServer | None = None
        self._proc: subprocess.Popen[str] | None = None
        self._stderr: IO[bytes] | None = None
        self._endpoint: str | None = None
        self._closed = False
        self._admin_token = secrets.token_urlsafe(32)  # opens /moto-api/ for reset()

    def __repr__(self) -> str:
        state = "closed" if self._closed else (self._endpoint or "not started")
        return f"LocalS3(mode={self.mode!r}, {state})"

    @property
    def pid(self) -> int | None:
        """The server's process id in ``"process"`` mode once started; None otherwise
        (in ``"thread"`` mode the server is this process)."""
        return self._proc.pid if self._proc is not None else None

    @property
    def endpoint_url(self) -> str:
        """The server's URL; ``RuntimeError`` before :meth:`start`."""
        if self._endpoint is None:
            raise RuntimeError("LocalS3 is not running: call start() or use it in a with block")
        return self._endpoint

    def start(self) -> LocalS3:
        """Start the server and wait until it answers. Returns ``self``.

        Raises:
            ImportError: moto's server is not installed; the message says what to install.
            OSError: the address cannot be bound (thread mode).
            RuntimeError: the server did not start (process mode: the message ends with
                what the child wrote on stderr), or this server was closed.
        """
        if self._closed:
            raise RuntimeError("this LocalS3 was closed; make a new one")
        if self._endpoint is not None:
            return self
        if self.mode == "thread":
            # One line per request on stderr is noise for an embedded server.
            logging.getLogger("werkzeug").setLevel(logging.WARNING)
            require_moto()
            _moto_ranges.install()
            server = MotoServer(self.host, self.port, self.tls, self._admin_token)
            server.start()
            self._server = server
            host, port = server.get_host_and_port()
        else:
            host, port = self._start_process()
        self._endpoint = f"{'https' if self.tls else 'http'}://{host}:{port}"
        return self

    def _start_process(self) -> tuple[str, int]:
        require_moto()  # here, where its message reaches the caller as it is
        # -P: nothing imported from the working directory (see python_command).
        command, env = python_command(
            "asyncstream.testing._s3child", "--host", self.host, "--port", str(self.port)
        )
        env[ADMIN_TOKEN_ENV] = self._admin_token  # not on the command line: ps shows it
        if self.require_auth:
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = "0"
        tls = ["--cert", self.tls[0], "--key", self.tls[1]] if self.tls else []
        # stderr to a file, not a pipe: nobody drains it while the server runs.
        self._stderr = tempfile.TemporaryFile(prefix="asyncstream-local-s3-")  # noqa: SIM115
        proc = subprocess.Popen(
            [*command, *tls],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        self._proc = proc
        if proc.stdout is None:
            raise RuntimeError("no pipe to the local S3 server")
        lines, ended = _read_until(proc.stdout, "READY ", _START_TIMEOUT)
        for line in lines:
            if line.startswith("WARNING ") and line not in _relayed:
                _relayed.add(line)
                warnings.warn(line[8:].strip(), _moto_ranges.MotoRangesWarning, stacklevel=3)
        if not lines or not lines[-1].startswith("READY "):
            self._proc = None
            stop_child(proc)  # first, so that its stderr is complete
            tail = self._stderr_tail()
            self._stop_process()
            what = (
                f"exited with status {proc.returncode}"
                if ended
                else f"did not start within {_START_TIMEOUT:.0f} s"
            )
            raise RuntimeError(
                f"the local S3 server ({' '.join(command)}) {what}; "
                f"its stderr ends with:\n{tail or '(nothing)'}"
            )
        _, host, port = lines[-1].split()
        return host, int(port)

    def _stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0, os.SEEK_END)
        size = self._stderr.tell()
        self._stderr.seek(max(0, size - _STDERR_TAIL))
        return self._stderr.read().decode(errors="replace").strip()

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
        request = urllib.request.Request(
            f"{self.endpoint_url}/moto-api/reset",
            method="POST",
            headers={ADMIN_HEADER: self._admin_token},
        )
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
            self._server = None
        self._stop_process()
        self._endpoint = None

    def _stop_process(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_child(proc)
        stderr, self._stderr = self._stderr, None
        if stderr is not None:
            stderr.close()


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


def _read_until(stream: IO[str], prefix: str, timeout: float) -> tuple[list[str], bool]:
    """A child's output lines up to and including the first that starts with ``prefix``
    (all of them, if none does before the output ends or ``timeout`` seconds pass), and
    whether the reading ended (``False``: the time ran out)."""
    lines: list[str] = []
    done = threading.Event()

    def read() -> None:
        for line in stream:
            lines.append(line)
            if line.startswith(prefix):
                break
        done.set()

    threading.Thread(target=read, daemon=True).start()
    ended = done.wait(timeout)
    return list(lines), ended


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
