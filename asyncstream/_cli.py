"""The ``asyncstream`` command: ``pack``, ``ls``, ``generate`` and ``demo``.

``demo``, the end-to-end run, is registered by ``dali_ops`` (it needs DALI, which
asyncstream never imports) through the ``asyncstream.commands`` entry point group.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import re
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tqdm import tqdm

from ._exceptions import AsyncStreamError
from ._manifest import count_shard
from ._s3 import S3Options, sync_client
from ._urls import resolve_shards

__all__ = ["main"]

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``"256MiB"``, ``"64M"``, ``"1.5G"``, ``"4096"`` -> bytes (binary units)."""
    match = _SIZE_RE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 256MiB, 64M or 1G)")
    number, unit = match.groups()
    return int(float(number) * _UNITS[unit.lower()])


def human(n: float) -> str:
    """Bytes in binary units, e.g. ``"12.3 MiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _options(args: argparse.Namespace) -> S3Options:
    return S3Options(endpoint_url=args.endpoint_url, profile=args.profile).resolve()


def list_shards(
    urls: Sequence[str], options: S3Options, *, samples: bool, show_progress: bool = False
) -> list[dict[str, Any]]:
    """Resolve ``urls`` and describe each shard (``url``, ``size``, and ``samples`` if asked)."""
    needs_s3 = any(u.startswith("s3://") for u in urls)
    client = sync_client(options) if needs_s3 else None
    shards = resolve_shards(list(urls), options, client=client)
    rows: list[dict[str, Any]] = [{"url": s.url, "size": s.size} for s in shards]
    if samples:
        with (
            ThreadPoolExecutor(8) as pool,
            tqdm(
                total=len(shards), desc="counting", unit="shard", disable=not show_progress
            ) as bar,
        ):
            for row, count in zip(
                rows, pool.map(lambda s: count_shard(s, client), shards), strict=True
            ):
                row["samples"] = count
                bar.update()
    return rows


def _print_listing(rows: list[dict[str, Any]], as_json: bool) -> None:
    total = sum(r["size"] for r in rows)
    if as_json:
        print(json.dumps({"shards": rows, "total_size": total}, indent=1))
        return
    has_samples = rows and "samples" in rows[0]
    width = max(len(r["url"]) for r in rows)
    for r in rows:
        extra = f"  {r['samples']:>8} samples" if has_samples else ""
        print(f"{r['url']:<{width}}  {r['size']:>14,} B  {human(r['size']):>10}{extra}")
    summary = f"{len(rows)} shards, {total:,} bytes ({human(total)})"
    if has_samples:
        summary += f", {sum(r['samples'] for r in rows):,} samples"
    print(summary)


def _cmd_ls(args: argparse.Namespace) -> int:
    rows = list_shards(
        args.urls, _options(args), samples=args.samples, show_progress=sys.stderr.isatty()
    )
    _print_listing(rows, args.json)
    return 0


@contextlib.contextmanager
def _pack_bar(enabled: bool) -> Iterator[Any]:
    bar = tqdm(unit="img", desc="packing", disable=not enabled)
    try:

        def update(done: int, nbytes: int, total: int) -> None:
            bar.total = total
            bar.n = done
            bar.set_postfix_str(human(nbytes))
            bar.refresh()

        yield update
    finally:
        bar.close()


def _cmd_pack(args: argparse.Namespace) -> int:
    from ._pack import pack

    shard_bytes = args.shard_bytes
    if shard_bytes is None and args.shard_samples is None:
        shard_bytes = 256 << 20
    with _pack_bar(not args.no_progress) as update:
        result = pack(
            args.src,
            args.dest,
            shard_bytes=shard_bytes,
            shard_samples=args.shard_samples,
            shuffle_seed=args.shuffle_seed,
            name_prefix=args.prefix,
            options=_options(args),
            workers=args.workers,
            progress=update,
        )
    print(
        f"packed {result.samples:,} samples of {len(result.classes)} classes into "
        f"{len(result.shards)} shards, {human(result.size)}, at {args.dest}"
    )
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    from ._datagen import generate_imagefolder

    start = time.perf_counter()
    paths = generate_imagefolder(args.dest, args.images, args.classes, seed=args.seed)
    elapsed = time.perf_counter() - start
    size = sum(p.stat().st_size for p in paths)
    print(
        f"wrote {len(paths):,} JPEGs in {args.classes} classes to {args.dest}: "
        f"{human(size)}, {human(size / len(paths))} on average, {len(paths) / elapsed:.0f} img/s"
    )
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="asyncstream", description="Stream tar shards of images from S3 into training."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def s3_flags(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--endpoint-url",
            help="S3-compatible endpoint (MinIO, moto, ...); default: AWS_ENDPOINT_URL or AWS",
        )
        p.add_argument("--profile", help="AWS profile from the shared configuration files")

    ls = sub.add_parser("ls", help="list shards with sizes (and sample counts)")
    ls.add_argument("urls", nargs="+", help="s3://bucket/prefix/, a brace pattern, files")
    ls.add_argument("--samples", action="store_true", help="count samples per shard")
    ls.add_argument("--json", action="store_true", help="print JSON")
    s3_flags(ls)
    ls.set_defaults(func=_cmd_ls)

    pk = sub.add_parser("pack", help="pack an ImageFolder tree into tar shards")
    pk.add_argument("src", help="folder with one subfolder per class")
    pk.add_argument("dest", help="local folder or s3://bucket/prefix/")
    pk.add_argument(
        "--shard-bytes",
        type=parse_size,
        help="target shard size (default 256MiB unless --shard-samples is given)",
    )
    pk.add_argument("--shard-samples", type=int, help="samples per shard (instead of bytes)")
    pk.add_argument("--shuffle-seed", type=int, help="shuffle samples before sharding")
    pk.add_argument("--prefix", default="shard-", help="shard name prefix (default shard-)")
    pk.add_argument("--workers", type=int, default=8, help="parallel shard uploads")
    pk.add_argument("--no-progress", action="store_true", help="no progress bar")
    s3_flags(pk)
    pk.set_defaults(func=_cmd_pack)

    gen = sub.add_parser("generate", help="generate a synthetic ImageFolder of JPEGs")
    gen.add_argument("dest")
    gen.add_argument("--images", type=int, default=2000)
    gen.add_argument("--classes", type=int, default=10)
    gen.add_argument("--seed", type=int, default=0)
    gen.set_defaults(func=_cmd_generate)

    _plugins(sub)
    return parser


def _plugins(sub: Any) -> None:
    """Add the subcommands other packages register (``dali_ops`` registers ``demo``)."""
    for entry in importlib.metadata.entry_points(group="asyncstream.commands"):
        entry.load()(sub)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``asyncstream`` command."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except (AsyncStreamError, ValueError, OSError) as exc:
        print(f"asyncstream: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("asyncstream: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
