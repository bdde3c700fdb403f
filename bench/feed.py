"""``python -m bench.feed``: does DALIImageLoader feed DALI as fast as DALI can decode?

Four parts (``--parts``); the first three against DALI over the same encoded bytes preloaded in
memory (the *ceiling*: the same pipeline, its source a slice of a list), in one run:

``proxy``
    The *feed proxy*: tiny JPEGs (32 x 32 px) decoded to 32 px, so that DALI's work per
    image is small and what the loader adds (reading, batching, feeding) shows, on any
    machine. Batch 64 and 256. Per image: the loader's main-thread CPU and the fetch
    engine's; and how much of the wall time feeding and decoding overlap:
    ``(feed alone + decode alone - loader) / min(feed alone, decode alone)``, 1 when the
    shorter one hides entirely behind the other, 0 when they take turns (feed alone: the
    producer building every batch with no DALI; decode alone: the ceiling).
``workers``
    The proxy at batch 256 with the feed in 0, 1, 2 and 4 DataLoader workers
    (``workers=``): images/s and the training process's CPU per 1,000 images.
``real``
    ImageNet-sized JPEGs (``--images``, default 20,000, about 107 kB each, generated once
    into ``--data``), batch 256, the 224 px training pipeline, ``--epochs`` epochs: the
    first (pipeline and engine start) reported apart from the steady state (the mean of
    the others). With ``--device mixed``: images/s per GPU and the GPU's utilisation
    (NVML, sampled every 50 ms).
``handover``
    No DALI: the batches of 1, 2 and 4 DataLoader workers (``--workers``) taken as DALI's
    source takes them, batch 256, tiny JPEGs (``--handover-images real``: the realistic
    run's): images/s and the training thread's CPU per
    image, i.e. how fast workers can feed and what taking their batches costs the
    training process (with ``--baseline``, before and after).

``--baseline REV`` runs the loader of git revision ``REV`` (its ``dali_ops``, imported
as a package of its own from ``git show``) beside today's, in the same rounds: before
and after in one run. Only ``dali_ops`` is that revision's: the stream, the tar reader and
the engine are today's in both (``bench.endtoend`` runs a revision's whole tree). Rounds
are interleaved and repeated (``--repeat``), the sides' order turned every other round;
each figure is the median over rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from asyncstream import ShardStream, pack

DEFAULT_DATA = Path(
    os.environ.get("ASYNCSTREAM_BENCH_DATA", Path.home() / ".cache/asyncstream-bench")
)


def _thread_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_utime + usage.ru_stime


def _faults() -> tuple[int, int]:
    """This process's minor page faults, and the machine's transparent huge pages
    faulted in (``thp_fault_alloc`` of ``/proc/vmstat``, 0 where there is none): the
    first epoch writes the feed's buffers for the first time."""
    huge = 0
    with contextlib.suppress(OSError), open("/proc/vmstat") as vmstat:
        for line in vmstat:
            if line.startswith("thp_fault_alloc "):
                huge = int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt, huge


# -- data ------------------------------------------------------------------------------


