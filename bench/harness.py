"""``python -m bench``: asyncstream against S3 and against the peers, side by side, in one run.

By default everything runs against the embedded S3 server (moto, in a child process) with
a generated dataset; ``--endpoint URL --bucket NAME`` runs it against any S3-compatible
store instead (the dataset is generated and uploaded under ``asyncstream-bench/``;
credentials from the standard AWS configuration). ``--profile s3-like`` (the default)
puts the fault proxy's S3-like network between reader and server (20 to 50 ms to first
byte, 90 MB/s per connection); ``loopback`` reads the server directly.

The dataset is stored class-sorted (each shard one class), the hard case for a streaming
shuffle, so the shuffle quality of every reader shows.

Scenarios (``--scenarios`` picks some; all by default):

``raw_fetch``
    The engine streaming every chunk into the ring and straight back: the ceiling.
``loader``
    One epoch without decode, samples/s, MB/s, time to first sample, CPU seconds, peak
    RSS plus shared memory and shuffle quality, for asyncstream and every peer
    (:mod:`bench.peers`), each in a process of its own.
``dali``
    End to end with DALI decode (CPU, or ``mixed`` where CUDA is) against DALI decoding the
    same bytes preloaded in memory, the decode-only ceiling.
``feed``
    ``DALIImageLoader``'s own cost: the feed proxy (tiny JPEGs, decode nearly free) at
    batch 64 and 256 against DALI over the same bytes preloaded, and the feed in 0 to 4
    DataLoader workers (:mod:`bench.feed`; its realistic run: ``python -m bench.feed``).
``shuffle``
    Shuffle quality against memory, window against sample buffer (simulated, 100 sorted
    shards of 1,000).
``faults``
    Throughput against the fraction of requests faulted (0 to 20%).
``scaling``
    Throughput against K (downloads in flight), raw and through the stream.
``hedging``
    One request in 50 slowed tenfold: p99 chunk latency and epoch time, hedging on and off.
``throttling``
    A server that serves 4 requests at once and answers SlowDown beyond: requests refused
    and throughput with and without adaptive concurrency.
``cache``
    The local disk cache: epoch 1 from the network into an empty cache folder, then, in
    a new process, two epochs from the cache (the second measured), against the
    local-files stream of the same shards; the requests each process made.
``tls``
    HTTP against HTTPS on the same embedded server software (a plain and a TLS moto):
    raw fetch MB/s and the engine's (and server's) CPU seconds per GB on both transports,
    K = 8, chunks of 1 and 16 MiB (:mod:`bench.tls`): unshaped on loopback, then over the
    S3-like network (one plain moto behind a plain and a TLS fault proxy).
``ring``
    The stream's memory: the default settings (64 shards open, 1 MiB blocks, K = 32, the
    prefetch within a ring of 128 MiB) against the default before them (16 MiB blocks,
    K = 8, prefetch 16: up to 1.3 GiB a reader), over the scenario's network: MB/s of
    the second epoch, the ring, GETs, the CPU seconds per GB of the reader (consumer and
    engine), the server and the proxy, and the shuffle quality (distinct classes per
    batch of 64 on the class-sorted data). ``ASYNCSTREAM_BENCH_RING`` (JSON: name to
    stream settings) measures other settings instead.
``first_sample``
    A fresh process with torch imported: importing the reader, opening the shards named
    one by one and drawing the first sample, asyncstream against the naive boto3 reader,
    on local files and through the S3-like profile (:mod:`bench.firstsample`).
``mixing``
    Two datasets mixed 3 : 1 in one stream: each batch's share of each source against
    its weight (mean absolute deviation over batches of 64, worst window of 640) and
    throughput, for asyncstream's ``Source`` against webdataset's ``RandomMix`` and
    LitData's ``CombinedStreamingDataset`` (:mod:`bench.mixing`).
``cpu_decode``
    Pillow decode and a resize in DataLoader workers (one per core, up to 4):
    asyncstream's ``stream.map`` stage against webdataset's ``decode("pil")`` pipeline
    and a user's own wrapper that forwards no state: images/s, time to first batch, and
    the time to the first batch of a resume from halfway in a fresh process
    (:mod:`bench.cpudecode`).
``stores``
    Every store on its local server (fake-gcs-server, Azurite, a web server, moto), the
    same objects, the S3-like link in front of each: MB/s and the engine's CPU per GB
    (:mod:`bench.stores`).

Output: JSON with every figure and the environment (``--json``, default
``bench/out/bench.json``), the Markdown tables written into ``bench/RESULTS.md`` between
its ``bench:begin`` and ``bench:end`` markers (``--results``), and PNG plots
(``--plots``, default ``bench/plots``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from asyncstream import LocalS3, S3Options, pack, resolve_shards
from asyncstream.testing import generate_imagefolder

from ._bench import CHUNK, FULL, LOADER_SETTINGS, QUICK, ROOT, Bench, stream_settings

# -- scenarios ------------------------------------------------------------------------


def raw_fetch(b: Bench) -> dict[str, Any]:
    from .stream import raw_fetch as fetch

    with b.endpoint() as (options, _):
        runs = [fetch(b.url, options, CHUNK, 8, 16) for _ in range(b.sizes.repeat)]
    best = max(runs, key=lambda r: r["MB/s"])
    return {"inflight": 8, "chunk_bytes": CHUNK, "mb_per_s": best["MB/s"], "runs": runs}


def loader(b: Bench) -> dict[str, Any]:
    from . import peers

    systems: dict[str, Any] = {}
    with b.endpoint() as (options, _):
        ours = b.read(options, **LOADER_SETTINGS)
        systems["asyncstream"] = _figures(b, ours)
        # Equal memory: the ring's bytes in samples, shared by a peer's worker buffers.
        workers_of = min(4, os.cpu_count() or 1)
        memory = max(1, ours["shm_bytes"] // max(1, b.dataset["mean_sample_bytes"]))
        buffer = int(max(1, memory // workers_of))
        names = b.args.peers if b.args.peers is not None else list(peers.PEERS)
        for name in names:
            # The peers' documented way: a DataLoader with worker processes (as many as
            # cores); the naive baseline reads in its own process.
            workers = 0 if name == "naive" else workers_of

            def run(workers: int, name: str = name) -> dict[str, Any]:
                settings = peers.PeerSettings(seed=0, shuffle_buffer=buffer, workers=workers)
                common = {"url": b.url, "workdir": b.args.peer_logs, "settings": settings}
                if b.link is None or not peers.PEERS[name].converts:
                    return peers.run_peer(
                        name,
                        endpoint_url=options.endpoint_url,
                        credentials=options.credentials,
                        timeout=600,
                        **common,
                    )
                # nginx takes no uploads: the peer converts on the embedded server (and
                # reads it there once), its format is copied into nginx's folder, and the
                # measured read is the one through nginx.
                converted = peers.run_peer(
                    name,
                    endpoint_url=b.options.endpoint_url,
                    credentials=b.options.credentials,
                    timeout=600,
                    **common,
                )
                if not converted["ok"]:
                    return converted
                b.link.mirror(converted["target"])
                result = peers.run_peer(
                    name,
                    endpoint_url=options.endpoint_url,
                    credentials=options.credentials,
                    target=converted["target"],
                    convert=False,
                    timeout=600,
                    **common,
                )
                result["convert"] = converted["convert"]
                return result

            result = run(workers)
            note = None
            if not result["ok"] and workers:
                # Measured: MosaicML streaming 0.13 with DataLoader workers fails through
                # the S3-like proxy ("Relative sample index ... is not present in the
                # shard"); read in one process instead, and say so.
                last = (result["error"] or "").strip().splitlines()[-1:] or ["?"]
                note = f"with {workers} workers: {last[0][-200:]}"
                workers = 0
                result = run(workers)
            if not result["ok"]:
                systems[name] = {"error": result["error"], "note": note}
                continue
            systems[name] = {**_figures(b, result["read"]), "workers": workers, "note": note}
            if result["convert"] is not None:
                systems[name]["convert_s"] = result["convert"]["seconds"]
    return {
        "settings": LOADER_SETTINGS,
        "ring_bytes": ours["shm_bytes"],
        "equal_memory_samples": int(memory),
        "buffer_per_worker": int(buffer),
        "systems": systems,
    }


def _figures(b: Bench, read: dict[str, Any]) -> dict[str, Any]:
    keys = read["keys"]
    complete = sorted(keys) == sorted(b.index_of)
    return {
        "samples": read["samples"],
        "complete": complete,
        "samples_per_s": read["samples_per_s"],
        "mb_per_s": read["mb_per_s"],
        "first_sample_s": read["first_sample_s"],
        "cpu_s": read["cpu_s"],
        "peak_rss_bytes": read["peak_rss_bytes"],
        # Peak over the RSS once the libraries are imported (torch builds differ by
        # 0.3 GB between environments); DataLoader workers' memory is not included.
        "rss_start_bytes": read.get("rss_start_bytes", 0),
        "workers": read.get("workers", 0),
        "shm_bytes": read.get("shm_bytes", 0),
        **b.quality(keys, read["labels"]),
    }


def dali(b: Bench) -> dict[str, Any]:
    from asyncstream import ShardStream
    from dali_ops import PipelineSettings

    from .dali import end_to_end, preloaded

    device = "mixed" if _cuda() else "cpu"
    settings = PipelineSettings(image_size=224, train=True, num_threads=os.cpu_count() or 2)
    url = b.dataset["dali_url"]
    with ShardStream(url, s3=b.options, shuffle=False) as s:
        samples = list(s)
    blobs = [x["jpg"] for x in samples]
    labels = [int(x["cls"]) for x in samples]
    biggest = max(shard.size for shard in resolve_shards(url, b.options))
    chunks = {"whole-shard chunks": biggest, "8 MiB chunks": 8 << 20}
    ceilings: list[dict[str, Any]] = []
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in chunks}
    for _ in range(b.sizes.repeat):  # interleaved, so drifts of the machine hit all alike
        ceilings.append(preloaded(blobs, labels, settings, 64, device))
        for name, chunk in chunks.items():
            runs[name].append(end_to_end(url, b.options, settings, 64, device, chunk, b.server_pid))
    ceiling = max(ceilings, key=lambda r: r["images/s"])["images/s"]
    rows = []
    for name, results in runs.items():
        best = max(results, key=lambda r: r["images/s"])
        rows.append(
            {
                "source": name,
                "images_per_s": best["images/s"],
                "ratio": best["images/s"] / ceiling,
                "first_epoch_images_per_s": best["cold images/s"],
                "server_cpu_s": best["server_cpu_s"],
                "engine_cpu_s": best["engine_cpu_s"],
            }
        )
    return {
        "device": device,
        "images": len(blobs),
        "network": "loopback (decode is the limit)",
        "preloaded_images_per_s": ceiling,
        "rows": rows,
    }


def feed(b: Bench) -> dict[str, Any]:
    """The feed proxy and the feed in workers (:mod:`bench.feed`), on local shards."""
    from . import feed as feed_bench

    device = "mixed" if _cuda() else "cpu"
    quick = b.sizes is QUICK
    argv = [
        "--parts",
        "proxy,workers",
        "--device",
        device,
        "--tiny",
        "2000" if quick else "20000",
        "--batches",
        "256" if quick else "64,256",
        "--workers",
        "0,2" if quick else "0,1,2,4",
        "--repeat",
        str(b.sizes.repeat),
        "--data",
        str(b.workdir / "feed"),
    ]
    return feed_bench.main(argv)


def shuffle(b: Bench) -> dict[str, Any]:
    from .shuffle import run

    out = run(b.sizes.shuffle_memories, (100, 1_000), b.sizes.shuffle_seeds)
    return {"rows": out["rows"], "dataset": out["dataset"], "seeds": out["seeds"]}


def faults(b: Bench) -> dict[str, Any]:
    rows = []
    for rate in b.sizes.fault_rates:
        plan = _fault_plan(rate)
        with b.endpoint(faults=plan, seed=1) as (options, proxy):
            result = b.read(options, epochs=2, **stream_settings())
            counts = proxy.stats() if proxy else {}
        rows.append(
            {
                "fault_rate": rate,
                "mb_per_s": result["mb_per_s"],
                "samples_per_s": result["samples_per_s"],
                "retries": result["retries"],
                "hedged": result["hedged"],
                "faults_injected": sum(
                    counts.get(k, 0)
                    for k in ("slowdown", "internal_error", "reset", "truncate", "stall")
                ),
                "requests": counts.get("requests", 0),
                "exactly_once": sorted(result["keys"]) == sorted(b.index_of),
            }
        )
    return {"plan": "equal parts 503 SlowDown, 500, reset, truncation, 2 s stall", "rows": rows}


def _fault_plan(rate: float) -> dict[str, Any] | None:
    if rate == 0:
        return None
    part = rate / 5
    return {
        "slowdown": part,
        "internal_error": part,
        "reset": part,
        "truncate": part,
        "stall": part,
        "stall_seconds": 2.0,
        "match": ".tar",
    }


def scaling(b: Bench) -> dict[str, Any]:
    from .stream import raw_fetch as fetch

    rows = []
    for k in b.sizes.ks:
        with b.endpoint() as (options, _):
            raw = fetch(b.url, options, CHUNK, k, 16)
            ours = b.read(options, epochs=2, **stream_settings(inflight=k))
        rows.append({"k": k, "raw_mb_per_s": raw["MB/s"], "stream_mb_per_s": ours["mb_per_s"]})
    return {"rows": rows}


def hedging(b: Bench) -> dict[str, Any]:
    # Tenfold: a chunk of 4 MiB takes about 0.1 s under the S3-like profile.
    slow = {"latency": 0.02, "latency_seconds": 0.9, "match": ".tar"}
    rows = []
    for hedge in (False, True):
        with b.endpoint(faults=slow, seed=7) as (options, proxy):
            result = b.read(options, epochs=2, **stream_settings(hedge=hedge))
            counts = proxy.stats() if proxy else {}
        fetch = result["fetch"]
        rows.append(
            {
                "hedge": hedge,
                "epoch_s": result["seconds"],
                "chunk_p50_s": fetch["chunk_s"]["p50"],
                "chunk_p99_s": fetch["chunk_s"]["p99"],
                "chunk_max_s": fetch["chunk_s"]["max"],
                "hedged": fetch["hedged"],
                "hedge_wins": fetch["hedge_wins"],
                "chunks": fetch["chunks"],
                "epochs": 2,
                "requests": counts.get("requests", 0),
                "slowed": counts.get("latency", 0),
            }
        )
    return {"slowed": "1 in 50 requests, +0.9 s (tenfold)", "rows": rows}


def throttling(b: Bench) -> dict[str, Any]:
    rows = []
    for adaptive in (False, True):
        with b.endpoint(capacity=4) as (options, proxy):
            result = b.read(options, epochs=2, **stream_settings(inflight=16, adaptive=adaptive))
            counts = proxy.stats() if proxy else {}
        fetch = result["fetch"]
        rows.append(
            {
                "adaptive": adaptive,
                "mb_per_s": result["mb_per_s"],
                "requests": counts.get("requests", 0),
                "rejected": counts.get("throttled", 0),
                "chunks": fetch["chunks"],
                "throttle_cuts": fetch["throttle_cuts"],
                "concurrency_limit_min": fetch["concurrency_limit_min"],
            }
        )
    return {"capacity": 4, "inflight": 16, "rows": rows}


def cache(b: Bench) -> dict[str, Any]:
    from asyncstream.stores._s3 import sync_client

    local = b.workdir / "local-shards"
    local.mkdir(exist_ok=True)
    client = sync_client(b.options)
    for shard in resolve_shards(b.url, b.options):
        bucket, _, key = shard.url[len("s3://") :].partition("/")
        body = client.get_object(Bucket=bucket, Key=key)["Body"]
        (local / key.rsplit("/", 1)[1]).write_bytes(body.read())
    folder = b.workdir / "cache"
    settings = stream_settings()
    cached, locals_ = [], []
    with b.endpoint() as (options, proxy):

        def served() -> int:  # requests the server (or the proxy before it) answered
            if proxy is not None:
                return proxy.stats()["requests"]
            return b.link.requests() if b.link is not None else -1

        def read(epochs: int) -> dict[str, Any]:
            before = served()
            result = b.read(options, epochs=epochs, cache_dir=str(folder), **settings)
            counts = result["fetch"]["cache"]
            return {
                "mb_per_s": result["mb_per_s"],
                "seconds": result["seconds"],
                # Over the whole process (its listing and manifest included).
                "requests": served() - before if before >= 0 else -1,
                "misses": counts["misses"],
                "hits": counts["hits"],
            }

        cold = {"epoch": "epoch 1, empty cache", **read(1)}
        for _ in range(b.sizes.repeat):  # interleaved with the reference, best of each
            cached.append({"epoch": "epoch 2, from the cache", **read(2)})
            locals_.append(b.read(b.options, epochs=2, url=str(local), **settings))
    shutil.rmtree(folder)
    best = max(cached, key=lambda r: r["mb_per_s"])
    ours = max(r["mb_per_s"] for r in locals_)
    rows = [cold, best, {"epoch": "local files, epoch 2", "mb_per_s": ours}]
    return {"rows": rows, "cached_over_local": best["mb_per_s"] / ours}


def tls(b: Bench) -> dict[str, Any]:
    from .tls import measure

    quick = b.sizes is QUICK
    # --quick (tests/test_bench.py): 4 objects of 4 MiB still take 1 MiB chunks four to an
    # object and a 16 MiB chunk whole, as 8 MiB did; half the bytes through the S3-like link.
    objects, size = 4 if quick else 24, (4 if quick else 16) << 20
    return {
        **measure(objects, size, b.sizes.repeat),
        "s3_like": measure(objects, size, b.sizes.repeat, network="s3-like"),
    }


# The stream's default (a ring of at most 128 MiB) against the default before it, with
# the same window.
RING_DEFAULTS: dict[str, dict[str, Any]] = {
    "16 MiB blocks (K = 8, prefetch 16: the default before)": {
        "window": 64,
        "inflight": 8,
        "prefetch": 16,
        "chunk_bytes": 16 << 20,
    },
    "1 MiB blocks, K = 32 (the default before auto)": {"window": 64, "inflight": 32},
    "default (1 MiB blocks, K found from 32, a 128 MiB ring)": {"window": 64},
}


def ring(b: Bench) -> dict[str, Any]:
    candidates = os.environ.get("ASYNCSTREAM_BENCH_RING")  # other settings to try, as JSON
    defaults = json.loads(candidates) if candidates else RING_DEFAULTS
    from .dali import cpu_seconds

    out: dict[str, Any] = {}
    with b.endpoint() as (options, proxy):
        proxy_pid = proxy._proc.pid if proxy is not None else None
        for _ in range(b.sizes.repeat):  # interleaved rounds; the best counts
            for name, settings in defaults.items():
                server0, proxy0 = cpu_seconds(b.served_pid), cpu_seconds(proxy_pid)
                read = b.read(options, epochs=2, seed=0, **settings)
                gb = read["bytes"] / 1e9 * 2  # both epochs went through server and proxy
                figures = {
                    "reader_cpu_s_per_gb": read["cpu_s"] / (read["bytes"] / 1e9),
                    "server_cpu_s_per_gb": (cpu_seconds(b.served_pid) - server0) / gb,
                    "proxy_cpu_s_per_gb": (cpu_seconds(proxy_pid) - proxy0) / gb,
                    "mb_per_s": read["mb_per_s"],
                    "ring_bytes": read["shm_bytes"],
                    "requests": read["requests"],  # the measured epoch's
                    "reader_cpu_us_per_get": 1e6 * read["cpu_s"] / max(1, read["requests"]),
                    "inflight_mean": read["fetch"].get("inflight_mean", 0.0),
                    **b.quality(read["keys"], read["labels"]),
                }
                best = out.get(name)
                if best is None or figures["mb_per_s"] > best["mb_per_s"]:
                    out[name] = figures
    return {"settings": defaults, "results": out}


def first_sample(b: Bench) -> dict[str, Any]:
    """Time to the first sample from a fresh process (:mod:`bench.firstsample`), on the
    benchmark's own shards copied to local files."""
    from asyncstream.stores._s3 import sync_client

    from .firstsample import run as measure

    shards = resolve_shards(b.url, b.options)[:12]
    folder = b.workdir / "first-sample"
    folder.mkdir(exist_ok=True)
    client = sync_client(b.options.resolve())
    for shard in shards:
        bucket, key = shard.url[len("s3://") :].split("/", 1)
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        (folder / key.rsplit("/", 1)[-1]).write_bytes(body)
    return measure(folder, rounds=b.sizes.repeat, baseline=None, s3=True, shards=len(shards))


