"""What every scenario of ``python -m bench`` is given: the run's sizes, the dataset and
server (:class:`Bench`), and the stream settings they share.

Apart from the harness (:mod:`bench.harness`), which runs the scenarios, so that the
scenarios in modules of their own (:mod:`bench.mixing`, :mod:`bench.cpudecode`) stand on
this module and not on the harness that imports them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncstream import S3Options, shuffle_quality

from ._proxy import ProxyProcess

if TYPE_CHECKING:
    from ._nginx import NginxLink

__all__ = [
    "CHUNK",
    "FULL",
    "LOADER_SETTINGS",
    "MB",
    "QUICK",
    "ROOT",
    "Bench",
    "Sizes",
    "stream_settings",
]

ROOT = Path(__file__).resolve().parent
MB = 1e6
CHUNK = 4 << 20
FAULT_RATES = (0.0, 0.01, 0.05, 0.10, 0.20)
KS = (1, 2, 4, 8, 16)


@dataclass
class Sizes:
    """How big a run is."""

    images: int
    shards: int
    dali_images: int
    repeat: int
    shuffle_memories: tuple[int, ...]
    shuffle_seeds: int
    ks: tuple[int, ...] = KS
    fault_rates: tuple[float, ...] = FAULT_RATES


FULL = Sizes(4800, 32, 2560, 2, (1_000, 5_000, 10_000, 20_000, 50_000), 2)
QUICK = Sizes(160, 8, 128, 1, (1_000, 10_000), 1, ks=(1, 4), fault_rates=(0.0, 0.10))


@dataclass
class Bench:
    """The dataset and the server every scenario reads."""

    args: argparse.Namespace
    sizes: Sizes
    workdir: Path
    options: S3Options  # direct to the server
    url: str  # the tar shards
    upstream: str | None  # the http endpoint a proxy can sit in front of, if any
    server_pid: int | None = None  # the embedded server's process, for its CPU time
    index_of: dict[str, int] = field(default_factory=dict)  # key -> position when stored
    dataset: dict[str, Any] = field(default_factory=dict)
    link: NginxLink | None = None  # the nginx profile's server (bench._nginx), once up

    @property
    def served_pid(self) -> int | None:
        """The process that serves the scenario's reads: nginx on its profile, else the
        embedded server (behind the proxy, whose CPU is counted apart)."""
        return self.link.pid if self.link is not None else self.server_pid

    @contextlib.contextmanager
    def endpoint(self, **proxy: Any) -> Iterator[tuple[S3Options, ProxyProcess | None]]:
        """Options for the scenario's network: nginx on the ``nginx`` profile; otherwise,
        and for faults or a capacity (which nginx does not inject), through the fault
        proxy (the S3-like link under the ``nginx`` profile) where the store is reachable
        over plain HTTP."""
        if self.link is not None and not proxy:
            yield self.link.options, None
            return
        if self.upstream is None:
            yield self.options, None
            return
        profile = "s3-like" if self.args.profile == "nginx" else self.args.profile
        with ProxyProcess(self.upstream, profile=profile, **proxy) as p:
            yield replace(self.options, endpoint_url=p.endpoint_url), p

    def quality(self, keys: list[str], labels: list[int]) -> dict[str, float]:
        q = shuffle_quality([self.index_of[k] for k in keys], labels, batch_size=64)
        return {
            "abs_correlation": abs(q.correlation),
            "distinct_classes_per_batch": q.distinct_classes_per_batch,
        }

    def child_env(self, options: S3Options) -> dict[str, str]:
        env = dict(os.environ)
        creds = options.credentials
        if creds is not None:
            env["AWS_ACCESS_KEY_ID"] = creds.access_key_id
            env["AWS_SECRET_ACCESS_KEY"] = creds.secret_access_key
        env.setdefault("AWS_DEFAULT_REGION", options.region_name or "us-east-1")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT.parent), env.get("PYTHONPATH")]))
        return env

    def read(
        self, options: S3Options, epochs: int = 1, url: str | None = None, **stream: Any
    ) -> dict[str, Any]:
        """One epoch of asyncstream without decode, in a process of its own (see
        :func:`bench.loader.read_epoch` for ``epochs``), of the dataset or its copy ``url``."""
        config = {
            "url": url or self.url,
            "endpoint_url": options.endpoint_url,
            "epochs": epochs,
            "stream": stream,
        }
        spec = self.workdir / "loader-spec.json"
        out = self.workdir / "loader-out.json"
        spec.write_text(json.dumps(config))
        subprocess.run(
            [sys.executable, "-m", "bench.loader", str(spec), str(out)],
            check=True,
            env=self.child_env(options),
            timeout=900,
        )
        result: dict[str, Any] = json.loads(out.read_text())
        if sorted(result["keys"]) != sorted(self.index_of):
            raise RuntimeError("asyncstream did not read every sample exactly once")
        return result


def stream_settings(inflight: int = 8, **more: Any) -> dict[str, Any]:
    """asyncstream's settings in the throughput scenarios: 4 MiB chunks, 16 shards open."""
    return {"chunk_bytes": CHUNK, "window": 16, "inflight": inflight, "seed": 0, **more}


# Against the peers: chunks small enough that every shard of the dataset can be open at
# once (32 shards of 16 MB here) in a ring of about 100 MiB.
LOADER_SETTINGS: dict[str, Any] = {"chunk_bytes": 2 << 20, "window": 32, "inflight": 8, "seed": 0}
