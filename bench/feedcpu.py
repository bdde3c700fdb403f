"""``python -m bench.feedcpu``: the feed proxy in CPU time, and how many cores each side keeps busy.

DALI over the tiny images preloaded (:func:`bench.feed.ceiling`), the loader over the
same images in local shards (:func:`bench.feed.loader_epochs`) and the batches built
without DALI (:func:`bench.feed.feed_alone`), each timed with ``time.process_time()``
and the wall clock: CPU microseconds per image and the cores busy, so that where the
loader's time goes shows on any machine, whatever else it runs.

``--per-thread N``: then N rounds of one epoch of each side, the ceiling's pipeline and
the loader kept across rounds, with each thread's CPU per image from
``/proc/self/task``: DALI's threads, the training thread, and the rest (the loader's
producer thread, which ends with its pass and so is counted as what the process spent
besides the threads alive at both ends; its own CPU, measured in the thread itself, is
given beside it: ``feed_cpu_seconds`` of the loader's ``stats()``), and the fetch engine's
process apart.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import dali_ops
from asyncstream import ShardStream

from . import feed as F

_TICK = os.sysconf("SC_CLK_TCK")


def _threads() -> dict[tuple[str, str], float]:
    """CPU seconds of each live thread of this process, by (thread id, name)."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:  # it ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        out[(tid, name)] = (int(fields[11]) + int(fields[12])) / _TICK
    return out


def _by_thread(run: Callable[[], int]) -> tuple[int, float, dict[str, float]]:
    """``run()`` (returns its images) timed: images, wall seconds, CPU us per image of
    DALI's threads, the training thread, the rest of the process."""
    main = str(threading.get_native_id())
    before, cpu, wall = _threads(), time.process_time(), time.perf_counter()
    images = run()
    after, cpu, wall = _threads(), time.process_time() - cpu, time.perf_counter() - wall
    spent = {k: v - before[k] for k, v in after.items() if k in before}
    dali = sum(v for (_, name), v in spent.items() if name.startswith("[DALI]"))
    training = sum(v for (tid, _), v in spent.items() if tid == main)
    per = {"DALI": dali, "training thread": training, "rest": cpu - dali - training}
    return images, wall, {k: 1e6 * v / images for k, v in per.items()}


def per_thread(
    shards: Any, settings: Any, blobs: list[bytes], labels: list[int], args: Any
) -> None:
    """Rounds of one epoch of the ceiling and of the loader, by thread (module docstring)."""
    source = F.Preloaded(blobs, labels, args.batch)
    pipe = dali_ops.build_pipeline(settings, source, batch_size=args.batch, device="cpu")
    stream = ShardStream(str(shards), window=16, inflight=8, chunk_bytes=8 << 20, seed=0)
    with dali_ops.DALIImageLoader(stream, args.batch, settings=settings, device="cpu") as loader:
        epoch = 0

        def loader_epoch() -> int:
            nonlocal epoch
            loader.set_epoch(epoch)
            epoch += 1
            return sum(int(y.shape[0]) for _, y in loader)

        source.epoch(pipe), loader_epoch()  # warm-up: pipelines built, engine started
        for _ in range(args.per_thread):
            for name, run in (("ceiling", lambda: source.epoch(pipe)), ("loader", loader_epoch)):
                before = loader.stats()
                images, wall, per = _by_thread(run)
                after = loader.stats()
                engine = 1e6 * (F._engine_cpu(after) - F._engine_cpu(before)) / images
                shares = ", ".join(f"{k} {v:.1f}" for k, v in per.items())
                producer = ""
                if name == "loader":
                    cpu = after["feed_cpu_seconds"] - before["feed_cpu_seconds"]
                    producer = f" (of which the producer thread {1e6 * cpu / images:.2f})"
                print(
                    f"{name}: {images / wall:.0f} images/s; CPU us per image: {shares}"
                    f"{producer}, engine {engine:.1f}; "
                    f"{sum(per.values()) * images / 1e6 / wall:.2f} cores"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2, help="DALI threads")
    parser.add_argument("--tiny", type=int, default=20_000)
    parser.add_argument(
        "--per-thread", type=int, default=0, help="rounds of the per-thread breakdown"
    )
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
    if args.per_thread:
        per_thread(shards, settings, blobs, labels, args)


if __name__ == "__main__":
    main()
