"""``python -m bench.endtoend``: the CPU an ImageNet-sized image costs, engine + stream + feed.

What the loader spends to turn shards into DALI's encoded batches, with no decode: the
DALI loader's producer (``dali_ops._batch.read_batches``, batch 256, the image check at
``"markers"``) over ``--images`` generated photographs (about 107 kB each, 64 MiB shards,
:func:`bench.feed.real_shards`), read from local files and over HTTPS (the project's
:class:`~asyncstream.testing.WebServer` with a test CA, in this process, so its CPU is
not counted). Each figure is from a fresh child process per round: the CPU per image of
the reading process (the stream and the feed: ``time.process_time``) and of the fetch
engine's process (``stats()["fetch"]["cpu_s"]``), over the epochs after the first, and
their sum, the end-to-end figure.

Sides, interleaved in each round, medians over ``--rounds``: ``after`` (this tree),
``python`` (this tree with ``ASYNCSTREAM_NATIVE=0``: the Python references of the native
pieces) and, with ``--baseline REV``, ``before`` (revision ``REV``'s ``asyncstream`` and
``dali_ops``, extracted with ``git archive``; its C extensions, if it has any, built in
place).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
DEFAULT = Path(os.environ.get("ASYNCSTREAM_BENCH_DATA", Path.home() / ".cache/asyncstream-bench"))
BATCH = 256


def measure(url: str, ca: str | None, epochs: int) -> dict[str, Any]:
    """Run in the child: the producer's figures over ``epochs`` epochs, first one apart."""
    from asyncstream import ShardStream, configure_store
    from dali_ops._batch import BatchBuilder, read_batches

    if ca is not None:
        configure_store("https", ca_bundle=ca)
    builder = BatchBuilder(
        BATCH, on_error="raise", precheck="markers", image_keys=("jpg",), label_key="cls"
    )
    rows = []
    with ShardStream(url, window=16, inflight=8, seed=0, index_cache=False) as stream:
        seen = 0.0
        for epoch in range(epochs):
            stream.set_epoch(epoch)
            cpu0, wall0 = time.process_time(), time.perf_counter()
            images = sum(len(b) for b in read_batches(stream, builder, drop_last=False))
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            # The engine's CPU is cumulative, and a new epoch's statistics have none
            # until it runs: this epoch's is the difference from the last epoch's end.
            total = float(stream.stats()["fetch"]["cpu_s"])
            engine, seen = total - seen, total
            rows.append(
                {
                    "images": images,
                    "reader_us_per_image": cpu / images * 1e6,
                    "engine_us_per_image": engine / images * 1e6,
                    "total_us_per_image": (cpu + engine) / images * 1e6,
                    "images/s": images / wall,
                }
            )
    steady = rows[1:] or rows
    return {key: statistics.median(r[key] for r in steady) for key in steady[0]}


def _sources(shards: Path, tmp: Path, stack: Any) -> list[tuple[str, str, str | None]]:
    """(name, url, CA bundle) of each place the shards are read from."""
    from asyncstream.testing import WebServer, make_test_certificates

    certs = make_test_certificates(tmp / "certs")
    web = stack.enter_context(WebServer(shards, tls=certs.server))
    return [
        ("local files", str(shards), None),
        ("HTTPS, loopback", web.url + "/asyncstream.json", certs.ca),
    ]


def main() -> None:
    import contextlib

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=4000, help="generated photographs")
    parser.add_argument("--data", default=str(DEFAULT), help="where the shards are made once")
    parser.add_argument("--baseline", help="a git revision to compare with, in the same rounds")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--sides", default="after,python", help="after, python or both")
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        config = json.loads(args.child)
        print(json.dumps(measure(config["url"], config["ca"], config["epochs"])))
        return
    sys.path.insert(0, str(ROOT))
    from bench._run import baseline_tree, run_child
    from bench.feed import real_shards

    shards = real_shards(Path(args.data), args.images)
    out: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "images": args.images,
        "batch": BATCH,
    }
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        known = {"after": (ROOT, True), "python": (ROOT, False)}
        sides = {side: known[side] for side in args.sides.split(",")}
        if args.baseline:
            before = baseline_tree(args.baseline, Path(tmp) / "before")
            sides = {"before": (before, True), **sides}
        for name, url, ca in _sources(shards, Path(tmp), stack):
            runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
            for round_ in range(args.rounds):
                order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
                for side in order:
                    config = {"url": url, "ca": ca, "epochs": args.epochs}
                    source, native = sides[side]
                    env = {**os.environ, "ASYNCSTREAM_NATIVE": "1" if native else "0"}
                    runs[side].append(run_child(HERE, config, source, env))
                    print(f"{name}, round {round_}, {side}: {runs[side][-1]}", flush=True)
            out[name] = {
                side: {key: statistics.median(r[key] for r in rows) for key in rows[0]}
                for side, rows in runs.items()
            }
    print(render(out))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


def render(out: dict[str, Any]) -> str:
    lines = [
        f"{out['machine']}; {out['images']} ImageNet-sized images, batch {out['batch']}; "
        f"{out['date']}.",
        "",
        "| from | side | reader µs/image | engine µs/image | total µs/image | images/s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name in ("local files", "HTTPS, loopback"):
        for side, r in out.get(name, {}).items():
            lines.append(
                f"| {name} | {side} | {r['reader_us_per_image']:.1f} | "
                f"{r['engine_us_per_image']:.1f} | {r['total_us_per_image']:.1f} | "
                f"{r['images/s']:,.0f} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