def stores(b: Bench) -> dict[str, Any]:
    """Every store on its emulator, the same objects, the S3-like link in front of each
    (:mod:`bench.stores`): MB/s and the engine's CPU per GB against S3's."""
    from .stores import measure

    quick = b.sizes is QUICK
    objects, size = (2, 8 << 20) if quick else (16, 16 << 20)
    names = ["gs", "az", "web", "s3"]
    out = measure(names, objects, size, b.sizes.repeat, profile="s3-like")
    return {"objects": objects, "object_bytes": size, "profile": "s3-like", **out}


def cpu_decode(b: Bench) -> dict[str, Any]:
    from .cpudecode import run as run_cpu_decode

    return run_cpu_decode(b)


def mixing(b: Bench) -> dict[str, Any]:
    from .mixing import run as run_mixing

    return run_mixing(b)


SCENARIOS: dict[str, Callable[[Bench], dict[str, Any]]] = {
    "raw_fetch": raw_fetch,
    "loader": loader,
    "dali": dali,
    "feed": feed,
    "shuffle": shuffle,
    "faults": faults,
    "scaling": scaling,
    "hedging": hedging,
    "throttling": throttling,
    "cache": cache,
    "tls": tls,
    "mixing": mixing,
    "ring": ring,
    "cpu_decode": cpu_decode,
    "first_sample": first_sample,
    "stores": stores,
}


