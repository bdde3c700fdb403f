"""The fault proxy in a process of its own, so its event loop does not share the GIL with
the reader being measured (in a thread of the benchmark it slows the consumer, not the
network)."""

from __future__ import annotations

import subprocess
import sys
from types import TracebackType

_SERVE = (
    "import sys\n"
    "from asyncstream.testing import FaultProxy, NetworkProfile\n"
    "proxy = FaultProxy(sys.argv[1], profile=NetworkProfile.s3_like()).start()\n"
    "print(proxy.endpoint_url, flush=True)\n"
    "sys.stdin.read()\n"
    "proxy.close()\n"
)


class ProxyProcess:
    """An S3-like :class:`~asyncstream.testing.FaultProxy` in a child process."""

    def __init__(self, upstream: str) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _SERVE, upstream],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._proc.stdout is not None
        self.endpoint_url = self._proc.stdout.readline().strip()
        if not self.endpoint_url.startswith("http://"):
            self.close()
            raise RuntimeError("the proxy process did not start")

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        self._proc.wait(10)
        if self._proc.stdout is not None:
            self._proc.stdout.close()

    def __enter__(self) -> ProxyProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
