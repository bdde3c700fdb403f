"""``python -m bench.blenddraw``: a mixed stream's draw, per sample, before and after.

Two figures, each side by side with the reference in the same rounds (medians):

- **the draw alone**: a :class:`~asyncstream.order._shuffle.WindowShuffle` with a
  :class:`~asyncstream.order._mix.Blend` over ``--sources`` sources (``--pieces`` pieces of
  ``--piece`` samples, in chunks of ``--chunk``, window ``--window``, ``shards`` mode, the
  stream's default), drained by ``draw_many(--run)`` as ``take`` drains it: the native
  draw (``after``) against the Python one, a ``draw`` per sample (``before``: what
  ``draw_many`` did with a blend before the native blended draw). The driver's opens,
  refills and closes are in both; the time inside ``draw_many`` is reported apart.
- **take** (``--baseline REV``): a mixed ``ShardStream`` of two sources, the same local
  folder (``--url``) given twice, read with ``iter_views().take(--run, sink)`` for
  ``--epochs`` epochs (the first left out): the consumer process's CPU per sample, with
  this tree (``after``) and with git revision ``REV`` (``before``; its C extensions built in
  place in a temporary folder), each a fresh process per round.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
DEFAULT = Path(os.environ.get("ASYNCSTREAM_BENCH_DATA", Path.home() / ".cache/asyncstream-bench"))
SETTINGS: dict[str, Any] = {"window": 16, "inflight": 8, "chunk_bytes": 8 << 20, "seed": 0}


def drain(args: argparse.Namespace, native: bool) -> tuple[float, float, int]:
    """One epoch of the blended window: (seconds in all, seconds in draw_many, samples)."""
    from asyncstream.order import _shuffle
    from asyncstream.order._mix import Blend
    from asyncstream.order._shuffle import WindowShuffle, mix_key

    groups = [p % args.sources for p in range(args.pieces)]
    totals = [groups.count(g) * args.piece for g in range(args.sources)]
    shuffle: WindowShuffle[int] = WindowShuffle(
        args.pieces,
        window=args.window,
        key=mix_key(0, 0),
        mode="shards",
        groups=groups,
        blend=Blend(totals),
    )
    next_start: dict[int, int] = {}

    def chunk(piece: int, start: int) -> list[int]:
        stop = min(start + args.chunk, args.piece)
        next_start[piece] = stop
        return list(range(piece * args.piece + start, piece * args.piece + stop))

    saved, _shuffle.NATIVE = _shuffle.NATIVE, native
    clock = time.perf_counter
    drawing, samples = 0.0, 0
    start = clock()
    try:
        while True:
            need = shuffle.need()
            if need.kind == "draw":
                t0 = clock()
                indices, _ = shuffle.draw_many(args.run)
                drawing += clock() - t0
                samples += len(indices)
            elif need.kind == "refill":
                piece = shuffle.lanes[need.lane].piece
                if next_start[piece] < args.piece:
                    shuffle.refill(need.lane, chunk(piece, next_start[piece]))
                else:
                    shuffle.close(need.lane)
            elif need.kind == "open":
                shuffle.open(chunk(need.piece, 0))
            else:
                break
    finally:
        _shuffle.NATIVE = saved
    return clock() - start, drawing, samples


def draw_alone(args: argparse.Namespace) -> dict[str, Any]:
    runs: dict[str, list[tuple[float, float, int]]] = {"before": [], "after": []}
    for round_ in range(args.rounds):
        for side in ("before", "after") if round_ % 2 == 0 else ("after", "before"):
            runs[side].append(drain(args, native=side == "after"))
    return {
        side: {
            "us_per_sample": statistics.median(t / n for t, _, n in rows) * 1e6,
            "draw_many_us_per_sample": statistics.median(d / n for _, d, n in rows) * 1e6,
            "samples": rows[0][2],
        }
        for side, rows in runs.items()
    }


def measure_take(url: str, epochs: int, run: int) -> dict[str, Any]:
    """Run in the child: a two-source stream read by ``take``, CPU per sample."""
    from asyncstream import ShardStream, Source

    sources = [Source(url, name="a"), Source(url, name="b")]
    rows = []
    with ShardStream(sources, index_cache=False, **SETTINGS) as stream:
        for epoch in range(epochs):
            stream.set_epoch(epoch)
            views = stream.iter_views()
            cpu0, wall0 = time.process_time(), time.perf_counter()
            samples = 0
            while True:
                got = views.take(run, lambda _v, _u, _r: True)
                if got == 0:
                    break
                samples += got
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            rows.append(
                {
                    "samples": samples,
                    "consumer_us_per_sample": cpu / samples * 1e6,
                    "samples/s": samples / wall,
                }
            )
    steady = rows[1:] or rows
    return {key: statistics.median(r[key] for r in steady) for key in steady[0]}


def take_sides(args: argparse.Namespace, base: Path | None) -> dict[str, Any]:
    sides = {"after": ROOT} if base is None else {"before": base, "after": ROOT}
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    config = json.dumps({"url": args.url, "epochs": args.epochs, "run": args.run})
    for round_ in range(args.rounds):
        for side in list(sides) if round_ % 2 == 0 else list(reversed(sides)):
            done = subprocess.run(
                [sys.executable, str(HERE), "--child", config],
                env={**os.environ, "PYTHONPATH": str(sides[side])},
                cwd=sides[side],
                check=True,
                capture_output=True,
                text=True,
            )
            runs[side].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"take, round {round_}, {side}: {runs[side][-1]}", flush=True)
    return {
        side: {key: statistics.median(r[key] for r in rows) for key in rows[0]}
        for side, rows in runs.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=str(DEFAULT / "tiny-20000"), help="a local folder")
    parser.add_argument("--baseline", help="a git revision for take's before side")
    parser.add_argument("--no-take", action="store_true", help="the draw alone")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--run", type=int, default=256, help="samples asked per call")
    parser.add_argument("--sources", type=int, default=2)
    parser.add_argument("--pieces", type=int, default=200)
    parser.add_argument("--piece", type=int, default=1000)
    parser.add_argument("--chunk", type=int, default=250)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        config = json.loads(args.child)
        print(json.dumps(measure_take(config["url"], config["epochs"], config["run"])))
        return
    out: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "draw alone": draw_alone(args),
    }
    print(f"draw alone: {out['draw alone']}", flush=True)
    if not args.no_take:
        with tempfile.TemporaryDirectory() as tmp:
            from bench._run import baseline_tree

            base = baseline_tree(args.baseline, Path(tmp)) if args.baseline else None
            out["take"] = take_sides(args, base)
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
