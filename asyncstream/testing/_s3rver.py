"""s3rver, a second S3 implementation for tests and benchmarks (Node.js, from npm), beside moto.

An independent server catches what one implementation's quirks hide: s3rver is a
filesystem-backed S3 written in JavaScript that checks SigV4 signatures against its one
key pair (``S3RVER`` / ``S3RVER``) and, unlike moto and S3, ignores ``If-Match`` on GET.

:func:`install` puts s3rver |VERSION| into a cache folder once (``npm install --prefix``,
preferring npm's offline cache), shared by every test session of this user, under a file
lock. :class:`S3rver` runs it on a free loopback port (HTTP, or HTTPS with a test
certificate) in a child process that exits when its stdin closes, so it cannot outlive a
test process killed with SIGKILL. Anything missing (node, npm, the package registry)
raises :class:`S3rverUnavailable`, which the fixtures turn into a skip with the reason. An
s3rver that is installed but does not start raises :class:`S3rverStartError` instead, which
fails the run: a broken second server must not quietly turn its tests into skips.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from ..stores._s3 import S3Credentials, S3Options, sync_client
from ._local import stop_child, wait_for_line
from ._npm import NpmUnavailable, npm_cache_folder, npm_install
from ._served import Served

__all__ = [
    "CREDENTIALS",
    "VERSION",
    "S3rver",
    "S3rverStartError",
    "S3rverUnavailable",
    "cache_folder",
    "install",
]

VERSION = "3.7.1"
CREDENTIALS = S3Credentials("S3RVER", "S3RVER")  # s3rver's one key pair

_START_TIMEOUT = 30.0
# Runs s3rver's own command line, and exits when stdin closes (the test process ended).
_WATCHDOG = "process.stdin.on('end', () => process.exit(0)).resume(); require(process.argv[1]);"


class S3rverUnavailable(Exception):
    """s3rver cannot be installed here (no Node.js or npm, or offline with nothing cached);
    the message says why."""


class S3rverStartError(RuntimeError):
    """s3rver is installed but did not start: a failure, not a reason to skip."""


def cache_folder() -> Path:
    """Where s3rver is installed: ``$XDG_CACHE_HOME`` (or ``~/.cache``) /asyncstream-tests."""
    return npm_cache_folder("s3rver", VERSION)


def install(folder: Path | None = None) -> Path:
    """s3rver's script, installed from npm into ``folder`` first if need be
    (:func:`~._npm.npm_install`).

    Raises:
        S3rverUnavailable: no ``node`` or ``npm`` on PATH, or the install failed (offline
            with nothing cached, say).
    """
    try:
        return npm_install("s3rver", VERSION, "bin/s3rver.js", folder)
    except NpmUnavailable as exc:
        raise S3rverUnavailable(str(exc)) from None


class S3rver(Served):
    """s3rver on a free port of 127.0.0.1, as a context manager.

    Args:
        directory: where it keeps buckets and objects (and its log, ``s3rver.log``).
        tls: ``(cert_pem, key_pem)`` to serve HTTPS.
        ca_bundle: the CA of ``tls``'s certificate, for :meth:`options`.

    Attributes:
        endpoint_url: ``http://127.0.0.1:PORT`` (``https://`` with ``tls``) once started.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        tls: tuple[str, str] | None = None,
        ca_bundle: str | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.tls = tls
        self.ca_bundle = ca_bundle
        self.endpoint_url = ""
        self._proc: subprocess.Popen[str] | None = None

    def start(self) -> S3rver:
        """Install if need be, start, and wait until it listens (once).

        Raises:
            S3rverUnavailable: it cannot be installed.
            S3rverStartError: it is installed but does not start (the message holds the
                end of its log).
        """
        if self._proc is not None:
            return self
        script = install()
        data = self.directory / "data"
        data.mkdir(parents=True, exist_ok=True)
        tls = ["--cert", self.tls[0], "--key", self.tls[1]] if self.tls else []
        command = ["node", "-e", _WATCHDOG, "--", str(script), "-d", str(data)]
        command += ["-a", "127.0.0.1", "-p", "0", "--silent", *tls]
        with open(self.directory / "s3rver.log", "a") as log:
            self._proc = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True
            )
        assert self._proc.stdout is not None
        line = wait_for_line(self._proc.stdout, "S3rver listening on ", _START_TIMEOUT)
        if line is None:
            # Its output ended (it exited) or the time ran out. An exit closes the pipe a
            # moment before its status can be had: a plain poll() there said "did not
            # start within 30 s" of a node that had exited with code 3 (under load).
            try:
                code: int | None = self._proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                code = None
            self.close()
            log_tail = (self.directory / "s3rver.log").read_text()[-500:]
            how = f"exited with code {code}" if code is not None else "did not start within "
            how += "" if code is not None else f"{_START_TIMEOUT:.0f} s"
            raise S3rverStartError(f"s3rver {VERSION} is installed but {how}: {log_tail}")
        port = int(line.rsplit(":", 1)[1])
        self.endpoint_url = f"{'https' if self.tls else 'http'}://127.0.0.1:{port}"
        return self

    @property
    def pid(self) -> int | None:
        """The server's (node's) process id once started, else None."""
        return self._proc.pid if self._proc is not None else None

    def options(self, **overrides: Any) -> S3Options:
        """:class:`S3Options` for this server: its credentials and CA, resolved."""
        settings: dict[str, Any] = {
            "endpoint_url": self.endpoint_url,
            "credentials": CREDENTIALS,
            "ca_bundle": self.ca_bundle,
            **overrides,
        }
        return S3Options(**settings).resolve()

    def client(self) -> Any:
        """A synchronous botocore client for this server."""
        return sync_client(self.options())

    def close(self) -> None:
        """Stop the server (its stdin closes: it exits); safe to call more than once."""
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_child(proc)
