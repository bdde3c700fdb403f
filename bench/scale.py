"""Opening and planning at scale: 1,024 shards / 1.28 M samples, 100,000 shards / 1 billion.

Run: ``python -m bench.scale`` (``--quick`` for a smoke run, ``--json PATH`` to write the
figures). No shard bytes are needed: for each size, a synthetic ``asyncstream.json``
(sample counts, sizes and ETags of shards of about 110 kB per sample, as ImageNet's
JPEGs are) is uploaded to the embedded S3 server (moto, in a child process), and the
dataset is opened from it, ``ShardStream("s3://.../asyncstream.json")``, through the
fault proxy (in a process of its own, loopback profile) which counts the requests.

Figures per size:

* **open**: seconds to construct the stream (best of ``--repeat``; a botocore client is
  made in it, about 0.05 s), the requests it made (all GETs: the manifest), the Python
  heap it peaked at while opening and what the stream keeps afterwards (``tracemalloc``,
  in a separate open, since tracing slows Python down);
* **plan**: seconds of the epoch plan (:func:`asyncstream.order._plan.epoch_plan`, shuffled)
  for rank 0 of 1 and for rank 0 of 64 with 8 DataLoader workers: O(shards), never
  O(samples). (The first ``iter()`` of a stream reads shards, which these datasets do
  not have; the plan is what it computes before its first GET.)
* **state**: bytes of ``json.dumps(stream.state_dict())`` of the fresh stream, and of a
  mid-epoch state at its largest: ``window`` open shards (64, the default) each with a
  whole resident chunk (16 MiB, the default: ``samples per chunk`` indices) still to
  draw, checked as a valid state of the stream by
  :meth:`asyncstream.stream._state.ReaderState.from_dict`.
"""

from __future__ import annotations

import gc
import hashlib
import json
import time
import tracemalloc
from dataclasses import replace
from typing import Any

from asyncstream import LocalS3, S3Options, ShardStream
from asyncstream.dataset._index import manifest_bytes
from asyncstream.order._plan import Topology, epoch_plan
from asyncstream.stream._state import ReaderState

from ._proxy import ProxyProcess
from ._run import arguments, header, report

SAMPLE_BYTES = 110_000
SIZES = ((1_024, 1_280_000), (100_000, 1_000_000_000))
QUICK_SIZES = ((64, 64_000), (1_000, 10_000_000))
WINDOW = 64
CHUNK = 16 << 20


def synthetic_manifest(folder: str, shards: int, samples: int) -> bytes:
    """A manifest of ``shards`` shards holding ``samples`` in all (no bytes behind it)."""
    per, extra = divmod(samples, shards)
    rows = []
    for i in range(shards):
        n = per + (1 if i < extra else 0)
        etag = '"' + hashlib.md5(str(i).encode(), usedforsecurity=False).hexdigest() + '"'
        rows.append((f"{folder}/shard-{i:06d}.tar", n, n * SAMPLE_BYTES + 1024, etag))
    return manifest_bytes(folder, rows)


def _open(url: str, options: S3Options) -> tuple[ShardStream, float]:
    start = time.perf_counter()
    stream = ShardStream(url, s3=options, window=WINDOW, chunk_bytes=CHUNK, index_cache=False)
    return stream, time.perf_counter() - start


def _plan_seconds(counts: tuple[int, ...], topology: Topology, repeat: int) -> float:
    best = float("inf")
    for epoch in range(repeat):
        start = time.perf_counter()
        epoch_plan(counts, seed=0, epoch=epoch, shuffle=True, topology=topology)
        best = min(best, time.perf_counter() - start)
    return best


