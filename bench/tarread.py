"""The tar reader's cost: samples per CPU-second alone and in a stream, plain and compressed.

Run: ``python -m bench.tarread`` (``--quick`` for a small run; ``--parts`` picks some of
``reader``, ``stream`` and ``compressed``). Generates realistic JPEGs, packs them into
shards in a local folder and on the embedded S3 server (moto, a child process), and
measures, best of ``--repeat``:

* **reader**: :class:`~asyncstream.shards._tar.ShardReader` alone over the shards' bytes in
  memory, fed in 4 MiB ranges as the ring hands them: samples per CPU-second of this
  process (``time.process_time``), nothing else running in it;
* **stream**: :class:`~asyncstream.ShardStream` without decode, from local files and from
  the embedded S3 server over loopback (the second of two epochs, engine kept): samples/s
  and samples per CPU-second of the consumer (the engine runs in its own process and is
  reported apart);
* **compressed**: the same shards as ``.tar`` and compressed (gzip level 6, zstd level 3,
  xz preset 6, bzip2 level 9), each read by a stream from local files and from S3:
  samples/s, MB/s of sample bytes, consumer and engine CPU, stored size.

It runs against whatever ``asyncstream`` imports: from a copy of another revision (run
it there, ``python -m bench.tarread --parts reader,stream``) it measures that revision's
reader, so a before/after pair runs the same file under the same conditions. The
compressed part needs a revision that reads compressed shards.
"""

from __future__ import annotations

import argparse
import bz2
import gzip
import json
import lzma
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from asyncstream import LocalS3, S3Options, ShardStream, pack
from asyncstream.shards._tar import ShardReader
from asyncstream.testing import generate_imagefolder

MB = 1e6
RANGE = 4 << 20
COMPRESSIONS: dict[str, Callable[[bytes], bytes]] = {
    ".tar": lambda b: b,
    ".tar.gz": lambda b: gzip.compress(b, compresslevel=6, mtime=0),
    ".tar.zst": lambda b: _zstd(b),
    ".tar.xz": lambda b: lzma.compress(b, preset=6),
    ".tar.bz2": lambda b: bz2.compress(b, compresslevel=9),
}


