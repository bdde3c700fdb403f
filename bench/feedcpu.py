"""``python -m bench.feedcpu``: the feed proxy in CPU time, and how many cores each side keeps busy.

DALI over the tiny images preloaded (:func:`bench.feed.ceiling`), the loader over the
same images in local shards (:func:`bench.feed.loader_epochs`) and the batches built
without DALI (:func:`bench.feed.feed_alone`), each timed with ``time.process_time()``
and the wall clock: CPU microseconds per image and the cores busy, so that where the
loader's time goes shows on any machine, whatever else it runs.
"""

from __future__ import annotations

import argparse
import time

import dali_ops

from . import feed as F


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2, help="DALI threads")
    parser.add_argument("--tiny", type=int, default=20_000)
    args = parser.parse_args()
    shards = F.tiny_shards(F.DEFAULT_DATA, args.tiny)
    blobs, labels = F.read_encoded(shards)
    settings = dali_ops.PipelineSettings(image_size=32, num_threads=args.threads)
    images = 3 * len(blobs)

    cpu, wall = time.process_time(), time.perf_counter()
    rates = F.ceiling(dali_ops, settings, blobs, labels, args.batch, "cpu", 3)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    print(
        f"ceiling: {[round(r) for r in rates]} images/s, {1e6 * cpu / images:.1f} CPU us "
        f"per image, {cpu / wall:.2f} cores"
    )
    cpu, wall = time.process_time(), time.perf_counter()
    epochs = F.loader_epochs(dali_ops, shards, settings, args.batch, "cpu", 3)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    print(
        f"loader: {[round(e['images_per_s']) for e in epochs]} images/s, "
        f"{1e6 * cpu / images:.1f} CPU us per image (engine apart: "
        f"{[round(e['engine_us'], 1) for e in epochs]}), {cpu / wall:.2f} cores"
    )
    for _ in range(2):
        cpu = time.process_time()
        rate = F.feed_alone(dali_ops, shards, args.batch)
        cpu = time.process_time() - cpu
        print(
            f"batches alone: {rate:.0f} images/s, {1e6 * cpu / (2 * len(blobs)):.1f} CPU us "
            "per image (two epochs, the first starting the engine)"
        )


if __name__ == "__main__":
    main()
