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


_FULL = {"images": 5000, "shards": 20, "steps": 300}
_QUICK = {"images": 400, "shards": 8, "steps": 30}
"""``--quick``: a smoke run of the whole path (under a minute on two CPU cores)."""


def register(sub: Any) -> None:
    """Add the ``demo`` subcommand to the ``asyncstream`` command's subparsers."""
    demo = sub.add_parser(
        "demo",
        help="generate, pack, stream, decode and train, end to end",
        description="Generate synthetic JPEGs, pack them into shards on an embedded S3 server "
        "(or the endpoint and bucket given), stream them through the window shuffle, decode "
        "them with DALI (on the GPU where there is one) and train a small CNN on them.",
    )

    def sized(name: str, text: str) -> str:
        return f"{text} (default: {_FULL[name]}; {_QUICK[name]} with --quick)"

    demo.add_argument(
        "--quick",
        action="store_true",
        help=f"a smoke run: {_QUICK['images']} images, {_QUICK['shards']} shards, "
        f"{_QUICK['steps']} steps (default: the full demo)",
    )
    demo.add_argument("--images", type=int, help=sized("images", "images to generate"))
    demo.add_argument("--classes", type=int, default=10, help="classes of images")
    demo.add_argument("--shards", type=int, help=sized("shards", "shards to pack them into"))
    demo.add_argument("--steps", type=int, help=sized("steps", "training steps"))
    demo.add_argument("--batch-size", type=int, default=32, help="images per training step")
    demo.add_argument(
        "--image-size", type=int, default=96, help="side of the square images trained on, px"
    )
    demo.add_argument(
        "--device",
        default="auto",
        choices=["auto", "cpu", "gpu"],
        help="where DALI decodes and the model trains; auto: the GPU where there is one",
    )
    demo.add_argument(
        "--workers",
        type=int,
        default=0,
        help="DataLoader worker processes reading and batching the samples (default: 0, a "
        "thread of the training process; on a GPU, 2 to 4 feed it faster)",
    )
    demo.add_argument(
        "--endpoint-url",
        help="use this S3 endpoint instead of an embedded one (default: an embedded server)",
    )
    demo.add_argument("--bucket", default="asyncstream-demo", help="the bucket to pack into")
    demo.add_argument(
        "--profile",
        help="AWS profile, with --endpoint-url or for AWS (default: AWS_PROFILE, else the "
        "default profile)",
    )
    demo.add_argument(
        "--no-progress", action="store_true", help="no progress bars (default: shown)"
    )
    demo.set_defaults(func=run)


def _sizes(args: argparse.Namespace) -> None:
    """Fill ``--images``, ``--shards`` and ``--steps`` left unset, by ``--quick``."""
    preset = _QUICK if args.quick else _FULL
    for name, value in preset.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name in ("images", "classes", "shards", "steps", "batch_size", "image_size"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")


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
    from asyncstream.cli._cli import human
    from asyncstream.cli._commands import list_shards
    from asyncstream.testing import generate_imagefolder

    from ._loader import DALIImageLoader

    _sizes(args)
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
        with tqdm(
            total=args.images, unit="img", desc="generating", disable=args.no_progress
        ) as bar:
            paths = generate_imagefolder(
                Path(tmp) / "images",
                args.images,
                args.classes,
                seed=0,
                progress=lambda done, _total: bar.update(done - bar.n),
            )
        size = sum(p.stat().st_size for p in paths)
        print(
            f"generated {len(paths):,} JPEGs in {args.classes} classes, {human(size)} "
            f"({human(size / len(paths))} each), in {time.perf_counter() - started:.1f} s"
        )
        # A prefix of the demo's own: rerunning it replaces its shards and nothing else.
        dest = f"s3://{args.bucket}/asyncstream-demo/train/"
        with tqdm(total=args.images, unit="img", desc="packing", disable=args.no_progress) as bar:

            def packed(done: int, nbytes: int, total: int) -> None:
                bar.total = total
                bar.set_postfix_str(human(nbytes), refresh=False)
                bar.update(done - bar.n)

            pack(
                Path(tmp) / "images",
                dest,
                shard_samples=math.ceil(args.images / args.shards),
                shard_bytes=None,
                shuffle_seed=0,
                options=options,
                overwrite=True,
                progress=packed,
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
    loader = loader_cls(
        stream, args.batch_size, args.image_size, device=args.device, workers=args.workers
    )
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
                if step % 10 == 0 or step >= args.steps:
                    for stats in _readers(loader.stats()["stream"]):
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
        stall = loader.stats()["stall"]
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
        f"  waiting on data     the training loop waited "
        f"{stall['epoch']['waited_share']:.0%} of the time on data in its last epoch"
        + (f" (likely limit: {stall['limit']})" if stall["limit"] else "")
        + "\n"
        f"  shuffle radius      up to {radius} samples resident, up to {open_shards} shards open\n"
        f"  retries             {fetch.get('retries_total', 0)}\n"
        f"  train accuracy      {correct / max(images, 1):.1%} overall, "
        f"last loss {_mean(losses[-20:]):.3f}\n"
        f"  peak memory         {peak / 2**20:.0f} MiB RSS here, "
        f"{engine_rss / 2**20:.0f} MiB in the engine, ring {ring / 2**20:.0f} MiB shared "
        f"per reader ({max(1, args.workers)} reader(s))"
    )
    return 0


def _readers(stream: dict[str, Any]) -> list[dict[str, Any]]:
    """The statistics of each reader: the stream's, or each DataLoader worker's."""
    workers = stream.get("workers")
    return list(workers.values()) if isinstance(workers, dict) else [stream]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")