def _zstd(data: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor(level=3, write_checksum=True).compress(data)


def reader_alone(shards: list[bytes], min_seconds: float) -> dict[str, Any]:
    """Samples per CPU-second of the tar reader over in-memory shards, 4 MiB at a time."""
    samples = passes = 0
    views = [memoryview(s) for s in shards]
    cpu0 = time.process_time()
    while True:
        for data in views:
            reader = ShardReader("mem.tar", len(data))
            for offset in range(0, len(data), RANGE):
                piece = data[offset : offset + RANGE]
                samples += len(reader.feed(piece, offset, final=offset + RANGE >= len(data)))
        passes += 1
        cpu = time.process_time() - cpu0
        if cpu >= min_seconds:
            break
    return {"samples_per_cpu_s": samples / cpu, "samples": samples, "passes": passes}


def stream_epoch(url: str, options: S3Options | None, chunk: int = 4 << 20) -> dict[str, Any]:
    """Two epochs of one stream without decode; the second (engine kept) counts."""
    kwargs: dict[str, Any] = {"chunk_bytes": chunk, "inflight": 8, "window": 8}
    if options is not None:
        kwargs["s3"] = options
    with ShardStream(url, index_cache=False, **kwargs) as s:
        for epoch in range(2):
            s.set_epoch(epoch)
            engine_cpu0 = s.stats().get("fetch", {}).get("cpu_s", 0.0)
            cpu0 = time.process_time()
            start = time.perf_counter()
            count = nbytes = 0
            for sample in s:
                count += 1
                nbytes += sum(len(v) for k, v in sample.items() if not k.startswith("__"))
            elapsed = time.perf_counter() - start
            cpu = time.process_time() - cpu0
            engine_cpu = s.stats()["fetch"]["cpu_s"] - engine_cpu0
    return {
        "samples/s": count / elapsed,
        "MB/s": nbytes / elapsed / MB,
        "samples": count,
        "consumer_cpu_s": cpu,
        "samples_per_cpu_s": count / cpu,
        "engine_cpu_s": engine_cpu,
        "seconds": elapsed,
    }


def best(runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    return max(runs, key=lambda r: float(r[key]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--parts", type=lambda t: t.split(","), default=["reader", "stream", "compressed"]
    )
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument(
        "--data",
        help="a folder to keep the generated shards in and reuse (default: a new one)",
    )
    args = parser.parse_args()
    # --quick is a smoke run (tests/test_bench_modules.py): every part, at its smallest.
    images, per_shard = (40, 10) if args.quick else (1200, 100)
    out: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "revision_reads_compressed": _reads_compressed(),
    }
    with tempfile.TemporaryDirectory() as tmp, LocalS3(mode="process") as server:
        root = Path(tmp)
        plain = Path(args.data) if args.data else root / "plain"
        if not list(plain.glob("*.tar")):
            # A pool of processes costs more than it saves on a quick run's 40 images.
            workers = 1 if args.quick else None
            generate_imagefolder(root / "images", images, 100, seed=0, workers=workers)
            pack(
                root / "images",
                str(plain),
                shard_samples=per_shard,
                shard_bytes=None,
                shuffle_seed=0,
            )
        shards = sorted(plain.glob("*.tar"))
        data = [p.read_bytes() for p in shards]
        out["dataset"] = f"{images} JPEGs, {len(shards)} shards, {sum(map(len, data)) / MB:.0f} MB"
        options = server.options()
        client = server.client()
        client.create_bucket(Bucket="tarread")
        for path, body in zip(shards, data, strict=True):
            client.put_object(Bucket="tarread", Key=f"plain/{path.name}", Body=body)
        for index in plain.glob("*.json"):  # the manifest: no counting pass on either side
            client.put_object(Bucket="tarread", Key=f"plain/{index.name}", Body=index.read_bytes())
        if "reader" in args.parts:
            runs = [reader_alone(data, 0.5 if args.quick else 5.0) for _ in range(args.repeat)]
            out["reader"] = best(runs, "samples_per_cpu_s")
            print(
                f"reader alone: {out['reader']['samples_per_cpu_s']:,.0f} samples/CPU-s", flush=True
            )
        if "stream" in args.parts:
            for name, url, opts in (
                ("local files", str(plain) + "/", None),
                ("S3, loopback", "s3://tarread/plain/", options),
            ):
                runs = [stream_epoch(url, opts) for _ in range(args.repeat)]
                out.setdefault("stream", {})[name] = best(runs, "samples_per_cpu_s")
                r = out["stream"][name]
                print(
                    f"stream, {name}: {r['samples/s']:,.0f} samples/s, "
                    f"{r['samples_per_cpu_s']:,.0f} samples/CPU-s",
                    flush=True,
                )
        if "compressed" in args.parts and out["revision_reads_compressed"]:
            out["compressed"] = compressed(root, shards, data, server, options, args.repeat)
    print(render(out))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


def _reads_compressed() -> bool:
    try:
        import asyncstream.shards._compressed  # noqa: F401
    except ImportError:
        return False
    return True


def compressed(
    root: Path,
    shards: list[Path],
    data: list[bytes],
    server: LocalS3,
    options: S3Options,
    repeat: int,
) -> dict[str, Any]:
    """Each compression of the same shards, streamed from local files and from S3."""
    client = server.client()
    out: dict[str, Any] = {}
    for suffix, compress in COMPRESSIONS.items():
        folder = root / suffix.replace(".", "_")
        folder.mkdir()
        start = time.process_time()
        stored = [compress(body) for body in data]
        compress_s = time.process_time() - start
        for path, body in zip(shards, stored, strict=True):
            name = path.name.removesuffix(".tar") + suffix
            (folder / name).write_bytes(body)
            client.put_object(Bucket="tarread", Key=f"{folder.name}/{name}", Body=body)
        row: dict[str, Any] = {
            "stored_MB": sum(map(len, stored)) / MB,
            "compress_cpu_s": compress_s,
        }
        for name, url, opts in (
            ("local files", str(folder) + "/", None),
            ("S3, loopback", f"s3://tarread/{folder.name}/", options),
        ):
            row[name] = best([stream_epoch(url, opts) for _ in range(repeat)], "samples/s")
        out[suffix] = row
        print(
            f"{suffix}: local {row['local files']['samples/s']:,.0f} samples/s, "
            f"S3 {row['S3, loopback']['samples/s']:,.0f} samples/s",
            flush=True,
        )
    return out


def render(out: dict[str, Any]) -> str:
    lines = [f"{out['machine']}; {out['dataset']}; {out['date']}.", ""]
    if "reader" in out:
        r = out["reader"]
        lines.append(
            f"Tar reader alone (4 MiB ranges, in memory): {r['samples_per_cpu_s']:,.0f} "
            "samples per CPU-second."
        )
    if "stream" in out:
        lines += [
            "",
            "| stream from | samples/s | samples per consumer CPU-s | engine CPU-s |",
            "|---|---:|---:|---:|",
        ]
        for name, r in out["stream"].items():
            lines.append(
                f"| {name} | {r['samples/s']:,.0f} | {r['samples_per_cpu_s']:,.0f} | "
                f"{r['engine_cpu_s']:.2f} |"
            )
    if "compressed" in out:
        lines += [
            "",
            "| shards | stored MB | from | samples/s | MB/s | samples per consumer CPU-s | "
            "consumer CPU-s | engine CPU-s |",
            "|---|---:|---|---:|---:|---:|---:|---:|",
        ]
        for suffix, row in out["compressed"].items():
            for name in ("local files", "S3, loopback"):
                r = row[name]
                lines.append(
                    f"| {suffix} | {row['stored_MB']:.1f} | {name} | {r['samples/s']:,.0f} | "
                    f"{r['MB/s']:.0f} | {r['samples_per_cpu_s']:,.0f} | "
                    f"{r['consumer_cpu_s']:.2f} | {r['engine_cpu_s']:.2f} |"
                )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