def tiny_shards(folder: Path, n: int) -> Path:
    """``n`` 32 x 32 JPEGs in 10 classes, packed into 8 MiB shards (made once)."""
    shards = folder / f"tiny-{n}"
    if (shards / "asyncstream.json").exists():
        return shards
    from PIL import Image

    images = folder / f"tiny-{n}-images"
    rng = np.random.default_rng(0)
    ramp = np.linspace(0, 255, 32, dtype=np.float32)
    for i in range(n):
        (images / f"c{i % 10}").mkdir(parents=True, exist_ok=True)
        base = (ramp[None, :, None] * rng.random(3) + ramp[:, None, None] * rng.random(3)) / 2
        noise = rng.normal(0, 12, (32, 32, 3))
        pixels = np.clip(base + noise, 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(images / f"c{i % 10}" / f"{i:06d}.jpg", quality=90)
    pack(images, str(shards), shard_bytes=8 << 20, shuffle_seed=0, workers=os.cpu_count() or 2)
    return shards


def real_shards(folder: Path, n: int, shard_mib: int = 64) -> Path:
    """``n`` generated photographs (about 470 x 350 px, 107 kB), in shards of
    ``shard_mib`` MiB (made once; ``real-N``, or ``real-N-Mmib`` for other sizes)."""
    shards = folder / (f"real-{n}" if shard_mib == 64 else f"real-{n}-{shard_mib}mib")
    if (shards / "asyncstream.json").exists():
        return shards
    from asyncstream.testing import generate_imagefolder

    images = folder / f"real-{n}-images"
    made = folder / f"real-{n}-images.done"  # the folder of a generation cut short is redone
    if not made.exists():
        generate_imagefolder(images, n, 100, seed=0)
        made.touch()
    pack(
        images,
        str(shards),
        shard_bytes=shard_mib << 20,
        shuffle_seed=0,
        workers=os.cpu_count() or 2,
        overwrite=True,
    )
    return shards


def read_encoded(shards: Path) -> tuple[list[bytes], list[int]]:
    """Every image and label, in shard order."""
    with ShardStream(str(shards), shuffle=False) as stream:
        samples = list(stream)
    return [s["jpg"] for s in samples], [int(s["cls"]) for s in samples]


# -- what is measured -----------------------------------------------------------------


class GpuSampler:
    """The GPU's utilisation, sampled every 50 ms by NVML (nothing where there is none)."""

    def __init__(self) -> None:
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self._nvml: Any = pynvml
        except Exception:  # no NVML: no GPU figures
            self._nvml = None

    def __enter__(self) -> GpuSampler:
        if self._nvml is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.samples.append(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    @property
    def mean(self) -> float | None:
        return sum(self.samples) / len(self.samples) if self.samples else None


class Preloaded:
    """DALI's source over encoded images preloaded in memory: the next batch a call, in
    order, until :meth:`rewind`."""

    def __init__(self, blobs: list[bytes], labels: list[int], batch: int) -> None:
        self.arrays = [np.frombuffer(b, dtype=np.uint8) for b in blobs]
        self.labels = np.asarray(labels, dtype=np.int64)
        self.batch = batch
        self.position = 0

    def __call__(self) -> Any:
        at = self.position
        if at >= len(self.arrays):
            raise StopIteration
        self.position = at + self.batch
        return self.arrays[at : self.position], self.labels[at : self.position]

    def epoch(self, pipe: Any) -> int:
        """Run ``pipe`` (fed by this source) over every image once; returns how many."""
        self.position, images = 0, 0
        try:
            while True:
                images += len(pipe.run()[1])
        except StopIteration:
            pass
        pipe.reset()
        return images


def ceiling(
    pkg: ModuleType,
    settings: Any,
    blobs: list[bytes],
    labels: list[int],
    batch: int,
    device: str,
    epochs: int,
) -> list[float]:
    """DALI over the bytes preloaded: images/s of each epoch, one pipeline for all."""
    source = Preloaded(blobs, labels, batch)
    pipe = pkg.build_pipeline(settings, source, batch_size=batch, device=device)
    rates = []
    for _ in range(epochs):
        started = time.perf_counter()
        images = source.epoch(pipe)
        _synchronize(device)
        rates.append(images / (time.perf_counter() - started))
    del pipe
    return rates


def _synchronize(device: str) -> None:
    if device == "mixed":
        import torch

        torch.cuda.synchronize()


def _engine_cpu(stats: dict[str, Any]) -> float:
    """The fetch engines' CPU seconds in a loader's stream statistics (all workers)."""
    stream = stats.get("stream", {})
    parts = list(stream.get("workers", {}).values()) if "workers" in stream else [stream]
    return sum(float(p.get("fetch", {}).get("cpu_s", 0.0)) for p in parts)


def loader_epochs(
    pkg: ModuleType,
    shards: Path,
    settings: Any,
    batch: int,
    device: str,
    epochs: int,
    workers: int = 0,
    scrape: float | None = None,
) -> list[dict[str, Any]]:
    """One loader over local shards for ``epochs`` epochs: each epoch's figures. With
    ``scrape``, the stream's metrics are exported (a Prometheus endpoint in this process)
    and scraped over HTTP every ``scrape`` seconds while it runs."""
    stream = ShardStream(str(shards), window=16, inflight=8, chunk_bytes=8 << 20, seed=0)
    kwargs: dict[str, Any] = {"workers": workers} if workers else {}
    out = []
    engine0 = 0.0  # the engines' CPU is cumulative, and only seen after a pass
    scraping = contextlib.nullcontext() if scrape is None else _Scraper(stream, scrape)
    with (
        scraping,
        pkg.DALIImageLoader(stream, batch, settings=settings, device=device, **kwargs) as loader,
    ):
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            before = loader.stats()
            thread0, process0 = _thread_cpu(), time.process_time()
            faults0 = _faults()
            started = time.perf_counter()
            images = 0
            with GpuSampler() as gpu:
                for _, labels in loader:
                    images += int(labels.shape[0])
                _synchronize(device)
            wall = time.perf_counter() - started
            thread, process = _thread_cpu() - thread0, time.process_time() - process0
            faults = _faults()
            minor, huge = faults[0] - faults0[0], faults[1] - faults0[1]
            after = loader.stats()
            engine = _engine_cpu(after)
            out.append(
                {
                    "images": images,
                    "images_per_s": images / wall,
                    "main_thread_us": 1e6 * thread / images,
                    "process_ms_per_1000": 1e6 * process / images,
                    "engine_us": 1e6 * (engine - engine0) / images,
                    "minor_faults_per_image": minor / images,
                    # the producer thread's own CPU (workers=0; 0 where workers build)
                    "feed_cpu_us": 1e6
                    * (after.get("feed_cpu_seconds", 0.0) - before.get("feed_cpu_seconds", 0.0))
                    / images,
                    "huge_page_faults": huge,
                    "gpu_util": gpu.mean,
                    # Shares of the wall time the loop waited on DALI, and DALI on the feed.
                    **{
                        f"{name}_share": (after.get(key, 0.0) - before.get(key, 0.0)) / wall
                        for name, key in (
                            ("decode_wait", "decode_wait_seconds"),
                            ("feed_wait", "feed_wait_seconds"),
                        )
                    },
                }
            )
            engine0 = engine
    return out


_SCRAPE = """
import sys, time, urllib.request
url, interval = sys.argv[1], float(sys.argv[2])
while True:
    time.sleep(interval)
    with urllib.request.urlopen(url, timeout=30) as response:
        response.read()
"""


class _Scraper:
    """A Prometheus export of ``stream`` (in this process), scraped over HTTP every
    ``interval`` seconds by another process, as a Prometheus server would (more often:
    its default is 15 to 60 s): this process pays for the collection and the HTTP
    server's answer, not for the client."""

    def __init__(self, stream: ShardStream, interval: float) -> None:
        from prometheus_client import CollectorRegistry

        from asyncstream import export_prometheus

        self._export = export_prometheus(stream, port=0, registry=CollectorRegistry())
        self._interval = interval
        self._child: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> _Scraper:
        url = f"http://127.0.0.1:{self._export.port}/metrics"
        self._child = subprocess.Popen(
            [sys.executable, "-c", _SCRAPE, url, str(self._interval)],
            stderr=subprocess.DEVNULL,
        )
        return self

    def __exit__(self, *exc: object) -> None:
        if self._child is not None:
            self._child.kill()
            self._child.wait()
        self._export.close()


def feed_alone(pkg: ModuleType, shards: Path, batch: int) -> float:
    """Images/s of building every batch of an epoch with no DALI (``pkg``'s producer)."""
    batches = importlib.import_module(f"{pkg.__name__}._batch")
    read_batches = batches.read_batches
    builder = batches.BatchBuilder(
        batch, on_error="raise", precheck="markers", image_keys=("jpg",), label_key="cls"
    )
    with ShardStream(str(shards), window=16, inflight=8, chunk_bytes=8 << 20, seed=0) as stream:
        for _ in read_batches(stream, builder, drop_last=False, track=lambda s: None):
            pass  # epoch 0: the engine starts
        stream.set_epoch(1)
        started = time.perf_counter()
        images = sum(
            len(b) for b in read_batches(stream, builder, drop_last=False, track=lambda s: None)
        )
        return images / (time.perf_counter() - started)


def workers_alone(pkg: ModuleType, shards: Path, batch: int, n: int, epochs: int = 3) -> list[Any]:
    """The batches of ``n`` DataLoader workers taken as DALI's source takes them, with no
    DALI: each epoch's images/s and the training thread's CPU us per image (what the
    hand-over costs the training process, and how fast the workers can feed)."""
    batch_mod = importlib.import_module(pkg.__name__ + "._batch")
    feeds = importlib.import_module(pkg.__name__ + "._feeds")
    workers_mod = importlib.import_module(pkg.__name__ + "._workers")
    builder = batch_mod.BatchBuilder(
        batch, on_error="raise", precheck="markers", image_keys=("jpg",), label_key="cls"
    )
    stream = ShardStream(str(shards), window=16, inflight=8, chunk_bytes=8 << 20, seed=0)
    loader = workers_mod.make_worker_loader(stream, builder, workers=n, drop_last=False, prefetch=2)
    extra = []  # today's WorkerFeed takes the buffers' views, kept across passes
    if hasattr(feeds, "BufferViews"):
        extra.append(feeds.BufferViews())
    out = []
    try:
        for epoch in range(epochs):
            stream.set_epoch(epoch)
            feed = feeds.WorkerFeed(loader, *extra)
            thread0, started, images = _thread_cpu(), time.perf_counter(), 0
            while (got := feed.get()) is not None:
                images += len(got.keys)
                feeds.prepare(got)
            wall = time.perf_counter() - started
            out.append(
                {
                    "images_per_s": images / wall,
                    "main_thread_us": 1e6 * (_thread_cpu() - thread0) / images,
                }
            )
    finally:
        del loader
        stream.close()
    return out


def baseline_package(rev: str, workdir: Path) -> ModuleType:
    """``dali_ops`` as of git revision ``rev``, importable as ``dali_ops_<rev>``; or, if
    ``rev`` is a folder (a copy made beforehand, where there is no git), that package."""
    if Path(rev).is_dir():
        sys.path.insert(0, str(Path(rev).resolve().parent))
        return importlib.import_module(Path(rev).name)
    root = Path(__file__).resolve().parent.parent
    name = "dali_ops_" + "".join(c for c in rev if c.isalnum())[:12]
    target = workdir / name
    target.mkdir(parents=True, exist_ok=True)
    files = subprocess.run(
        ["git", "ls-tree", "--name-only", rev, "dali_ops/"],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    for path in files:
        if path.endswith(".py"):
            text = _git_show(root, rev, path).replace('"dali_ops._batchc"', f'"{name}._batchc"')
            (target / Path(path).name).write_text(text)
    if "dali_ops/_batchc.c" in files:
        _build_batchc(root, rev, target)
    sys.path.insert(0, str(workdir))
    return importlib.import_module(name)


def _git_show(root: Path, rev: str, path: str) -> str:
    return subprocess.run(
        ["git", "show", f"{rev}:{path}"], cwd=root, check=True, capture_output=True, text=True
    ).stdout


def _build_batchc(root: Path, rev: str, target: Path) -> None:
    """That revision's batch sink, built into ``target`` with the machine's compiler (as
    ``setup.py`` builds it, warnings aside), so that its ``dali_ops`` runs its own C sink
    beside today's rather than today's (whose arguments may differ)."""
    import sysconfig

    source = target / "src"
    (source / "shards").mkdir(parents=True, exist_ok=True)
    (source / "_batchc.c").write_text(_git_show(root, rev, "dali_ops/_batchc.c"))
    for header in ("_records.h", "_table.h"):
        try:
            text = _git_show(root, rev, f"asyncstream/shards/{header}")
        except subprocess.CalledProcessError:
            continue  # not at that revision
        (source / "shards" / header).write_text(text)
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    subprocess.run(
        [
            os.environ.get("CC", "gcc"),
            "-shared",
            "-fPIC",
            "-O2",
            "-std=c11",
            f"-I{sysconfig.get_paths()['include']}",
            f"-I{source / 'shards'}",
            str(source / "_batchc.c"),
            "-o",
            str(target / f"_batchc{suffix}"),
        ],
        check=True,
    )


# -- parts ------------------------------------------------------------------------------


def _turns(packages: dict[str, ModuleType], round_: int) -> list[tuple[str, ModuleType]]:
    """The packages in the order round ``round_`` runs them: reversed every other round.

    In one process, whichever side ran first was seen to run faster: with ``--baseline``
    naming a revision whose ``dali_ops`` was the same code as today's, the proxy at batch
    64 gave the first side 0.93 to 1.14 of the ceiling and the second 0.75 to 0.87, in
    each of 3 rounds (2026-11-28). So no part runs the sides in a fixed order."""
    items = list(packages.items())
    return items if round_ % 2 == 0 else items[::-1]


def _steady(epochs: list[Any], key: Callable[[Any], float]) -> float:
    values = [key(e) for e in epochs[1:]] or [key(epochs[0])]
    return statistics.mean(values)


def proxy(args: argparse.Namespace, packages: dict[str, ModuleType]) -> dict[str, Any]:
    shards = tiny_shards(args.data, args.tiny)
    blobs, labels = read_encoded(shards)
    out: dict[str, Any] = {"images": len(blobs), "batches": {}}
    for batch in args.batches:
        rounds: dict[str, list[dict[str, Any]]] = {}
        for round_ in range(args.repeat):
            # With --metrics, each package also with its stream's metrics exported and
            # scraped, the two alternated (which goes first flips every round).
            variants = [(n, p, None) for n, p in _turns(packages, round_)]
            if args.metrics:
                pairs = [
                    ((n, p, None), (f"{n}+metrics", p, args.metrics))
                    for n, p in _turns(packages, round_)
                ]
                variants = [v for a, b in pairs for v in ((b, a) if round_ % 2 else (a, b))]
            for name, pkg, scrape in variants:
                settings = pkg.PipelineSettings(image_size=32, num_threads=args.threads)
                ceil = _steady(ceiling(pkg, settings, blobs, labels, batch, args.device, 3), float)
                epochs = loader_epochs(pkg, shards, settings, batch, args.device, 3, scrape=scrape)
                rate = _steady(epochs, lambda e: e["images_per_s"])
                rounds.setdefault(name, []).append(
                    {
                        "ceiling": ceil,
                        "loader": rate,
                        "ratio": rate / ceil,
                        "main_thread_us": _steady(epochs, lambda e: e["main_thread_us"]),
                        "engine_us": _steady(epochs, lambda e: e["engine_us"]),
                        # the whole process's CPU (DALI's threads, a scraper's) per image
                        "process_us": _steady(epochs, lambda e: e["process_ms_per_1000"]),
                    }
                )
            for name, rows in rounds.items():
                pkg = packages[name.removesuffix("+metrics")]
                row, feed = rows[-1], feed_alone(pkg, shards, batch)
                decode_s, feed_s, both_s = 1 / row["ceiling"], 1 / feed, 1 / row["loader"]
                row["feed_alone"] = feed
                row["overlap"] = max(
                    0.0, min(1.0, (feed_s + decode_s - both_s) / min(feed_s, decode_s))
                )
            print(
                f"proxy batch {batch}: "
                + "; ".join(
                    f"{n} {r[-1]['loader']:.0f}/{r[-1]['ceiling']:.0f} = {r[-1]['ratio']:.2f}"
                    for n, r in rounds.items()
                ),
                flush=True,
            )
        out["batches"][batch] = {
            name: {k: statistics.median(r[k] for r in rows) for k in rows[0]}
            for name, rows in rounds.items()
        }
        if args.metrics:  # each round's loader img/s, to show the spread
            out.setdefault("rounds", {})[batch] = {
                name: [(r["loader"], r["process_us"]) for r in rows]
                for name, rows in rounds.items()
            }
    return out


def workers(args: argparse.Namespace, packages: dict[str, ModuleType]) -> dict[str, Any]:
    """The proxy at batch 256 with the feed in ``--workers`` workers, for each package
    (before and after, with ``--baseline``), in interleaved rounds."""
    shards = tiny_shards(args.data, args.tiny)
    blobs, labels = read_encoded(shards)
    rows: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for round_ in range(args.repeat):
        for name, pkg in _turns(packages, round_):
            settings = pkg.PipelineSettings(image_size=32, num_threads=args.threads)
            ceil = _steady(ceiling(pkg, settings, blobs, labels, 256, args.device, 3), float)
            for n in args.workers:
                epochs = loader_epochs(pkg, shards, settings, 256, args.device, 3, workers=n)
                rate = _steady(epochs, lambda e: e["images_per_s"])
                rows.setdefault(name, {}).setdefault(n, []).append(
                    {
                        "ceiling": ceil,
                        "loader": rate,
                        "ratio": rate / ceil,
                        "process_ms_per_1000": _steady(epochs, lambda e: e["process_ms_per_1000"]),
                        "main_thread_us": _steady(epochs, lambda e: e["main_thread_us"]),
                        "decode_wait_share": _steady(epochs, lambda e: e["decode_wait_share"]),
                        "feed_wait_share": _steady(epochs, lambda e: e["feed_wait_share"]),
                    }
                )
                print(f"workers {name} {n}: {rate:.0f}/{ceil:.0f} = {rate / ceil:.2f}", flush=True)
    return {
        name: {
            str(n): {k: statistics.median(r[k] for r in rs) for k in rs[0]} for n, rs in by.items()
        }
        for name, by in rows.items()
    }


def real(args: argparse.Namespace, packages: dict[str, ModuleType]) -> dict[str, Any]:
    """The realistic run, ``--repeat`` rounds, the packages' order reversed every other
    round (whichever runs second in a process was seen to run slower): ``runs`` holds the
    last round's epochs, ``ratios`` each round's steady loader / ceiling, by package.

    With ``--flank``, DALI's ceiling is measured again after each loader, and each ratio
    is against the mean of the ceilings on either side of it: on the H200 the ceiling
    itself moved 7% between the measurements of one run, and a loader measured minutes
    after its round's only ceiling took that drift into its ratio."""
    shards = real_shards(args.data, args.images)
    blobs, labels = read_encoded(shards)
    out: dict[str, Any] = {
        "images": len(blobs),
        "mb": sum(map(len, blobs)) / 1e6,
        "runs": {},
        "ratios": {},
        # each round's first epoch: images/s, huge pages faulted in, the feed thread's CPU
        # an image (us), and the feed thread's CPU in the last epoch
        "first": {},
        "flanked": bool(args.flank),
    }
    for round_ in range(args.repeat):
        for name, pkg in _turns(packages, round_):
            settings = pkg.PipelineSettings(image_size=224, num_threads=args.threads)

            def measure_ceiling(pkg: ModuleType = pkg, settings: Any = settings) -> list[float]:
                return ceiling(pkg, settings, blobs, labels, 256, args.device, args.epochs)

            ceil = measure_ceiling()
            runs: dict[str, Any] = {"ceiling": ceil}
            for n in sorted({0, *args.real_workers}):
                epochs = loader_epochs(pkg, shards, settings, 256, args.device, args.epochs, n)
                runs[f"loader, {n} workers"] = epochs
                steady = _steady(epochs, lambda e: e["images_per_s"])
                before = _steady(ceil, float)
                if args.flank:
                    ceil = measure_ceiling()
                    runs[f"ceiling after {n} workers"] = ceil
                    reference = (before + _steady(ceil, float)) / 2
                else:
                    reference = before
                ratio = steady / reference
                out["ratios"].setdefault(name, {}).setdefault(f"{n} workers", []).append(ratio)
                first, last = epochs[0], epochs[-1]
                out["first"].setdefault(name, {}).setdefault(f"{n} workers", []).append(
                    [
                        first["images_per_s"],
                        first["huge_page_faults"],
                        first["feed_cpu_us"],
                        last["feed_cpu_us"],
                    ]
                )
                flanks = f" ({before:.0f} before, {_steady(ceil, float):.0f} after)"
                print(
                    f"real {name} workers {n}: warm-up {epochs[0]['images_per_s']:.0f}, steady "
                    f"{steady:.0f} img/s; ceiling {reference:.0f}"
                    f"{flanks if args.flank else ''}; ratio {ratio:.2f}",
                    flush=True,
                )
            out["runs"][name] = runs
    return out


def handover(args: argparse.Namespace, packages: dict[str, ModuleType]) -> dict[str, Any]:
    """:func:`workers_alone` for each package, batch 256, in interleaved rounds."""
    if args.handover_images == "real":
        shards = real_shards(args.data, args.images)
    else:
        shards = tiny_shards(args.data, args.tiny)
    rows: dict[str, dict[int, list[dict[str, float]]]] = {}
    for round_ in range(args.repeat):
        for n in [w for w in args.workers if w > 0]:
            for name, pkg in _turns(packages, round_):
                epochs = workers_alone(pkg, shards, 256, n)
                row = {
                    "images_per_s": _steady(epochs, lambda e: e["images_per_s"]),
                    "main_thread_us": _steady(epochs, lambda e: e["main_thread_us"]),
                }
                rows.setdefault(name, {}).setdefault(n, []).append(row)
                print(
                    f"handover {name} workers {n}: {row['images_per_s']:.0f} img/s, "
                    f"{row['main_thread_us']:.1f} us/img in the training thread",
                    flush=True,
                )
    return {
        name: {
            str(n): {k: statistics.median(r[k] for r in rs) for k in rs[0]} for n, rs in by.items()
        }
        for name, by in rows.items()
    }


PARTS = {"proxy": proxy, "workers": workers, "real": real, "handover": handover}


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table (the first column left-aligned, the others right), then a blank
    line."""
    rule = "|---|" + "---:|" * (len(header) - 1)
    return [f"| {' | '.join(header)} |", rule, *(f"| {' | '.join(r)} |" for r in rows), ""]


def render(out: dict[str, Any]) -> str:
    """The figures as Markdown."""
    lines = [f"{out['machine']}; device {out['device']}; {out['date']}; `{out['command']}`", ""]
    if "proxy" in out:
        lines += _table(
            [
                "feed proxy",
                "batch",
                "ceiling img/s",
                "loader img/s",
                "ratio",
                "main thread us/img",
                "engine us/img",
                "overlap",
                "batches alone img/s",
            ],
            [
                [
                    name,
                    str(batch),
                    f"{r['ceiling']:.0f}",
                    f"{r['loader']:.0f}",
                    f"{r['ratio']:.2f}",
                    f"{r['main_thread_us']:.1f}",
                    f"{r['engine_us']:.1f}",
                    f"{r['overlap']:.2f}",
                    f"{r['feed_alone']:.0f}",
                ]
                for batch, by_name in out["proxy"]["batches"].items()
                for name, r in by_name.items()
            ],
        )
    for batch, by_name in out.get("proxy", {}).get("rounds", {}).items():
        for name, rounds in by_name.items():
            plain = by_name.get(name.removesuffix("+metrics"))
            if not name.endswith("+metrics") or plain is None:
                continue
            for i, what in ((0, "loader img/s"), (1, "process CPU us/img")):
                mine, theirs = [r[i] for r in rounds], [r[i] for r in plain]
                lines.append(
                    f"batch {batch}, {what}: with export {', '.join(f'{v:.1f}' for v in mine)}; "
                    f"without {', '.join(f'{v:.1f}' for v in theirs)}; medians "
                    f"{statistics.median(mine) / statistics.median(theirs) - 1:+.1%}"
                )
    if "workers" in out:
        lines += _table(
            [
                "workers",
                "loader",
                "ceiling img/s",
                "loader img/s",
                "ratio",
                "training process CPU ms per 1,000 images",
                "main thread us/img",
                "loop waits on DALI",
                "DALI waits on feed",
            ],
            [
                [
                    str(n),
                    name,
                    f"{r['ceiling']:.0f}",
                    f"{r['loader']:.0f}",
                    f"{r['ratio']:.2f}",
                    f"{r['process_ms_per_1000']:.0f}",
                    f"{r['main_thread_us']:.1f}",
                    f"{r['decode_wait_share']:.0%}",
                    f"{r['feed_wait_share']:.0%}",
                ]
                for name, by in out["workers"].items()
                for n, r in by.items()
            ],
        )
    if "real" in out:
        rows = []
        for name, runs in out["real"]["runs"].items():
            # the last round's ratios (against the flanking ceilings' mean with --flank)
            last_ratios = {
                label: ratios[-1] for label, ratios in out["real"]["ratios"][name].items()
            }
            for label, epochs in runs.items():
                if label.startswith("ceiling"):
                    preloaded = "DALI preloaded" + label.removeprefix("ceiling")
                    rows.append(
                        [
                            f"{name}: {preloaded}",
                            f"{epochs[0]:.0f}",
                            f"{_steady(epochs, float):.0f}",
                        ]
                    )
                    rows[-1] += ["1.00", "", "", ""]
                    continue
                steady = _steady(epochs, lambda e: e["images_per_s"])
                util = [e["gpu_util"] for e in epochs[1:] if e["gpu_util"] is not None]
                rows.append(
                    [f"{name}: {label}", f"{epochs[0]['images_per_s']:.0f}", f"{steady:.0f}"]
                    + [f"{last_ratios[label.removeprefix('loader, ')]:.2f}"]
                    + [f"{statistics.mean(util):.0f}" if util else ""]
                    + [
                        f"{statistics.mean(e.get(k, 0.0) for e in epochs[1:] or epochs):.0%}"
                        for k in ("decode_wait_share", "feed_wait_share")
                    ]
                )
        lines += _table(
            [
                "realistic run",
                "first epoch img/s",
                "steady img/s",
                "ratio (steady)",
                "GPU util %",
                "loop waits on DALI",
                "DALI waits on feed",
            ],
            rows,
        )
        for name, by in out["real"].get("ratios", {}).items():
            for label, ratios in by.items():
                lines.append(
                    f"{name}, loader with {label}: loader / ceiling by round "
                    f"{', '.join(f'{r:.2f}' for r in ratios)}; median "
                    f"{statistics.median(ratios):.2f}"
                )
        for name, by in out["real"].get("first", {}).items():
            for label, firsts in by.items():
                lines.append(
                    f"{name}, loader with {label}: first epoch img/s (huge pages faulted in; "
                    "feed thread us/img, first and last epoch) by round "
                    + ", ".join(f"{r:.0f} ({h}; {a:.0f}, {b:.0f})" for r, h, a, b in firsts)
                )
    if "handover" in out:
        lines += _table(
            [
                "hand-over (workers, no DALI, batch 256)",
                "workers",
                "images/s",
                "training thread us/img",
            ],
            [
                [name, str(n), f"{r['images_per_s']:.0f}", f"{r['main_thread_us']:.1f}"]
                for name, by in out["handover"].items()
                for n, r in by.items()
            ],
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="proxy,workers,real")
    parser.add_argument("--device", default="cpu", choices=["cpu", "mixed"])
    parser.add_argument("--batches", default="64,256")
    parser.add_argument("--workers", default="0,1,2,4")
    parser.add_argument(
        "--real-workers",
        default="0",
        help="also the real run with these numbers of workers (a comma list: 2,4)",
    )
    parser.add_argument("--tiny", type=int, default=20_000, help="tiny images in the proxy")
    parser.add_argument("--images", type=int, default=20_000, help="images in the real run")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument(
        "--handover-images",
        choices=["tiny", "real"],
        default="tiny",
        help="the images of the handover part: the proxy's, or the real run's",
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--flank",
        action="store_true",
        help="real: DALI's ceiling measured again after each loader, each ratio against "
        "the mean of the ceilings on either side",
    )
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="DALI threads")
    parser.add_argument("--baseline", help="also the loader of this git revision")
    parser.add_argument(
        "--metrics",
        type=float,
        metavar="SECONDS",
        help="proxy: also each loader with its stream's metrics exported (Prometheus, in "
        "process) and scraped every SECONDS, alternated with the loader without",
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--switch-interval",
        type=float,
        help="sys.setswitchinterval for the run (the GIL's hand-over; default 0.005 s)",
    )
    args = parser.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",")]
    args.workers = [int(w) for w in args.workers.split(",")]
    args.real_workers = [int(w) for w in args.real_workers.split(",")]
    args.data.mkdir(parents=True, exist_ok=True)
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    import dali_ops

    out: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "device": args.device,
        "command": "python -m bench.feed " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    with tempfile.TemporaryDirectory() as tmp:
        packages = {"after": dali_ops}
        if args.baseline:
            packages = {"before": baseline_package(args.baseline, Path(tmp)), **packages}
        for part in args.parts.split(","):
            out[part] = PARTS[part](args, packages)
    print(render(out))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))
    return out


if __name__ == "__main__":
    main()
