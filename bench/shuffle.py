"""Shuffle quality benchmark: the chunked window against the sample buffer, at equal memory.

Run: ``python -m bench.shuffle`` (``--quick`` for a smoke run, ``--json PATH`` to write the
figures). Pure simulation, no S3: the orders are those of
:func:`asyncstream.order._shuffle.simulate_window_order` (a single reader driving
``WindowShuffle`` as the stream does) and
:func:`asyncstream.order._shuffle.simulate_buffer_order` (webdataset's / tf.data's shuffle
buffer).

Dataset: 100 shards of 1,000 samples, sorted by key, each shard one class (the worst case
for a streaming shuffle). For each memory budget M (in samples) and chunk size C, the ring
has M / C slots: ``max(1, slots // 10)`` for prefetched chunks (``prefetch``) and
``window = slots - inflight`` open shards (combinations with no window are skipped; a
window over 100 shards opens them all). The sample buffer of M samples over the sorted
input is the baseline; the same buffer after a shard shuffle (webdataset's usual
``shardshuffle`` + ``shuffle(M)``) shows how much of the window's low correlation is the
shard permutation alone.

Figures, averaged over the seeds: mean |Pearson correlation| between input index and
output position (0 is a perfect shuffle) and mean distinct classes per batch of 64
(a full permutation gives about 47).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Literal

from asyncstream.order._plan import shard_order
from asyncstream.order._shuffle import shuffle_quality, simulate_buffer_order, simulate_window_order

SHARDS = 100
SHARD_SAMPLES = 1_000
BATCH = 64
MEMORIES = (1_000, 2_000, 5_000, 10_000, 20_000, 50_000)
CHUNKS = (50, 100, 250, 1_000)
MODES: tuple[Literal["samples", "shards"], ...] = ("samples", "shards")
BUFFERS = ("buffer", "shard-shuffle+buffer")

Task = tuple[str, int, int, int, int]  # method, memory, chunk, window, seed


def layout(memory: int, chunk: int) -> tuple[int, int] | None:
    """``(window, inflight)`` for a memory budget and chunk size, or None if impossible."""
    slots = memory // chunk
    inflight = max(1, slots // 10)
    window = slots - inflight
    return (window, inflight) if window >= 1 else None


def measure(task: Task) -> tuple[Task, float, float]:
    """Simulate one order and return ``(task, correlation, distinct classes per batch)``."""
    method, memory, chunk, window, seed = task
    n = SHARDS * SHARD_SAMPLES
    if method == "buffer":
        order = simulate_buffer_order(n, buffer=memory, seed=seed)
    elif method == "shard-shuffle+buffer":  # webdataset's usual shardshuffle + shuffle(M)
        shards = shard_order(SHARDS, seed=seed, epoch=0, shuffle=True)
        inputs = [s * SHARD_SAMPLES + i for s in shards for i in range(SHARD_SAMPLES)]
        order = [inputs[j] for j in simulate_buffer_order(n, buffer=memory, seed=seed)]
    elif method == "permutation":
        order = list(range(n))
        random.Random(seed).shuffle(order)
    else:
        mode: Literal["samples", "shards"] = "samples" if method == "samples" else "shards"
        order = simulate_window_order(
            [SHARD_SAMPLES] * SHARDS, window=window, chunk_samples=chunk, seed=seed, mode=mode
        )
    q = shuffle_quality(order, [i // SHARD_SAMPLES for i in order], batch_size=BATCH)
    return task, q.correlation, q.distinct_classes_per_batch


def tasks(memories: tuple[int, ...], chunks: tuple[int, ...], seeds: int) -> list[Task]:
    out: list[Task] = [("permutation", 0, 0, 0, s) for s in range(seeds)]
    for memory in memories:
        out += [(b, memory, 0, 0, s) for b in BUFFERS for s in range(seeds)]
        for chunk in chunks:
            shape = layout(memory, chunk)
            if shape is None:
                continue
            out += [(m, memory, chunk, shape[0], s) for m in MODES for s in range(seeds)]
    # the slowest first (samples mode scans the open lanes on every draw)
    return sorted(out, key=lambda t: (t[0] != "samples", -min(t[3], SHARDS)))


def run(
    memories: tuple[int, ...] = MEMORIES,
    chunks: tuple[int, ...] = CHUNKS,
    seeds: int = 3,
    jobs: int | None = None,
) -> dict[str, Any]:
    """All figures, as a JSON-ready dict."""
    start = time.perf_counter()
    todo = tasks(memories, chunks, seeds)
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(measure, todo))
    figures: dict[tuple[str, int, int], list[tuple[float, float]]] = {}
    for (method, memory, chunk, _, _), corr, distinct in results:
        figures.setdefault((method, memory, chunk), []).append((corr, distinct))
    rows: list[dict[str, Any]] = []
    for (method, memory, chunk), values in figures.items():
        shape = layout(memory, chunk) if chunk else None
        rows.append(
            {
                "method": method,
                "memory": memory,
                "chunk": chunk or None,
                "window": shape[0] if shape else None,
                "inflight": shape[1] if shape else None,
                "abs_correlation": sum(abs(c) for c, _ in values) / len(values),
                "distinct_classes_per_batch": sum(d for _, d in values) / len(values),
                "correlations": [c for c, _ in values],
                "distinct": [d for _, d in values],
            }
        )
    rows.sort(key=lambda r: (r["memory"], r["chunk"] or 0, r["method"]))
    return {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "dataset": f"{SHARDS} class-sorted shards x {SHARD_SAMPLES} samples",
        "batch_size": BATCH,
        "seeds": seeds,
        "rows": rows,
        "seconds": time.perf_counter() - start,
    }


def render(out: dict[str, Any]) -> str:
    """The figures as a Markdown table: one line per (memory, chunk), both modes side by side."""
    by_key = {(r["method"], r["memory"], r["chunk"]): r for r in out["rows"]}

    def cell(row: dict[str, Any] | None) -> str:
        if row is None:
            return "- | -"
        return f"{row['abs_correlation']:.3f} | {row['distinct_classes_per_batch']:.1f}"

    lines = [
        f"{out['dataset']}; |corr| and distinct classes per batch of {out['batch_size']}, "
        f"mean of {out['seeds']} seeds; {out['machine']}; {out['seconds']:.0f} s.",
        "",
        "| memory | reader | chunk | window + prefetch | open shards "
        "| samples: \\|corr\\| | samples: classes | shards: \\|corr\\| | shards: classes |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    memories = sorted({r["memory"] for r in out["rows"] if r["method"] == "buffer"})
    for memory in memories:
        buffer = by_key[("buffer", memory, None)]
        lines.append(f"| {memory:,} | sample buffer | - | - | - | {cell(buffer)} | | |")
        mixed = by_key[("shard-shuffle+buffer", memory, None)]
        lines.append(
            f"| {memory:,} | shard shuffle + sample buffer | - | - | - | {cell(mixed)} | | |"
        )
        for chunk in sorted({c for (_, m, c) in by_key if m == memory and c}):
            row = by_key[("samples", memory, chunk)]
            shape = f"{row['window']} + {row['inflight']}"
            whole = " (whole)" if chunk >= SHARD_SAMPLES else ""
            lines.append(
                f"| {memory:,} | window | {chunk:,}{whole} | {shape} "
                f"| {min(row['window'], SHARDS)} | {cell(row)} "
                f"| {cell(by_key.get(('shards', memory, chunk)))} |"
            )
    perm = by_key.get(("permutation", 0, None))
    if perm is not None:
        lines.append(f"| all | full permutation | - | - | - | {cell(perm)} | | |")
    return "\n".join(lines)


def at_window(window: int, chunks: tuple[int, ...], seeds: int, jobs: int | None) -> dict[str, Any]:
    """The window shuffle at one ``window``, for each block of ``chunks`` samples: what a
    smaller block changes at the same number of open shards (``--window``)."""
    todo: list[Task] = [("samples", window * c, c, window, s) for c in chunks for s in range(seeds)]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(measure, todo))
    rows = []
    for chunk in chunks:
        got = [(corr, d) for (_, _, c, _, _), corr, d in results if c == chunk]
        rows.append(
            {
                "window": window,
                "chunk": chunk,
                "abs_correlation": sum(abs(c) for c, _ in got) / len(got),
                "distinct_classes_per_batch": sum(d for _, d in got) / len(got),
            }
        )
    return {"dataset": f"{SHARDS} class-sorted shards x {SHARD_SAMPLES} samples", "rows": rows}


def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two memories, one seed")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=None, help="processes (default: all cores)")
    parser.add_argument("--json", help="write all figures to this file ('-' for stdout)")
    parser.add_argument(
        "--window",
        type=int,
        help="one window, the blocks of --chunks samples each (for a block's effect alone)",
    )
    parser.add_argument("--chunks", default="9,150", help="block sizes in samples, --window's")
    args = parser.parse_args()
    if args.window:
        chunks = tuple(int(c) for c in args.chunks.split(","))
        out = at_window(args.window, chunks, args.seeds, args.jobs)
        print("| window | block (samples) | \\|corr\\| | classes per batch |")
        print("|---:|---:|---:|---:|")
        for r in out["rows"]:
            print(
                f"| {r['window']} | {r['chunk']} | {r['abs_correlation']:.3f} "
                f"| {r['distinct_classes_per_batch']:.1f} |"
            )
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
        return out
    if args.quick:
        out = run((1_000, 10_000), (100, 1_000), 1, args.jobs)
    else:
        out = run(seeds=args.seeds, jobs=args.jobs)
    print(render(out), flush=True)
    if args.json == "-":
        print(json.dumps(out, indent=1))
    elif args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
