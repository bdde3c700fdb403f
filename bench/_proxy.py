"""The fault proxy in a process of its own, so its event loop does not share the GIL with
the reader being measured (in a thread of the benchmark it slows the consumer, not the
network).

The child takes its settings as JSON on the command line and answers ``stats`` lines on
its standard input with the proxy's counters as one JSON line; it closes the proxy and
exits when its standard input closes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from types import TracebackType
from typing import Any

_SERVE = (
    "import json, sys\n"
    "from asyncstream.testing import FaultPlan, FaultProxy, NetworkProfile\n"
    "cfg = json.loads(sys.argv[2])\n"
    "profile = NetworkProfile.s3_like() if cfg['profile'] == 's3-like' else None\n"
    "faults = FaultPlan(**cfg['faults']) if cfg['faults'] else None\n"
    "proxy = FaultProxy(sys.argv[1], profile=profile, faults=faults, seed=cfg['seed'],\n"
    "                   capacity=cfg['capacity']).start()\n"
    "print(proxy.endpoint_url, flush=True)\n"
    "for line in sys.stdin:\n"
    "    print(json.dumps(proxy.stats()), flush=True)\n"
    "proxy.close()\n"
)


class ProxyProcess:
    """A :class:`~asyncstream.testing.FaultProxy` in a child process.

    Args:
        upstream: the S3 server's URL.
        profile: ``"s3-like"`` (20 to 50 ms to first byte, 90 MB/s per connection) or
            ``"loopback"`` (no shaping).
        faults: keyword arguments of a :class:`~asyncstream.testing.FaultPlan`, or None.
        capacity: the most GETs served at once (beyond it: 503 SlowDown), or None.
        seed: the proxy's seed.
    """

    def __init__(
        self,
        upstream: str,
        *,
        profile: str = "s3-like",
        faults: dict[str, Any] | None = None,
        capacity: int | None = None,
        seed: int = 0,
    ) -> None:
        config = {"profile": profile, "faults": faults, "capacity": capacity, "seed": seed}
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _SERVE, upstream, json.dumps(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._proc.stdout is not None
        self.endpoint_url = self._proc.stdout.readline().strip()
        if not self.endpoint_url.startswith("http://"):
            self.close()
            raise RuntimeError("the proxy process did not start")

    def stats(self) -> dict[str, int]:
        """The proxy's counters (see :meth:`FaultProxy.stats`)."""
        assert self._proc.stdin is not None
        assert self._proc.stdout is not None
        self._proc.stdin.write("stats\n")
        self._proc.stdin.flush()
        counts: dict[str, int] = json.loads(self._proc.stdout.readline())
        return counts

    def close(self) -> None:
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            self._proc.stdin.close()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
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
