"""ShardStream without decode against raw fetch of the same shards, same server, same run.

Run: ``python -m bench.stream`` (``--quick`` for a small run). Generates a realistic JPEG
dataset, packs it into shards on the embedded S3 server (moto, in a child process) and on
local disk, then measures, interleaved and best of ``--repeat``:

* raw fetch: the engine streaming every chunk of every shard into the ring (MB/s), on
  its default transport (direct, for these http:// endpoints) and, for comparison, on
  botocore's aiohttp request, with the engine's CPU per GB;
* ShardStream: samples/s and MB/s of sample bytes, with indexing, the window shuffle and
  the copy of each sample out of the ring; its overhead is ``1 - stream / raw`` in MB/s.
  Both run twice on one engine and the second pass counts: the engine's start-up (about
  half a second, paid once per stream) would otherwise dominate a dataset this small;
* peak RSS of the consumer and engine processes against the ring size;
* the local disk cache (``cache_dir``): one stream's first epoch through the S3-like
  network into an empty cache, then its second epoch served from the cache, with the
  requests each epoch made (the proxy's count) and the cached epoch against the
  local-files stream of the same run.

``--sources`` picks some of ``loopback``, ``s3-like``, ``local`` and ``cache``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from asyncstream import LocalS3, S3Options, ShardStream, pack, resolve_shards
from asyncstream.engine._engine import Engine, EngineConfig
from asyncstream.stores._store import ChunkRequest
from asyncstream.testing import generate_imagefolder

from ._proxy import ProxyProcess

MB = 1e6


def raw_fetch(
    url: str,
    options: S3Options,
    chunk: int,
    inflight: int,
    window: int,
    transport: Literal["auto", "aiohttp"] = "auto",
    coalesce_bytes: int | None = None,
) -> dict[str, Any]:
    """Every chunk into the ring and straight back, twice on one engine; the second pass
    counts. ``coalesce_bytes``: the engine's (None: its default; 0: a GET per chunk)."""
    shards = resolve_shards(url, options)
    requests = [
        ChunkRequest(s.url, o, min(chunk, s.size - o), s.etag, o + chunk >= s.size)
        for s in shards
        for o in range(0, s.size, chunk)
    ]
    total = sum(r.length for r in requests)
    config = EngineConfig(inflight=inflight, s3=options, transport=transport)
    if coalesce_bytes is not None:
        config = replace(config, coalesce_bytes=coalesce_bytes)
    with Engine(config, n_slots=window + inflight, slot_bytes=chunk) as engine:
        for _ in range(2):  # the first pass boots the engine, as a stream's first epoch does
            before = engine.stats()
            engine_cpu0 = before["cpu_s"]
            cpu0 = time.process_time()
            start = time.perf_counter()
            engine.submit(requests)
            for _ in requests:
                engine.release(engine.next().slot)
            elapsed = time.perf_counter() - start
            cpu = time.process_time() - cpu0
            stats = engine.stats()
    return {
        "MB/s": total / elapsed / MB,
        "seconds": elapsed,
        "consumer_cpu_s": cpu,
        "transport": stats["transport"],
        "engine_cpu_s_per_gb": (stats["cpu_s"] - engine_cpu0) / (total / 1e9),
        # GETs of the pass (consecutive chunks share one: EngineConfig.coalesce_bytes)
        "requests": stats["requests"] - before["requests"],
        "chunks": len(requests),
    }


def stream(url: str, options: S3Options, chunk: int, inflight: int, window: int) -> dict[str, Any]:
    """Two epochs of one stream; the second (engine kept from the first) counts."""
    with ShardStream(url, s3=options, chunk_bytes=chunk, inflight=inflight, window=window) as s:
        for epoch in range(2):
            s.set_epoch(epoch)
            cpu0 = time.process_time()
            start = time.perf_counter()
            nbytes, count = 0, 0
            for sample in s:
                nbytes += len(sample["jpg"]) + len(sample["cls"])
                count += 1
            elapsed = time.perf_counter() - start
            cpu = time.process_time() - cpu0
        stats = s.stats()
        ring_bytes = s.ring_bytes
    return {
        "samples/s": count / elapsed,
        "MB/s": nbytes / elapsed / MB,
        "seconds": elapsed,
        "samples": count,
        "consumer_cpu_s": cpu,
        "consumer_cpu_us_per_sample": cpu / count * 1e6,
        "starved_s": stats.get("fetch", {}).get("starved_s"),
        "ring_bytes": ring_bytes,
        "peak_rss_consumer": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "engine_peak_rss": stats.get("fetch", {}).get("max_rss_bytes"),
    }


