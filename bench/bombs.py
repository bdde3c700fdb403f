"""Peak memory and time of hostile shards read as the stream reads them.

The reviewer's bombs (``asyncstream.testing._bombs``): a 3 KB shard whose GNU sparse
member claims 1 GiB (and 1 TiB), a gzip shard and a zstd shard of a few kilobytes that
expand to a 512 MiB member. Each is written to a file, then read in its own fresh
process, 1 MiB at a time through ``open_reader`` (the stream's reader, default limits),
with its address space capped at 3 GiB above its start so that an unbounded read ends in
a ``MemoryError`` instead of taking the machine. Printed per bomb and side: the shard's
size, the peak RSS over the child's start, the time and the outcome.

``--baseline REV`` reads the same files with git revision ``REV``'s ``asyncstream``
(``git archive``) in the same run::

    python -m bench.bombs --baseline dce28f0
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from asyncstream.testing._bombs import BOMBS

from ._run import baseline_tree

ROOT = Path(__file__).resolve().parent.parent
CASES = (("sparse", 1 << 30), ("sparse", 1 << 40), ("gzip", 512 << 20), ("zstd", 512 << 20))

CHILD = r"""
import json, resource, sys, time
from asyncstream import CorruptTarError
from asyncstream.shards._compressed import open_reader
path, url = sys.argv[1], sys.argv[2]
data = open(path, "rb").read()
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
vm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmSize"))
resource.setrlimit(resource.RLIMIT_AS, (vm * 1024 + (3 << 30),) * 2)
reader = open_reader(url, len(data))
began = time.perf_counter()
try:
    for at in range(0, len(data), 1 << 20):
        reader.records(data[at : at + (1 << 20)], at, final=at + (1 << 20) >= len(data))
    outcome = "read without error"
except CorruptTarError as exc:
    outcome = "CorruptTarError"
except MemoryError:
    outcome = "MemoryError"
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"peak_mib": (peak - base) / 1024, "seconds": time.perf_counter() - began,
                  "outcome": outcome}))
"""


def read_bomb(source: Path, path: Path, url: str) -> dict[str, Any]:
    """Read one bomb file in a fresh process with the ``asyncstream`` found in ``source``."""
    done = subprocess.run(
        [sys.executable, "-P", "-c", CHILD, str(path), url],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(source), "PATH": "/usr/bin:/bin"},
        timeout=600,
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        return {"peak_mib": float("nan"), "seconds": 0.0, "outcome": done.stderr[-200:]}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="a git revision to compare with, in the same run")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        sides = {"today": ROOT}
        if args.baseline:
            sides = {args.baseline: baseline_tree(args.baseline, Path(tmp)), **sides}
        for kind, size in CASES:
            build, suffix = BOMBS[kind]
            data = build(size)
            path = Path(tmp) / f"bomb-{kind}-{size}{suffix}"
            path.write_bytes(data)
            for side, source in sides.items():
                got = read_bomb(source, path, f"s3://bucket/bomb{suffix}")
                rows.append({"bomb": kind, "claims": size, "shard": len(data), "side": side, **got})
                print(
                    f"{kind:6} claims {size >> 20:>9,} MiB, shard {len(data):>9,} B | {side:>8}: "
                    f"peak +{got['peak_mib']:7.1f} MiB, {got['seconds']:6.2f} s, {got['outcome']}",
                    flush=True,
                )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
