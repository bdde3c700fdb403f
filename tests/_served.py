"""A running ``asyncstream serve`` for the tests (``test_serve``, ``test_security_process``)."""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from asyncstream import S3Options
from asyncstream.stores._s3 import sync_client
from asyncstream.testing._local import wait_for_line


def _command() -> list[str]:
    script = Path(sys.executable).with_name("asyncstream")  # the installed console script
    return [str(script)] if script.exists() else [sys.executable, "-m", "asyncstream.cli"]


class Served:
    """A running ``asyncstream serve`` and the environment it printed."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [*_command(), "serve", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = wait_for_line(self.proc.stdout, "export ", 120)
        if line is None:
            self.proc.kill()
            _, err = self.proc.communicate()
            raise AssertionError(f"serve printed no export line; stderr: {err[-3000:]}")
        assert line.startswith("export ")
        self.env = dict(item.split("=", 1) for item in shlex.split(line.removeprefix("export ")))

    @property
    def endpoint_url(self) -> str:
        return self.env["AWS_ENDPOINT_URL"]

    def stop(self, signum: int = signal.SIGTERM) -> tuple[int, str]:
        """Send ``signum``; the exit status and stderr."""
        self.proc.send_signal(signum)
        try:
            _, err = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            raise
        return self.proc.returncode, err

    def client(self) -> Any:
        """A botocore client of the server, as its printed environment says."""
        return sync_client(S3Options(endpoint_url=self.endpoint_url).resolve())
