"""Mixing two datasets: how close each batch comes to the weights, and how fast, for
asyncstream against webdataset's ``RandomMix`` and LitData's ``CombinedStreamingDataset``.

The ``mixing`` scenario of ``python -m bench`` (:func:`run`). Two datasets on the same
server: the benchmark's own (``a``, class-sorted) and a second one generated for this
scenario (``b``, a third of its size, other images), mixed ``a : b = 3 : 1``. Every system
reads the same number of samples (about two thirds of what the smaller side could give
at its weight, so that no source runs out), in a process of its own, without DataLoader
workers (a DataLoader's workers each mix on their own: one process shows the mixing):

* asyncstream: ``ShardStream([Source(a, weight=3), Source(b, weight=1)], epoch_size=N)``,
  its engine in its own process (``python -m bench.mixing SPEC OUT``);
* webdataset: ``RandomMix`` of one ``WebDataset(...).shuffle(...)`` per dataset with
  ``probs=[3, 1]`` (:mod:`bench.peers.wds`);
* litdata: each dataset converted with ``optimize``, then ``CombinedStreamingDataset(...,
  weights=(0.75, 0.25), iterate_over_all=False)`` (:mod:`bench.peers.lit`; conversion
  timed apart).

Measured: the **mean absolute deviation per batch** (for each batch of 64 and each source,
``|its share of the batch - its weight|``, averaged over sources and batches), the worst
deviation over every window of 640 consecutive samples, the share of ``a`` over the
whole read, samples/s and MB/s from the dataset's construction to the N-th sample, and
the time to the first sample.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._bench import Bench

WEIGHTS = {"a": 3.0, "b": 1.0}
BATCH = 64
WINDOW = 640


def shares(weights: dict[str, float]) -> dict[str, float]:
    """Weights as fractions of one."""
    total = sum(weights.values())
    return {name: w / total for name, w in weights.items()}


def figures(order: Sequence[str], read: dict[str, Any], window: int) -> dict[str, Any]:
    """What the report shows of one system's mixed read."""
    from asyncstream import mixing_quality

    quality = mixing_quality(order, WEIGHTS, batch_size=BATCH, window=window)
    return {
        "samples": len(order),
        "batch_mad": quality.batch_deviation,
        "worst_window": quality.worst_window,
        "share_a": quality.shares["a"],
        "samples_per_s": read["samples_per_s"],
        "mb_per_s": read["mb_per_s"],
        "first_sample_s": read["first_sample_s"],
        "cpu_s": read["cpu_s"],
    }


# -- the asyncstream child -------------------------------------------------------------


def read_mixed(config: dict[str, Any]) -> dict[str, Any]:
    """``config``: sources (``[{"urls", "name", "weight"}]``), samples, endpoint_url,
    stream (keyword arguments of ShardStream)."""
    from asyncstream import S3Options, ShardStream, Source

    started = time.perf_counter()  # as for the peers: from the dataset's construction
    cpu0 = time.process_time()
    options = S3Options(endpoint_url=config.get("endpoint_url"))
    sources = [Source(**source) for source in config["sources"]]
    order: list[str] = []
    nbytes = 0
    first = None
    with ShardStream(
        sources, epoch_size=config["samples"], s3=options, **config.get("stream", {})
    ) as stream:
        for sample in stream:
            if first is None:
                first = time.perf_counter() - started
            order.append(sample["__source__"])
            nbytes += len(sample["jpg"]) + len(sample["cls"])
        seconds = time.perf_counter() - started
        stats = stream.stats()
    return {
        "phase": "mix",
        "samples": len(order),
        "bytes": nbytes,
        "seconds": seconds,
        "samples_per_s": len(order) / seconds,
        "mb_per_s": nbytes / seconds / 1e6,
        "first_sample_s": first,
        "cpu_s": time.process_time() - cpu0 + float(stats.get("fetch", {}).get("cpu_s", 0)),
        "sources": order,
        "drawn": {name: s["drawn"] for name, s in stats["sources"].items()},
    }


def main() -> None:
    config = json.loads(Path(sys.argv[1]).read_text())
    Path(sys.argv[2]).write_text(json.dumps(read_mixed(config)))


# -- the scenario ----------------------------------------------------------------------


def _second_dataset(b: Bench) -> tuple[str, int]:
    """Generate and upload dataset ``b`` (once per run); its URL and samples."""
    from asyncstream import pack
    from asyncstream.testing import generate_imagefolder

    url = b.url.rstrip("/") + "-b/"
    if "mix_b" not in b.dataset:
        images = max(16, b.sizes.images // 3)
        shards = max(2, b.sizes.shards // 4)
        src = b.workdir / "mix-images"
        generate_imagefolder(src, images, 8, seed=2)
        pack(
            src,
            url,
            shard_samples=-(-images // shards),
            shard_bytes=None,
            shuffle_seed=0,
            options=b.options,
            overwrite=True,
        )
        b.dataset["mix_b"] = {"url": url, "images": images, "shards": shards}
    return url, int(b.dataset["mix_b"]["images"])


def run(b: Bench) -> dict[str, Any]:
    """The scenario (module docstring)."""
    from . import peers
    from ._bench import LOADER_SETTINGS

    url_b, size_b = _second_dataset(b)
    size_a = int(b.dataset["images"])
    share = shares(WEIGHTS)
    # No source may run out before N samples: N at most the smaller side's size over its
    # share, and two thirds of it so that a random mix (RandomMix, litdata) does not either.
    samples = int(min(size_a / share["a"], size_b / share["b"]) * 2 / 3)
    window = min(WINDOW, samples // 2)  # a --quick run reads fewer than 640
    sources = [("a", b.url, WEIGHTS["a"]), ("b", url_b, WEIGHTS["b"])]
    systems: dict[str, Any] = {}
    with b.endpoint() as (options, _):
        config = {
            "sources": [{"urls": u, "name": n, "weight": w} for n, u, w in sources],
            "samples": samples,
            "endpoint_url": options.endpoint_url,
            "stream": LOADER_SETTINGS,
        }
        spec, out = b.workdir / "mix-spec.json", b.workdir / "mix-out.json"
        spec.write_text(json.dumps(config))
        subprocess.run(
            [sys.executable, "-m", "bench.mixing", str(spec), str(out)],
            check=True,
            env=b.child_env(options),
            timeout=900,
        )
        ours = json.loads(out.read_text())
        systems["asyncstream"] = figures(ours["sources"], ours, window)
        names = b.args.peers if b.args.peers is not None else list(peers.PEERS)
        for name in ("webdataset", "litdata"):
            if name not in names:
                continue
            result = peers.run_mix(
                name,
                sources=sources,
                samples=samples,
                workdir=b.args.peer_logs,
                endpoint_url=options.endpoint_url,
                credentials=options.credentials,
                settings=peers.PeerSettings(seed=0, workers=0),
                timeout=900,
            )
            if not result["ok"]:
                systems[name] = {"error": result["error"]}
                continue
            mix = result["mix"]
            systems[name] = {**figures(mix["sources"], mix, window), "convert_s": mix["convert_s"]}
    return {
        "weights": WEIGHTS,
        "samples": samples,
        "datasets": {"a": {"url": b.url, "images": size_a}, "b": {"url": url_b, "images": size_b}},
        "batch": BATCH,
        "window": window,
        "settings": LOADER_SETTINGS,
        "systems": systems,
    }


if __name__ == "__main__":
    main()