# -- set-up ---------------------------------------------------------------------------


def _cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:  # pragma: no cover - torch is a dependency
        return False


def environment() -> dict[str, Any]:
    """Versions, CPU, GPU and date."""
    import importlib.metadata as md

    versions = {}
    for name in ("asyncstream", "torch", "nvidia-dali-cuda120", "aiobotocore", "botocore", "moto"):
        with contextlib.suppress(md.PackageNotFoundError):
            versions[name] = md.version(name)
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    gpu = None
    if _cuda():
        import torch

        gpu = torch.cuda.get_device_name(0)
    return {
        "date": time.strftime("%Y-%m-%d"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30),
        "gpu": gpu,
        "versions": versions,
    }


def prepare(b: Bench, src: Path) -> None:
    """Generate the dataset, class-sorted, and upload it; index it."""
    sizes = b.sizes
    classes = sizes.shards  # one class per shard: sorted input
    generate_imagefolder(src, sizes.images, classes, seed=0)
    per = -(-sizes.images // sizes.shards)
    # The benchmark's own prefix: a rerun against a store (--endpoint) replaces its dataset.
    result = pack(
        src, b.url, shard_samples=per, shard_bytes=None, options=b.options, overwrite=True
    )
    dali_src = src.parent / "dali"
    generate_imagefolder(dali_src, sizes.dali_images, 10, seed=1)
    dali_url = b.url.rstrip("/") + "-dali/"
    pack(
        dali_src,
        dali_url,
        shard_samples=-(-sizes.dali_images // 16),
        shard_bytes=None,
        shuffle_seed=0,
        options=b.options,
        overwrite=True,
    )
    from asyncstream import ShardStream

    with ShardStream(b.url, s3=b.options, shuffle=False) as s:
        keys = [sample["__key__"] for sample in s]
    b.index_of = {key: i for i, key in enumerate(keys)}
    total = sum(shard.size for shard in resolve_shards(b.url, b.options))
    b.dataset = {
        "images": len(keys),
        "shards": len(result.shards),
        "classes": classes,
        "bytes": total,
        "mean_sample_bytes": total // max(1, len(keys)),
        "layout": "class-sorted: each shard holds one class",
        "dali_url": dali_url,
        "dali_images": sizes.dali_images,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every chosen scenario; returns the JSON-ready results."""
    from tqdm import tqdm

    from ._run import precompile

    precompile(ROOT.parent)  # the readers' fresh processes import bytecode, as installed
    sizes = QUICK if args.quick else FULL
    out: dict[str, Any] = {"environment": environment(), "profile": args.profile}
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="asyncstream-bench-")))
        server_pid = None
        if args.endpoint is None:
            server = stack.enter_context(LocalS3(mode="process"))
            options = server.options()
            bucket = "asyncstream-bench"
            server.client().create_bucket(Bucket=bucket)
            upstream: str | None = server.endpoint_url
            server_pid = server._proc.pid if server._proc is not None else None
            out["store"] = "embedded S3 server (moto, a child process on this machine)"
        else:
            options = S3Options(endpoint_url=args.endpoint).resolve()
            bucket = args.bucket
            upstream = args.endpoint if args.endpoint.startswith("http://") else None
            out["store"] = args.endpoint
        if upstream is None:
            out["profile"] = "as is (the store is not plain HTTP: no proxy)"
        url = f"s3://{bucket}/asyncstream-bench/tars/"
        b = Bench(args, sizes, tmp, options, url, upstream, server_pid)
        print("generating and uploading the dataset ...", flush=True)
        prepare(b, tmp / "images")
        if args.profile == "nginx":
            from ._nginx import nginx_link

            b.link = stack.enter_context(nginx_link(options, bucket, tmp))
            out["pinning"] = b.link.pinning
            out["store"] += "; its bucket copied to nginx, which serves the reads"
        out["dataset"] = b.dataset
        chosen = args.scenarios or list(SCENARIOS)
        out["scenarios"] = {}
        for name in tqdm(chosen, desc="scenarios", unit="scenario", disable=args.no_progress):
            began = time.perf_counter()
            tqdm.write(f"{name} ...")
            out["scenarios"][name] = {**SCENARIOS[name](b), "seconds": time.perf_counter() - began}
    out["seconds"] = time.perf_counter() - started
    return out


def make_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m bench``."""
    from asyncstream.cli._cli import DefaultsHelpFormatter

    p = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__.splitlines()[0],
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument(
        "--quick", action="store_true", help="a small run, about a minute (default: the full run)"
    )
    p.add_argument(
        "--endpoint", help="an S3-compatible endpoint, with --bucket (default: an embedded server)"
    )
    p.add_argument(
        "--bucket", help="the bucket at --endpoint to write the dataset to (default: none)"
    )
    p.add_argument(
        "--profile",
        choices=["s3-like", "loopback", "nginx"],
        default="s3-like",
        help="the network between readers and the embedded server: S3-like latency and "
        "bandwidth through the fault proxy, bare loopback, or nginx on the S3-like link, "
        "pinned to a CPU of its own (faults and capacity still through the proxy)",
    )
    p.add_argument(
        "--scenarios",
        type=lambda s: s.split(","),
        help=f"a comma-separated list, some of: {', '.join(SCENARIOS)} (default: all)",
    )
    p.add_argument(
        "--peers",
        type=lambda s: [p for p in s.split(",") if p],
        help="the peers to compare with, comma-separated (default: all)",
    )
    p.add_argument(
        "--json", default=str(ROOT / "out" / "bench.json"), help="where to write all figures"
    )
    p.add_argument(
        "--results",
        default=str(ROOT / "RESULTS.md"),
        help="the Markdown file whose generated section gets the tables",
    )
    p.add_argument("--plots", default=str(ROOT / "plots"), help="the folder for the plots")
    p.add_argument(
        "--peer-logs",
        default=str(ROOT / "out" / "peers"),
        help="the folder for the peers' specs and logs",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars (default: shown)")
    return p


def main(argv: list[str] | None = None) -> None:
    parser = make_parser()
    args = parser.parse_args(argv)
    if args.endpoint is not None and not args.bucket:
        parser.error("--endpoint needs --bucket")
    if args.endpoint is not None and args.profile == "nginx":
        parser.error("--profile nginx serves the embedded server's copy: not with --endpoint")
    unknown = set(args.scenarios or ()) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios: {', '.join(sorted(unknown))}")
    out = run(args)
    from .report import plots, write_results

    out["plots"] = plots(out, Path(args.plots))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1))
    write_results(out, Path(args.results))
    print(f"figures: {args.json}; tables: {args.results}; plots: {args.plots}")
