"""``asyncstream demo``: the whole pipeline, end to end, on an embedded S3 server.

Generates a realistic JPEG dataset, packs it into shards on a local S3 server (or the
endpoint and bucket given), streams it with :class:`asyncstream.ShardStream`, decodes it
with :class:`dali_ops.DALIImageLoader` (on the GPU where there is one) and trains a small
CNN on it for a few hundred steps. It is registered as the ``demo`` subcommand of the
``asyncstream`` command through the ``asyncstream.commands`` entry point, so that
asyncstream itself never imports DALI.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add the ``demo`` subcommand to the ``asyncstream`` command's subparsers."""
    demo = sub.add_parser("demo", help="generate, pack, stream, decode and train, end to end")
    demo.add_argument("--images", type=int, default=5000, help="images to generate (5000)")
    demo.add_argument("--classes", type=int, default=10)
    demo.add_argument("--shards", type=int, default=20)
    demo.add_argument("--steps", type=int, default=300, help="training steps (300)")
    demo.add_argument("--batch-size", type=int, default=32)
    demo.add_argument("--image-size", type=int, default=96)
    demo.add_argument("--device", default="auto", choices=["auto", "cpu", "gpu"])
    demo.add_argument("--endpoint-url", help="use this S3 endpoint instead of an embedded one")
    demo.add_argument("--bucket", default="asyncstream-demo")
    demo.add_argument("--profile", help="AWS profile, with --endpoint-url or for AWS")
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")
    demo.set_defaults(func=run)


def _model(classes: int) -> Any:
    import torch.nn as nn

    def block(cin: int, cout: int) -> list[Any]:
        return [
            nn.Conv2d(cin, cout, 3, padding=1),
            nn.BatchNorm2d(cout),
            nn.ReLU(),
            nn.MaxPool2d(2),
        ]

    return nn.Sequential(
        *block(3, 16),
        *block(16, 32),
        *block(32, 64),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, classes),
    )


def run(args: argparse.Namespace) -> int:
    """Run the demo; returns the exit code."""
    import torch
    from tqdm import tqdm

    from asyncstream import LocalS3, S3Options, ShardStream, pack
    from asyncstream._cli import human, list_shards
    from asyncstream.testing import generate_imagefolder

    from ._loader import DALIImageLoader

    server: contextlib.AbstractContextManager[Any] = (
        contextlib.nullcontext() if args.endpoint_url else LocalS3(mode="process")
    )
    with server as local, tempfile.TemporaryDirectory(prefix="asyncstream-demo-") as tmp:
        if local is not None:
            options = local.options()
            local.client().create_bucket(Bucket=args.bucket)
            print(f"embedded S3 server at {options.endpoint_url}")
        else:
            options = S3Options(endpoint_url=args.endpoint_url, profile=args.profile).resolve()
            print(f"S3 endpoint {options.endpoint_url}, bucket {args.bucket}")
        started = time.perf_counter()
        paths = generate_imagefolder(Path(tmp) / "images", args.images, args.classes, seed=0)
        size = sum(p.stat().st_size for p in paths)
        print(
            f"generated {len(paths):,} JPEGs in {args.classes} classes, {human(size)} "
            f"({human(size / len(paths))} each), in {time.perf_counter() - started:.1f} s"
        )
        # A prefix of the demo's own: rerunning it replaces its shards and nothing else.
        dest = f"s3://{args.bucket}/asyncstream-demo/train/"
        pack(
            Path(tmp) / "images",
            dest,
            shard_samples=math.ceil(args.images / args.shards),
            shard_bytes=None,
            shuffle_seed=0,
            options=options,
            overwrite=True,
        )
        rows = list_shards([dest], options, samples=False)
        print(f"packed into {len(rows)} shards at {dest} ({human(sum(r['size'] for r in rows))})")
        return _train(args, dest, options, ShardStream, DALIImageLoader, torch, tqdm)


def _train(
    args: argparse.Namespace,
    dest: str,
    options: Any,
    stream_cls: Any,
    loader_cls: Any,
    torch: Any,
    tqdm: Any,
) -> int:
    window, inflight, chunk = 16, 8, 8 << 20
    stream = stream_cls(
        dest, s3=options, window=window, inflight=inflight, chunk_bytes=chunk, seed=0
    )
    loader = loader_cls(stream, args.batch_size, args.image_size, device=args.device)
    with loader:  # closes the stream too
        on = loader.torch_device
        model = _model(args.classes).to(on)
        optimiser = torch.optim.AdamW(model.parameters(), lr=3e-3)
        loss_fn = torch.nn.CrossEntropyLoss()
        bar = tqdm(total=args.steps, unit="step", disable=args.no_progress, desc="training")
        started = time.perf_counter()
        first_batch = 0.0
        images = correct = step = epoch = engine_rss = radius = open_shards = 0
        fetch: dict[str, Any] = {}  # the engine's counters, kept over epochs
        losses: list[float] = []
        while step < args.steps:
            loader.set_epoch(epoch)
            for batch, labels in loader:
                if step == 0:
                    first_batch = time.perf_counter() - started
                logits = model(batch)
                loss = loss_fn(logits, labels)
                optimiser.zero_grad(set_to_none=True)
                loss.backward()
                optimiser.step()
                images += len(labels)
                correct += int((logits.argmax(1) == labels).sum())
                losses.append(float(loss.detach()))
                step += 1
                if step % 10 == 0 or step >= args.steps:  # stats ask the engine process
                    stats = stream.stats()
                    fetch = stats.get("fetch", fetch)
                    radius = max(radius, stats.get("shuffle_radius", 0))
                    open_shards = max(open_shards, stats.get("open_shards", 0))
                    engine_rss = max(engine_rss, fetch.get("max_rss_bytes", 0))
                    elapsed = time.perf_counter() - started
                    bar.set_postfix_str(
                        f"{images / elapsed:.0f} img/s, "
                        f"{fetch.get('bytes', 0) / elapsed / 1e6:.1f} MB/s, "
                        f"retries {fetch.get('retries_total', 0)}, "
                        f"loss {_mean(losses[-20:]):.2f}"
                    )
                bar.update()
                if step >= args.steps:
                    break
            epoch += 1
        bar.close()
        elapsed = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    ring = stream.ring_bytes
    print(
        "\nsummary\n"
        f"  device              {on}\n"
        f"  trained             {step} steps x {args.batch_size} images at {args.image_size} px "
        f"over {epoch} epoch(s)\n"
        f"  throughput          {images / elapsed:.0f} images/s, decode and training "
        f"included ({elapsed:.1f} s)\n"
        f"  first batch after   {first_batch:.2f} s\n"
        f"  shuffle radius      up to {radius} samples resident, up to {open_shards} shards open\n"
        f"  retries             {fetch.get('retries_total', 0)}\n"
        f"  train accuracy      {correct / max(images, 1):.1%} overall, "
        f"last loss {_mean(losses[-20:]):.3f}\n"
        f"  peak memory         {peak / 2**20:.0f} MiB RSS here, "
        f"{engine_rss / 2**20:.0f} MiB in the engine, ring {ring / 2**20:.0f} MiB shared"
    )
    return 0


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")