def cached_stream(
    url: str,
    options: S3Options,
    proxy: ProxyProcess,
    chunk: int,
    inflight: int,
    window: int,
    cache_dir: Path,
) -> dict[str, Any]:
    """Two epochs of one stream with an empty cache folder: the first fills it from the
    network, the second (engine kept) is served from it; then a new stream's first epoch
    over the full folder, which checks every file's CRC once (timed from its first
    sample, so that the engine's start is left out). Before them, the first epoch of a
    stream without a cache, for what writing the cache costs. Requests counted by the
    proxy."""
    settings: dict[str, Any] = {
        "s3": options,
        "chunk_bytes": chunk,
        "inflight": inflight,
        "window": window,
    }
    with ShardStream(url, **settings) as s:
        uncached = _cache_epoch(s, 0, proxy, {})
    settings["cache_dir"] = cache_dir
    with ShardStream(url, **settings) as s:
        cold = _cache_epoch(s, 0, proxy, {})
        cached = _cache_epoch(s, 1, proxy, cold.pop("counters"))
    with ShardStream(url, **settings) as s:
        fresh = _cache_epoch(s, 1, proxy, {}, from_first=True)
    for epoch in (uncached, cached, fresh):
        del epoch["counters"]
    return {
        "uncached": uncached,
        "cold": cold,
        "cached": cached,
        "new_process": fresh,
        "MB/s": cached["MB/s"],
    }


