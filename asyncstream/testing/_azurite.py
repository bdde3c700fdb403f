"""Azurite, Microsoft's Azure Storage emulator (Node.js, from npm), for the Azure Blob store.

:func:`install` puts Azurite |VERSION| into a cache folder once (``npm install --prefix``,
preferring npm's offline cache), shared by every test session of this user, under a file
lock, as :mod:`._s3rver` does for s3rver. :class:`Azurite` runs its blob service
(``azurite-blob``) on a free loopback port with a temporary workspace, in a child process
that exits when its stdin closes, so it cannot outlive a test process killed with SIGKILL.
It starts with ``--loose`` (unsupported headers ignored), ``--skipApiVersionCheck`` (the
Python SDK may speak a newer service version than this Azurite knows) and
``--disableTelemetry``.

Azurite serves the well-known development account :data:`ACCOUNT` with its published key
:data:`KEY`, path-style: ``http://127.0.0.1:PORT/devstoreaccount1/container/blob``.

Anything missing (node, npm, the package registry) raises :class:`AzuriteUnavailable`,
which the fixtures turn into a skip with the reason. An Azurite that is installed but does
not start raises :class:`AzuriteStartError` instead, which fails the run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from ..stores._azure import DEV_ACCOUNT, DEV_KEY
from ._local import stop_child, wait_for_line
from ._npm import NpmUnavailable, npm_cache_folder, npm_install
from ._served import Served

__all__ = [
    "ACCOUNT",
    "KEY",
    "VERSION",
    "Azurite",
    "AzuriteStartError",
    "AzuriteUnavailable",
    "cache_folder",
    "install",
]

VERSION = "3.37.0"
#: Azurite's development account and its published key (not a secret)
ACCOUNT = DEV_ACCOUNT
KEY = DEV_KEY

_START_TIMEOUT = 30.0
_READY = "Azurite Blob service successfully listens on "
# Runs azurite-blob's own command line, and exits when stdin closes (the test process ended).
_WATCHDOG = "process.stdin.on('end', () => process.exit(0)).resume(); require(process.argv[1]);"


class AzuriteUnavailable(Exception):
    """Azurite cannot be installed here (no Node.js or npm, or offline with nothing
    cached); the message says why."""


class AzuriteStartError(RuntimeError):
    """Azurite is installed but did not start: a failure, not a reason to skip."""


def cache_folder() -> Path:
    """Where Azurite is installed: ``$XDG_CACHE_HOME`` (or ``~/.cache``) /asyncstream-tests."""
    return npm_cache_folder("azurite", VERSION)


def install(folder: Path | None = None) -> Path:
    """Azurite's script, installed from npm into ``folder`` first if need be
    (:func:`~._npm.npm_install`).

    Raises:
        AzuriteUnavailable: no ``node`` or ``npm`` on PATH, or the install failed (offline
            with nothing cached, say).
    """
    try:
        return npm_install("azurite", VERSION, "dist/src/blob/main.js", folder)
    except NpmUnavailable as exc:
        raise AzuriteUnavailable(str(exc)) from None


class Azurite(Served):
    """Azurite's blob service on a free port of 127.0.0.1, as a context manager.

    Args:
        directory: its workspace (blobs, metadata and its log, ``azurite.log``); a
            temporary folder, removed on :meth:`close`, when not given.
        in_memory: keep blobs in memory rather than in ``directory``.

    Attributes:
        endpoint_url: ``http://127.0.0.1:PORT/devstoreaccount1`` once started: the account's
            blob endpoint (what ``configure_store("az", endpoint=...)`` takes).
    """

    def __init__(
        self, directory: str | os.PathLike[str] | None = None, *, in_memory: bool = False
    ) -> None:
        self._temporary = directory is None
        self.directory = Path(directory) if directory is not None else None
        self.in_memory = in_memory
        self.endpoint_url = ""
        self.port = 0
        self._proc: subprocess.Popen[str] | None = None

    def start(self) -> Azurite:
        """Install if need be, start, and wait until it listens (once).

        Raises:
            AzuriteUnavailable: it cannot be installed.
            AzuriteStartError: it is installed but does not start (the message holds the
                end of its log).
        """
        if self._proc is not None:
            return self
        script = install()
        if self.directory is None:
            self.directory = Path(tempfile.mkdtemp(prefix="asyncstream-azurite-"))
        workspace = self.directory / "data"
        workspace.mkdir(parents=True, exist_ok=True)
        command = ["node", "-e", _WATCHDOG, "--", str(script), "--blobHost", "127.0.0.1"]
        command += ["--blobPort", "0", "--loose", "--skipApiVersionCheck", "--silent"]
        command += ["--disableTelemetry", "--disableProductStyleUrl"]
        # In memory, Azurite refuses a --location (its workspace is then the current folder).
        command += ["--inMemoryPersistence"] if self.in_memory else ["--location", str(workspace)]
        log_path = self.directory / "azurite.log"
        with open(log_path, "a") as log:
            self._proc = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                cwd=workspace,
            )
        assert self._proc.stdout is not None
        line = wait_for_line(self._proc.stdout, _READY, _START_TIMEOUT)
        if line is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=1.0)  # an exit, if it is exiting, has its code
            code = self._proc.poll()
            self.close()
            log_tail = log_path.read_text()[-500:] if log_path.exists() else ""
            how = f"exited with code {code}" if code is not None else "did not start within "
            how += "" if code is not None else f"{_START_TIMEOUT:.0f} s"
            raise AzuriteStartError(f"Azurite {VERSION} is installed but {how}: {log_tail}")
        self.port = int(line.strip().rsplit(":", 1)[1])
        self.endpoint_url = f"http://127.0.0.1:{self.port}/{ACCOUNT}"
        return self

    @property
    def pid(self) -> int | None:
        """The server's (node's) process id once started, else None."""
        return self._proc.pid if self._proc is not None else None

    @property
    def connection_string(self) -> str:
        """A connection string for this server (``AZURE_STORAGE_CONNECTION_STRING``)."""
        return (
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
            f"BlobEndpoint={self.endpoint_url};"
        )

    def settings(self, **overrides: Any) -> dict[str, Any]:
        """The settings of ``configure_store("az", **settings)`` for this server: its
        endpoint, account and key (``overrides`` replace or add some)."""
        return {"endpoint": self.endpoint_url, "account": ACCOUNT, "key": KEY, **overrides}

    def create_container(self, name: str) -> None:
        """Make a container (an existing one is fine), with the SDK of the ``azure`` extra."""
        from azure.core.exceptions import ResourceExistsError
        from azure.storage.blob import BlobServiceClient

        service = BlobServiceClient(
            self.endpoint_url, credential={"account_name": ACCOUNT, "account_key": KEY}
        )
        try:
            service.create_container(name)
        except ResourceExistsError:
            pass
        finally:
            service.close()

    def close(self) -> None:
        """Stop the server (its stdin closes: it exits) and remove a temporary workspace;
        safe to call more than once."""
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_child(proc)
        if self._temporary and self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None
