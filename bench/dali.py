"""End to end with DALI decode against DALI decoding the same bytes preloaded in memory.

Run: ``python -m bench.dali`` (``--quick`` for a small run; ``--device mixed`` on a GPU).
Packs a generated JPEG dataset into shards on the embedded S3 server (moto, a child
process), then, interleaved and best of ``--repeat``:

* end to end: ShardStream from S3 into :class:`dali_ops.DALIImageLoader`, images/s over
  a whole epoch: the first (cold: the engine process boots) and the second (the engine
  kept from the first, as in any training run past its first epoch);
* ceiling: :func:`dali_ops.build_pipeline` with the same settings over the same encoded
  bytes, read into memory beforehand (images/s over the same number of images).

Both decode at 224 px in training mode (random resized crop, flip, normalise), batch 64.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from asyncstream import ShardStream, pack
from asyncstream.testing import LocalS3, generate_imagefolder
from dali_ops import DALIImageLoader, PipelineSettings, build_pipeline


def cpu_seconds(pid: int | None) -> float:
    """CPU seconds used so far by process ``pid`` (0 for None)."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def end_to_end(
    url: str,
    options: Any,
    settings: PipelineSettings,
    batch: int,
    device: str,
    chunk: int,
    server_pid: int | None,
) -> dict[str, Any]:
    """Two epochs through one loader: the first boots the engine, the second reuses it."""
    stream = ShardStream(url, s3=options, window=16, inflight=8, chunk_bytes=chunk, seed=0)
    rates = []
    with DALIImageLoader(stream, batch, settings=settings, device=device) as loader:  # type: ignore[arg-type]
        engine_cpu = 0.0
        for epoch in range(2):
            loader.set_epoch(epoch)
            engine = stream._engine  # None in the first epoch: it boots with the run
            engine0 = engine.stats()["cpu_s"] if engine is not None else 0.0
            server0 = cpu_seconds(server_pid)
            start = time.perf_counter()
            images = sum(int(labels.shape[0]) for _, labels in loader)
            elapsed = time.perf_counter() - start
            rates.append(images / elapsed)
            server = cpu_seconds(server_pid) - server0
            if engine is not None:
                engine_cpu = engine.stats()["cpu_s"] - engine0
    return {
        "images/s": rates[1],
        "cold images/s": rates[0],
        "images": images,
        "epoch_s": elapsed,
        "server_cpu_s": server,
        "engine_cpu_s": engine_cpu,
    }


def preloaded(
    blobs: list[bytes], labels: list[int], settings: PipelineSettings, batch: int, device: str
) -> dict[str, Any]:
    arrays = [np.frombuffer(b, dtype=np.uint8) for b in blobs]
    label_array = np.array(labels, dtype=np.int64)
    position = 0

    def source() -> Any:
        nonlocal position
        if position >= len(arrays):
            raise StopIteration
        chunk = slice(position, position + batch)
        position += batch
        return arrays[chunk], label_array[chunk]

    start = time.perf_counter()
    pipe = build_pipeline(settings, source, batch_size=batch, device=device)  # type: ignore[arg-type]
    images = 0
    try:
        while True:
            out = pipe.run()
            images += len(out[1])
    except StopIteration:
        pass
    elapsed = time.perf_counter() - start
    del pipe
    return {"images/s": images / elapsed, "images": images, "seconds": elapsed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--device", default="cpu", choices=["cpu", "mixed"])
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    n_images, n_shards = (640, 4) if args.quick else (2560, 16)
    batch = 64
    settings = PipelineSettings(image_size=224, train=True, num_threads=os.cpu_count() or 2)
    out: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "settings": f"{args.device} decode, 224 px train, batch {batch}, "
        f"{settings.num_threads} threads",
    }
    with tempfile.TemporaryDirectory() as tmp, LocalS3(mode="process") as server:
        src = Path(tmp) / "images"
        generate_imagefolder(src, n_images, 100, seed=0)
        options = server.options()
        server.client().create_bucket(Bucket="bench")
        per = -(-n_images // n_shards)
        pack(
            src,
            "s3://bench/d/",
            shard_samples=per,
            shard_bytes=None,
            shuffle_seed=0,
            options=options,
        )
        with ShardStream("s3://bench/d/", s3=options, shuffle=False) as s:
            samples = list(s)
        blobs = [x["jpg"] for x in samples]
        labels = [int(x["cls"]) for x in samples]
        out["dataset"] = f"{n_images} JPEGs, {n_shards} shards, {sum(map(len, blobs)) / 1e6:.0f} MB"
        local = Path(tmp) / "shards"
        pack(src, str(local), shard_samples=per, shard_bytes=None, shuffle_seed=0)
        biggest = max(p.stat().st_size for p in local.glob("*.tar"))
        sources = {
            "S3, 8 MiB chunks": ("s3://bench/d/", 8 << 20),
            "S3, whole-shard chunks": ("s3://bench/d/", biggest),
            "local files, 8 MiB chunks": (str(local), 8 << 20),
        }
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in sources}
        ceilings = []
        for _ in range(args.repeat):
            ceilings.append(preloaded(blobs, labels, settings, batch, args.device))
            line = f"preloaded {ceilings[-1]['images/s']:.0f} img/s"
            for name, (url, chunk) in sources.items():
                pid = server._proc.pid if server._proc and url.startswith("s3://") else None
                runs[name].append(
                    end_to_end(url, options, settings, batch, args.device, chunk, pid)
                )
                line += f"; {name}: {runs[name][-1]['images/s']:.0f}"
            print(line, flush=True)
    ceiling = max(ceilings, key=lambda r: r["images/s"])
    out["preloaded"] = ceiling
    out["end_to_end"] = {}
    for name, results in runs.items():
        best = max(results, key=lambda r: r["images/s"])
        best["ratio"] = best["images/s"] / ceiling["images/s"]
        best["cold_ratio"] = best["cold images/s"] / ceiling["images/s"]
        out["end_to_end"][name] = best
    print(render(out))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


def render(out: dict[str, Any]) -> str:
    lines = [
        f"{out['machine']}; {out['dataset']}; {out['settings']}; {out['date']}.",
        "",
        "| pipeline | images/s | ratio | first epoch (engine boots) | ratio "
        "| CPU s of S3 server + fetch engine in epoch 2 |",
        "|---|---|---|---|---|---|",
        f"| DALI over the same bytes preloaded in memory | {out['preloaded']['images/s']:.0f} "
        "| 1.00 | - | - | - |",
    ]
    for name, r in out["end_to_end"].items():
        lines.append(
            f"| ShardStream -> DALIImageLoader, {name} | {r['images/s']:.0f} | {r['ratio']:.2f} "
            f"| {r['cold images/s']:.0f} | {r['cold_ratio']:.2f} "
            f"| {r['server_cpu_s']:.2f} + {r['engine_cpu_s']:.2f} in {r['epoch_s']:.2f} s |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
