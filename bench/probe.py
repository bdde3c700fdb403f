"""``asyncstream probe`` on the benchmark's two nginx links: ``python -m bench.probe``.

The realistic dataset of ``bench.feed`` (ImageNet-sized JPEGs, ``--data``, generated and
packed there once by ``python -m bench.feed --parts real``) served by nginx
(:class:`asyncstream.testing.Nginx`), pinned to the last CPU while this process, and so
the probe and every process it starts, runs on the others, as ``python -m bench
--profile nginx`` runs (:mod:`bench._nginx`); once on an unshaped loopback link (*fast*)
and once on the S3-like one (20 to 50 ms to the first byte, 90 MB/s per connection).
Prints each report in words and writes both as JSON (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from asyncstream.probe import probe, render
from asyncstream.testing import NetworkProfile, Nginx

from ._nginx import _cpus
from .feed import DEFAULT_DATA

LINKS = {"fast": None, "s3-like": NetworkProfile.s3_like()}


def run(data: Path, seconds: float, decode: bool) -> dict[str, Any]:
    """Both links' reports, by link name."""
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-probe-") as tmp:
        bucket = Path(tmp) / "bench"
        bucket.mkdir()
        for path in data.iterdir():  # linked, not copied: nginx serves the same files
            if path.is_file():
                os.link(path, bucket / path.name)
        server_cpu, reader_cpus = _cpus()
        before = os.sched_getaffinity(0)
        for name, profile in LINKS.items():
            with Nginx(Path(tmp), profile=profile, cpu=server_cpu) as nginx:
                os.sched_setaffinity(0, reader_cpus)
                try:
                    report = probe("s3://bench/", nginx.options(), seconds=seconds, decode=decode)
                finally:
                    os.sched_setaffinity(0, before)
            report["link"] = name
            report["pinning"] = {"server_cpu": server_cpu, "reader_cpus": sorted(reader_cpus)}
            out[name] = report
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.probe", description=__doc__)
    parser.add_argument(
        "--data",
        type=Path,
        default=DEFAULT_DATA / "real-4000",
        help="the packed shards to serve (default: bench.feed's realistic dataset)",
    )
    parser.add_argument("--seconds", type=float, default=30.0, help="each probe's budget")
    parser.add_argument("--no-decode", action="store_true", help="skip the feed and DALI")
    parser.add_argument("--out", type=Path, default=Path("probe.json"), help="the JSON")
    args = parser.parse_args()
    out = run(args.data, args.seconds, not args.no_decode)
    for name, report in out.items():
        print(f"## {name} link (nginx on CPU {report['pinning']['server_cpu']})\n")
        print(render(report), "\n", flush=True)
    args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