def mid_epoch_state(stream: ShardStream) -> dict[str, Any]:
    """The largest state of an epoch: every lane open with its whole chunk still to draw."""
    settings = stream._settings
    state = stream.state_dict()
    lanes = []
    for piece in range(WINDOW):
        count = settings.counts[piece]
        per_chunk = max(1, count * settings.chunk_bytes // settings.shards[piece].size)
        first = count - per_chunk
        lanes.append(
            {
                "piece": piece,
                "chunk": first * SAMPLE_BYTES // settings.chunk_bytes,
                "reader_start": 0,
                "returned_before": first,
                "returned": count,
                "remaining": list(range(first, count)),
            }
        )
    state["position"] = {"draws": 10**9, "next_piece": WINDOW, "emitted": 10**9, "lanes": lanes}
    ReaderState.from_dict(state, settings)  # a valid state of this stream
    return state


def measure(
    server: LocalS3, proxy: ProxyProcess, shards: int, samples: int, repeat: int
) -> dict[str, Any]:
    folder = f"s3://scale/{shards}"
    body = synthetic_manifest(folder, shards, samples)
    server.client().put_object(Bucket="scale", Key=f"{shards}/asyncstream.json", Body=body)
    url = f"{folder}/asyncstream.json"
    options = replace(server.options(), endpoint_url=proxy.endpoint_url)
    opens, requests = [], []
    for _ in range(repeat):
        before = proxy.stats()
        stream, seconds = _open(url, options)
        after = proxy.stats()
        opens.append(seconds)
        requests.append(after["requests"] - before["requests"])
        if stream.num_samples != samples:
            raise RuntimeError(f"opened {stream.num_samples} samples, expected {samples}")
        stream.close()
    gc.collect()
    tracemalloc.start()
    stream, _ = _open(url, options)
    peak = tracemalloc.get_traced_memory()[1]
    gc.collect()  # what the open left in reference cycles (botocore's client) is not kept
    kept = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    counts = stream._settings.counts
    fresh = len(json.dumps(stream.state_dict()))
    largest = len(json.dumps(mid_epoch_state(stream)))
    stream.close()
    return {
        "shards": shards,
        "samples": samples,
        "manifest_bytes": len(body),
        "open_s": min(opens),
        "open_s_runs": opens,
        "requests": max(requests),
        "open_peak_heap_bytes": peak,
        "stream_heap_bytes": kept,
        "plan_s": _plan_seconds(counts, Topology(0, 1), repeat),
        "plan_s_rank_of_64_worker_of_8": _plan_seconds(counts, Topology(0, 64, 0, 8), repeat),
        "state_bytes_fresh": fresh,
        "state_bytes_mid_epoch_max": largest,
    }


def main() -> None:
    args = arguments(__doc__ or "")
    out: dict[str, Any] = {**header(), "rows": []}
    with (
        LocalS3(mode="process") as server,
        ProxyProcess(server.endpoint_url, profile="loopback") as proxy,
    ):
        server.client().create_bucket(Bucket="scale")
        for shards, samples in QUICK_SIZES if args.quick else SIZES:
            row = measure(server, proxy, shards, samples, args.repeat)
            out["rows"].append(row)
            print(
                f"{shards:,} shards, {samples:,} samples: open {row['open_s']:.2f} s in "
                f"{row['requests']} requests, plan {row['plan_s'] * 1e3:.0f} ms",
                flush=True,
            )
    report(out, render(out), args.json)


def render(out: dict[str, Any]) -> str:
    lines = [
        f"{out['machine']}; {out['date']}.",
        "",
        "| shards | samples | manifest | open | requests | heap peak while opening | "
        "stream keeps | plan, rank 0 of 1 | plan, rank 0 of 64, worker 0 of 8 | "
        "state fresh | state mid-epoch, largest |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in out["rows"]:
        lines.append(
            f"| {r['shards']:,} | {r['samples']:,} | {r['manifest_bytes'] / 1e6:.1f} MB | "
            f"{r['open_s']:.2f} s | {r['requests']} | "
            f"{r['open_peak_heap_bytes'] / 2**20:.0f} MiB | "
            f"{r['stream_heap_bytes'] / 2**20:.1f} MiB | {r['plan_s'] * 1e3:.0f} ms | "
            f"{r['plan_s_rank_of_64_worker_of_8'] * 1e3:.0f} ms | {r['state_bytes_fresh']:,} B | "
            f"{r['state_bytes_mid_epoch_max'] / 1e3:.0f} kB |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