def _cache_epoch(
    s: ShardStream,
    epoch: int,
    proxy: ProxyProcess,
    before: dict[str, int],
    from_first: bool = False,
) -> dict[str, Any]:
    """One epoch with a cache; counters from ``before`` (the epoch before's) on."""
    s.set_epoch(epoch)
    requests0 = proxy.stats()["requests"]
    cpu0 = time.process_time()
    start = time.perf_counter()
    nbytes, count = 0, 0
    for sample in s:
        if from_first and count == 0:
            start = time.perf_counter()
        else:
            nbytes += len(sample["jpg"]) + len(sample["cls"])
        count += 1
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    cache = s.stats()["fetch"].get("cache", {})
    measured = count - 1 if from_first else count
    return {
        "samples/s": measured / elapsed,
        "MB/s": nbytes / elapsed / MB,
        "seconds": elapsed,
        "samples": count,
        "consumer_cpu_us_per_sample": cpu / count * 1e6,
        "requests": proxy.stats()["requests"] - requests0,
        **{k: cache.get(k, 0) - before.get(k, 0) for k in ("hits", "misses", "writes", "checked")},
        "counters": cache,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument(
        "--sources",
        type=lambda text: text.split(","),
        default=["loopback", "s3-like", "local", "cache"],
        help="some of loopback,s3-like,local,cache (default: all)",
    )
    args = parser.parse_args()
    images, shards = (400, 8) if args.quick else (3000, 24)
    chunk, inflight, window = 4 << 20, 8, 8
    out: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "settings": f"chunk 4 MiB, inflight {inflight}, window {window}",
    }
    with tempfile.TemporaryDirectory() as tmp, LocalS3(mode="process") as server:
        src = Path(tmp) / "images"
        generate_imagefolder(src, images, 100, seed=0)
        local_dir = Path(tmp) / "shards"
        per = -(-images // shards)
        pack(src, str(local_dir), shard_samples=per, shard_bytes=None, shuffle_seed=0)
        options = server.options()
        server.client().create_bucket(Bucket="bench")
        pack(
            src,
            "s3://bench/s/",
            shard_samples=per,
            shard_bytes=None,
            shuffle_seed=0,
            options=options,
        )
        data_mb = sum(p.stat().st_size for p in local_dir.glob("*.tar")) / MB
        out["dataset"] = f"{images} JPEGs, {shards} shards, {data_mb:.0f} MB"
        proxy = ProxyProcess(server.endpoint_url)
        shaped = replace(options, endpoint_url=proxy.endpoint_url)
        sources = [
            (name, url, opts)
            for key, name, url, opts in (
                ("loopback", "embedded S3, loopback", "s3://bench/s/", options),
                ("s3-like", "embedded S3, S3-like network", "s3://bench/s/", shaped),
                ("local", "local files", str(local_dir), options),
            )
            if key in args.sources
        ]
        for name, url, opts in sources:
            raws, streams = [], []
            for _ in range(args.repeat):
                raws.append(raw_fetch(url, opts, chunk, inflight, window))
                streams.append(stream(url, opts, chunk, inflight, window))
            raw = max(raws, key=lambda r: r["MB/s"])
            best = max(streams, key=lambda r: r["MB/s"])
            out[name] = {"raw": raw, "stream": best, "ratio": best["MB/s"] / raw["MB/s"]}
            if url.startswith("s3://"):  # the same raw fetch on botocore's aiohttp transport
                runs = [
                    raw_fetch(url, opts, chunk, inflight, window, transport="aiohttp")
                    for _ in range(args.repeat)
                ]
                out[name]["raw_aiohttp"] = max(runs, key=lambda r: r["MB/s"])
            print(
                f"{name}: raw {raw['MB/s']:.0f} MB/s, stream {best['MB/s']:.0f} MB/s "
                f"({best['samples/s']:.0f} samples/s), ratio {out[name]['ratio']:.2f}",
                flush=True,
            )
        if "cache" in args.sources:  # interleaved with the local-files stream it is held to
            cached, local = [], []
            for i in range(args.repeat):
                folder = Path(tmp) / f"cache-{i}"
                cached.append(
                    cached_stream("s3://bench/s/", shaped, proxy, chunk, inflight, window, folder)
                )
                shutil.rmtree(folder)
                local.append(stream(str(local_dir), options, chunk, inflight, window))
            best = max(cached, key=lambda r: r["MB/s"])
            reference = max(local, key=lambda r: r["MB/s"])
            out["cache"] = {
                **best,
                "runs": cached,
                "local": reference,
                "ratio": best["MB/s"] / reference["MB/s"],
            }
            print(
                f"cache: cold {best['cold']['MB/s']:.0f} MB/s, cached {best['MB/s']:.0f} MB/s "
                f"({best['cached']['requests']} requests), local files "
                f"{reference['MB/s']:.0f} MB/s, ratio {out['cache']['ratio']:.2f}",
                flush=True,
            )
        proxy.close()
    print(render(out))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


def render(out: dict[str, Any]) -> str:
    lines = [
        f"{out['machine']}; {out['dataset']}; {out['settings']}; {out['date']}.",
        "",
        "| source | raw fetch MB/s | ShardStream MB/s | samples/s | stream / raw | "
        "consumer CPU µs/sample | ring | peak RSS consumer + engine |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in ("embedded S3, loopback", "embedded S3, S3-like network", "local files"):
        if name not in out:
            continue
        r, s = out[name]["raw"], out[name]["stream"]
        engine_rss = s["engine_peak_rss"] or 0
        lines.append(
            f"| {name} | {r['MB/s']:.0f} | {s['MB/s']:.0f} | {s['samples/s']:.0f} | "
            f"{out[name]['ratio']:.2f} | {s['consumer_cpu_us_per_sample']:.0f} | "
            f"{s['ring_bytes'] / 2**20:.0f} MiB | "
            f"{s['peak_rss_consumer'] / 2**20:.0f} + {engine_rss / 2**20:.0f} MiB |"
        )
    lines += [
        "",
        "Raw fetch by transport (engine CPU over the second pass, per GB fetched):",
        "",
        "| source | transport | raw fetch MB/s | engine CPU-s per GB |",
        "|---|---|---|---|",
    ]
    for name in ("embedded S3, loopback", "embedded S3, S3-like network"):
        for r in (out[name]["raw"], out[name]["raw_aiohttp"]) if name in out else ():
            lines.append(
                f"| {name} | {r['transport']} | {r['MB/s']:.0f} | {r['engine_cpu_s_per_gb']:.2f} |"
            )
    if "cache" in out:
        c = out["cache"]
        local = c["local"]
        lines += [
            "",
            "Local disk cache: one stream, epoch 1 from the S3-like network into an empty "
            "cache, epoch 2 from the cache (best of the runs, by epoch 2):",
            "",
            "| epoch | MB/s | samples/s | requests | cache hits | misses | CRC checked | "
            "consumer CPU µs/sample | / local files |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        rows = (
            ("1 without a cache (S3-like)", c["uncached"]),
            ("1 (cold, S3-like)", c["cold"]),
            ("2 (cached)", c["cached"]),
            ("2, a new process (every file checked) †", c["new_process"]),
        )
        for label, e in rows:
            lines.append(
                f"| {label} | {e['MB/s']:.0f} | {e['samples/s']:.0f} | {e['requests']} | "
                f"{e['hits']} | {e['misses']} | {e['checked']} | "
                f"{e['consumer_cpu_us_per_sample']:.0f} | {e['MB/s'] / local['MB/s']:.2f} |"
            )
        lines += [
            f"| local files (same run) | {local['MB/s']:.0f} | {local['samples/s']:.0f} | - | "
            f"- | - | - | {local['consumer_cpu_us_per_sample']:.0f} | 1.00 |",
            "",
            "† timed from its first sample on: the engine's start (about half a second) "
            "is left out.",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
