"""Raw fetch benchmark: the engine into the ring against a plain aiobotocore gather.

Run: ``python -m bench.fetch`` (add ``--quick`` for a small run). Starts its own S3
server (moto, in a child process) and, for the S3-like rows, the fault proxy with its
S3-like network profile (20 to 50 ms to first byte, 90 MB/s per connection).

Figures:
  * loopback: MB/s of the engine (whole-shard and 4 MiB chunks) and of
    ``asyncio.gather`` over whole-object GETs with aiobotocore, same server, same run,
    best of ``--repeat``;
  * S3-like: MB/s against K (inflight) = 1, 2, 4, 8, 16;
  * CPU seconds per GB (engine process plus consumer) and peak memory (RSS of both
    processes) against the ring size.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import resource
import time
from dataclasses import replace
from typing import Any

from asyncstream import LocalS3, S3Options, resolve_shards
from asyncstream.engine._engine import Engine, EngineConfig
from asyncstream.shards._urls import Shard
from asyncstream.stores._s3 import parse_s3_url
from asyncstream.stores._store import ChunkRequest

from ._proxy import ProxyProcess

MB = 1e6


def make_dataset(server: LocalS3, shards: int, shard_bytes: int) -> str:
    client = server.client()
    client.create_bucket(Bucket="bench")
    rng = random.Random(0)
    for i in range(shards):
        client.put_object(
            Bucket="bench", Key=f"raw/shard-{i:04d}.tar", Body=rng.randbytes(shard_bytes)
        )
    return "s3://bench/raw/"


def requests_for(shards: list[Shard], chunk: int) -> list[ChunkRequest]:
    return [
        ChunkRequest(s.url, o, min(chunk, s.size - o), s.etag, o + chunk >= s.size)
        for s in shards
        for o in range(0, s.size, chunk)
    ]


def run_engine(
    options: S3Options, shards: list[Shard], chunk: int, inflight: int
) -> dict[str, Any]:
    requests = requests_for(shards, chunk)
    total = sum(r.length for r in requests)
    n_slots = inflight + 2
    config = EngineConfig(inflight=inflight, s3=options)
    with Engine(config, n_slots=n_slots, slot_bytes=chunk) as engine:
        engine_cpu0 = engine.stats()["cpu_s"]  # after start-up (imports, client)
        cpu0 = time.process_time()
        start = time.perf_counter()
        engine.submit(requests)
        for _ in requests:
            ready = engine.next()
            engine.release(ready.slot)
        elapsed = time.perf_counter() - start
        stats = engine.stats()
        engine_rss = stats["max_rss_bytes"]
    consumer_cpu = time.process_time() - cpu0
    return {
        "system": f"engine chunk={chunk >> 20}MiB",
        "inflight": inflight,
        "MB/s": total / elapsed / MB,
        "seconds": elapsed,
        "bytes": total,
        "cpu_s_per_GB": (stats["cpu_s"] - engine_cpu0 + consumer_cpu) / (total / 1e9),
        "ring_bytes": n_slots * chunk,
        "peak_rss_engine": engine_rss,
        "peak_rss_consumer": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "retries": stats["retries_total"],
        "first_byte_p50_ms": stats["first_byte_s"].get("p50", 0) * 1000,
        "starved_s": stats["starved_s"],
    }


async def _gather(options: S3Options, shards: list[Shard], inflight: int) -> dict[str, Any]:
    from aiobotocore.session import AioSession

    options = replace(options, max_pool_connections=inflight)
    async with AioSession().create_client("s3", **options.client_kwargs(retries=False)) as client:

        async def get(shard: Shard) -> int:
            bucket, key = parse_s3_url(shard.url)
            response = await client.get_object(Bucket=bucket, Key=key)
            async with response["Body"] as body:
                return len(await body.read())

        cpu0 = time.process_time()  # timed from here: the client exists, as the engine's does
        start = time.perf_counter()
        total = sum(await asyncio.gather(*(get(s) for s in shards)))
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu0
    return {
        "system": "aiobotocore gather (whole objects)",
        "inflight": inflight,
        "MB/s": total / elapsed / MB,
        "seconds": elapsed,
        "bytes": total,
        "cpu_s_per_GB": cpu / (total / 1e9),
    }


def run_gather(options: S3Options, shards: list[Shard], inflight: int) -> dict[str, Any]:
    import uvloop

    return uvloop.run(_gather(options, shards, inflight))


def best(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return max(rows, key=lambda r: r["MB/s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", help="write all figures to this file")
    args = parser.parse_args()
    n_shards, shard_bytes = (8, 4 << 20) if args.quick else (32, 16 << 20)
    k_shards = 8 if args.quick else 24
    out: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "dataset": f"{n_shards} shards x {shard_bytes >> 20} MiB",
    }
    with LocalS3(mode="process") as server:
        url = make_dataset(server, n_shards, shard_bytes)
        local = server.options()
        shards = resolve_shards(url, local)
        ours: list[dict[str, Any]] = []
        chunked: list[dict[str, Any]] = []
        theirs: list[dict[str, Any]] = []
        for _ in range(args.repeat):  # interleaved, so drift hits both alike
            theirs.append(run_gather(local, shards, 8))
            ours.append(run_engine(local, shards, shard_bytes, 8))
            chunked.append(run_engine(local, shards, 4 << 20, 8))
        loop_rows = [best(theirs), best(ours), best(chunked)]
        out["loopback"] = loop_rows
        out["loopback_ratio"] = best(ours)["MB/s"] / best(theirs)["MB/s"]
        with ProxyProcess(server.endpoint_url) as proxy:
            k_rows = []
            for k in (1, 2, 4, 8, 16):
                shaped = replace(local, endpoint_url=proxy.endpoint_url)
                k_rows.append(run_engine(shaped, shards[:k_shards], 8 << 20, k))
                print(f"K={k}: {k_rows[-1]['MB/s']:.0f} MB/s", flush=True)
        out["s3_like_vs_k"] = k_rows
    print(render(out))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


def render(out: dict[str, Any]) -> str:
    lines = [
        f"Machine: {out['machine']}; dataset {out['dataset']}; {out['date']}.",
        "",
        "| loopback | K | MB/s | CPU s/GB | ring | peak RSS engine + consumer |",
        "|---|---|---|---|---|---|",
    ]
    for r in out["loopback"]:
        ring = f"{r['ring_bytes'] / 2**20:.0f} MiB" if "ring_bytes" in r else "-"
        rss = (
            f"{r['peak_rss_engine'] / 2**20:.0f} + {r['peak_rss_consumer'] / 2**20:.0f} MiB"
            if "peak_rss_engine" in r
            else "-"
        )
        speed = f"{r['MB/s']:.0f} | {r['cpu_s_per_GB']:.2f}"
        lines.append(f"| {r['system']} | {r['inflight']} | {speed} | {ring} | {rss} |")
    lines += [
        "",
        f"Engine (whole shards) / gather: **{out['loopback_ratio']:.2f}x**",
        "",
        "| S3-like, 8 MiB chunks | K | MB/s | over K=1 | first byte p50 ms | CPU s/GB |",
        "|---|---|---|---|---|---|",
    ]
    base = out["s3_like_vs_k"][0]["MB/s"]
    for r in out["s3_like_vs_k"]:
        lines.append(
            f"| engine | {r['inflight']} | {r['MB/s']:.0f} | {r['MB/s'] / base:.2f}x | "
            f"{r['first_byte_p50_ms']:.0f} | {r['cpu_s_per_GB']:.2f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
