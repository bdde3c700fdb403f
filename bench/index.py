"""``asyncstream index`` against raw fetch, and its resume after an interruption.

Run: ``python -m bench.index`` (``--quick`` for a smoke run, ``--json PATH`` to write the
figures). Generates 2,000 photo-like JPEGs, writes them as 20 *foreign* shards with
``webdataset.TarWriter`` (img2dataset's key layout, ``.jpg`` + ``.cls`` + ``.json``, no
index file of any kind) to the embedded S3 server (moto, in a child process), and reads
them through the fault proxy's S3-like profile (20 to 50 ms to first byte, 90 MB/s per
connection; the proxy in a process of its own). Then, interleaved and best of
``--repeat``, with the same engine settings (4 MiB chunks, 8 in flight, rings of 16 slots):

* **raw fetch**: every chunk into the ring and straight back (:func:`bench.stream.raw_fetch`,
  its second pass, the engine up);
* **index**: :func:`asyncstream.index_dataset` with an empty local index cache: every shard
  read through the engine and counted, the manifest written; MB/s from the engine up to
  the last byte (the engine's start-up, about half a second, is left out of both), and
  the wall time of the whole call besides.

Resume: an index interrupted (``KeyboardInterrupt`` from its progress callback, as Ctrl-C
does) once half the shards are read, then run again: the bytes the proxy serves the second
run against the bytes of the shards the first did not finish. Last, a third run on the
unchanged dataset, which reads nothing (every manifest entry keeps its size and ETag).
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from asyncstream import FetchConfig, LocalS3, index_dataset
from asyncstream.dataset._count import CountProgress, CountSettings
from asyncstream.testing import generate_imagefolder

from ._proxy import ProxyProcess
from ._run import arguments, header, report
from .stream import raw_fetch

MB = 1e6
CHUNK = 4 << 20
INFLIGHT = 8


def write_foreign_shards(src: Path, out: Path, shards: int) -> list[Path]:
    """img2dataset-style shards of the JPEGs under ``src``, written by webdataset."""
    import webdataset

    images = sorted(src.rglob("*.jpg"))
    per = -(-len(images) // shards)
    paths = []
    for shard in range(shards):
        path = out / f"{shard:05d}.tar"
        with webdataset.TarWriter(str(path)) as sink:
            for i, image in enumerate(images[shard * per : (shard + 1) * per]):
                key = f"{shard:05d}{i:04d}"
                meta = {"key": key, "caption": image.parent.name, "status": "success"}
                sink.write(
                    {
                        "__key__": key,
                        "jpg": image.read_bytes(),
                        "cls": image.parent.name.encode(),
                        "json": json.dumps(meta).encode(),
                    }
                )
        paths.append(path)
    return paths


class _Interrupt:
    """A progress callback that raises KeyboardInterrupt once ``after`` shards are read."""

    def __init__(self, after: int) -> None:
        self.after = after

    def __call__(self, p: CountProgress) -> None:
        if p.shards >= self.after:
            raise KeyboardInterrupt


def main() -> None:
    args = arguments(__doc__ or "")
    images, n_shards = (200, 4) if args.quick else (2_000, 20)
    out: dict[str, Any] = {
        **header(),
        "settings": f"chunk {CHUNK >> 20} MiB, inflight {INFLIGHT}, S3-like profile",
    }
    with (
        tempfile.TemporaryDirectory() as tmp,
        LocalS3(mode="process") as server,
        ProxyProcess(server.endpoint_url) as proxy,
    ):
        root = Path(tmp)
        generate_imagefolder(root / "images", images, 10, seed=0)
        (root / "tars").mkdir()
        paths = write_foreign_shards(root / "images", root / "tars", n_shards)
        client = server.client()
        client.create_bucket(Bucket="bench")
        for path in paths:
            client.put_object(Bucket="bench", Key=f"foreign/{path.name}", Body=path.read_bytes())
        url = "s3://bench/foreign/"
        total = sum(p.stat().st_size for p in paths)
        out["dataset"] = f"{images} JPEGs in {n_shards} webdataset shards, {total / MB:.0f} MB"
        options = replace(server.options(), endpoint_url=proxy.endpoint_url)
        settings = CountSettings(
            fetch=FetchConfig(inflight=INFLIGHT, chunk_bytes=CHUNK), s3=options
        )
        raws, indexes, walls = [], [], []
        for rep in range(args.repeat):
            raws.append(raw_fetch(url, options, CHUNK, INFLIGHT, INFLIGHT)["MB/s"])
            started = time.perf_counter()
            result = index_dataset(
                url, options=options, counting=settings, index_cache=root / f"cache-{rep}"
            )
            walls.append(time.perf_counter() - started)
            if result.read != n_shards or result.samples != images:
                raise RuntimeError(f"index read {result.read} shards, {result.samples} samples")
            client.delete_object(Bucket="bench", Key="foreign/asyncstream.json")
            indexes.append(result.mb_per_s)
            print(f"raw {raws[-1]:.0f} MB/s, index {indexes[-1]:.0f} MB/s", flush=True)
        out["raw_mb_per_s"] = max(raws)
        out["index_mb_per_s"] = max(indexes)
        out["ratio"] = max(indexes) / max(raws)
        out["index_wall_s"] = min(walls)
        out["index_wall_mb_per_s"] = total / min(walls) / MB
        out["runs"] = {"raw": raws, "index": indexes, "index_wall_s": walls}
        out["resume"] = resume(url, settings, proxy, root / "cache-resume", n_shards, paths)
    report(out, render(out), args.json)


def resume(
    url: str, settings: CountSettings, proxy: ProxyProcess, cache: Path, n: int, paths: list[Path]
) -> dict[str, Any]:
    """Interrupt an index half-way, run it again, then once more on unchanged data."""
    half = n // 2
    before = proxy.stats()["bytes_forwarded"]
    with contextlib.suppress(KeyboardInterrupt):  # as Ctrl-C would
        index_dataset(
            url,
            options=settings.s3,
            counting=settings,
            index_cache=cache,
            progress=_Interrupt(half),
        )
    first = proxy.stats()["bytes_forwarded"] - before
    second = index_dataset(url, options=settings.s3, counting=settings, index_cache=cache)
    resumed = proxy.stats()["bytes_forwarded"] - before - first
    third = index_dataset(url, options=settings.s3, counting=settings, index_cache=cache)
    again = proxy.stats()["bytes_forwarded"] - before - first - resumed
    unfinished = sum(p.stat().st_size for p in paths[half:])
    return {
        "interrupted_after_shards": half,
        "first_run_bytes": first,
        "second_run_cached_shards": second.cached,
        "second_run_read_shards": second.read,
        "second_run_bytes": resumed,
        "unfinished_shard_bytes": unfinished,
        "third_run_unchanged_shards": third.reused,
        "third_run_bytes": again,
    }


def render(out: dict[str, Any]) -> str:
    r = out["resume"]
    return "\n".join(
        [
            f"{out['machine']}; {out['dataset']}; {out['settings']}; {out['date']}.",
            "",
            "| read | MB/s | over raw fetch |",
            "|---|---:|---:|",
            f"| raw fetch (engine into the ring) | {out['raw_mb_per_s']:.0f} | 1.00x |",
            f"| asyncstream index (read, count, write the manifest) | "
            f"{out['index_mb_per_s']:.0f} | {out['ratio']:.2f}x |",
            "",
            f"The whole command, listing, engine start-up and manifest PUT included: "
            f"{out['index_wall_s']:.2f} s ({out['index_wall_mb_per_s']:.0f} MB/s).",
            "",
            f"Resume: interrupted after {r['interrupted_after_shards']} shards "
            f"({r['first_run_bytes'] / MB:.0f} MB served); the second run took "
            f"{r['second_run_cached_shards']} counts from the cache, read "
            f"{r['second_run_read_shards']} shards, {r['second_run_bytes'] / MB:.1f} MB served "
            f"(the unfinished shards are {r['unfinished_shard_bytes'] / MB:.1f} MB); a third "
            f"run on unchanged data kept {r['third_run_unchanged_shards']} entries and was "
            f"served {r['third_run_bytes'] / MB:.2f} MB.",
        ]
    )


if __name__ == "__main__":
    main()
