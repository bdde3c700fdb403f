"""``python -m bench.localring``: the small ring against the default, on local files.

Issue 30 item 2's local side. ``ShardStream`` over a packed dataset as local files
(``--data``, by default ``bench.feed``'s realistic one, made by ``python -m bench.feed
--parts real``), a fresh process per run, ``--epochs`` epochs of plain iteration with the
first left out, under each of the settings: the default, the small ring's (window 64,
1 MiB blocks, K = 32, prefetch 56), and ``16mib``, the default before 1 MiB blocks (16
MiB blocks, K = 8, prefetch 16), the same in any tree. ``--baseline REV`` runs revision ``REV``'s
``asyncstream`` beside this tree's in the same rounds, the sides' order turned every
other round. Medians over ``--rounds``: MB/s, reads an epoch, the consumer's and the
engine's CPU seconds per GB, and the ring's size.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
DEFAULT = Path(os.environ.get("ASYNCSTREAM_BENCH_DATA", Path.home() / ".cache/asyncstream-bench"))
SETTINGS: dict[str, dict[str, Any]] = {
    "default": {},
    "small": {"window": 64, "chunk_bytes": 1 << 20, "inflight": 32, "prefetch": 56},
    # the default until issue 30 item 2: 16 MiB blocks, K = 8, twice K ahead
    "16mib": {"window": 64, "chunk_bytes": 16 << 20, "inflight": 8, "prefetch": 16},
}


def measure(data: str, settings: dict[str, Any], epochs: int) -> dict[str, float]:
    """Run in the child: the epochs after the first, as one measurement."""
    from asyncstream import ShardStream

    with ShardStream(data, seed=0, **settings) as stream:
        ring = stream.ring_bytes
        for epoch in range(epochs):
            if epoch == 1:
                fetch0 = stream.stats()["fetch"]
                cpu0, wall0, nbytes = time.process_time(), time.perf_counter(), 0
            stream.set_epoch(epoch)
            for sample in stream:
                if epoch >= 1:
                    nbytes += sum(len(v) for k, v in sample.items() if not k.startswith("__"))
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        fetch = stream.stats()["fetch"]
    gb = nbytes / 1e9
    return {
        "mb_per_s": nbytes / wall / 1e6,
        "reads_per_epoch": (fetch["requests"] - fetch0["requests"]) / (epochs - 1),
        "consumer_cpu_s_per_gb": cpu / gb,
        "engine_cpu_s_per_gb": (fetch["cpu_s"] - fetch0["cpu_s"]) / gb,
        "ring_mib": ring / 2**20,
    }


def main() -> None:
    sys.path.insert(0, str(ROOT))
    from bench._run import rounds_arguments, side_by_side

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(DEFAULT / "real-4000"), help="a packed folder")
    parser.add_argument("--settings", default="default,small", help="of: default, small, 16mib")
    parser.add_argument("--epochs", type=int, default=3, help="epochs a run (the first apart)")
    args = rounds_arguments(parser, lambda c: measure(c["data"], c["settings"], c["epochs"]))
    if args.epochs < 2:
        raise SystemExit("--epochs: at least 2 (the first is left out)")
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "data": args.data, "runs": {}}
    configs = {
        name: {"data": args.data, "settings": SETTINGS[name], "epochs": args.epochs}
        for name in args.settings.split(",")
    }
    _, named = side_by_side(HERE, configs, args.baseline, args.rounds)
    runs = {f"{side}, {name}": rows for (side, name), rows in named.items()}
    print(
        "| side, settings | MB/s | rounds | reads an epoch | consumer / engine CPU-s per GB "
        "| ring MiB |\n|---|---:|---|---:|---:|---:|"
    )
    for label, rows in runs.items():
        med = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
        out["runs"][label] = {"median": med, "rounds": rows}
        spread = ", ".join(f"{r['mb_per_s']:.0f}" for r in rows)
        print(
            f"| {label} | {med['mb_per_s']:.0f} | {spread} | {med['reads_per_epoch']:.0f} | "
            f"{med['consumer_cpu_s_per_gb']:.2f} / {med['engine_cpu_s_per_gb']:.2f} | "
            f"{med['ring_mib']:.0f} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
