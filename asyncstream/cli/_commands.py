"""The commands ``ls``, ``index``, ``pack`` and ``generate``: each ``_cmd_*`` takes the
parsed arguments and returns the exit status; ``list_shards`` and ``describe_shards`` are
the listing ``ls`` prints (``dali_ops``' demo uses them too)."""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ._format import human, megabytes, plural

if TYPE_CHECKING:  # imported where used: `asyncstream --version` loads none of them
    from ..dataset._dataset import IndexInfo
    from ..stores._s3 import S3Options

__all__ = ["describe_shards", "list_shards"]


def _options(args: argparse.Namespace) -> S3Options:
    from ..stores._s3 import S3Options

    return S3Options(
        endpoint_url=args.endpoint_url,
        profile=args.profile,
        ca_bundle=args.ca_bundle,
        verify=not args.no_verify_ssl,
    ).resolve()


def _bars_shown(args: argparse.Namespace) -> bool:
    """Whether a command shows progress bars: on a terminal (stderr), without ``--quiet``
    or ``--no-progress``. The one-line summary is printed on stdout either way."""
    if getattr(args, "quiet", False) or getattr(args, "no_progress", False):
        return False
    return sys.stderr.isatty()


def list_shards(
    urls: Sequence[str], options: S3Options, *, samples: bool, show_progress: bool = False
) -> list[dict[str, Any]]:
    """Describe each shard of a dataset: ``url``, ``size``, and ``samples`` where known."""
    return describe_shards(urls, options, samples=samples, show_progress=show_progress)[0]


def describe_shards(
    urls: Sequence[str],
    options: S3Options,
    *,
    samples: bool,
    split: str | None = None,
    show_progress: bool = False,
) -> tuple[list[dict[str, Any]], IndexInfo]:
    """Describe each shard of a dataset (``url``, ``size``, and ``samples`` where known),
    and say where the counts came from.

    Counts come from the index or the local index cache; with ``samples``, shards with no
    count are read and counted (through the fetch engine) too.
    """
    from ..dataset._count import CountSettings
    from ..dataset._dataset import open_dataset, plan_dataset
    from ..dataset._index_cache import IndexCache
    from ..dataset._progress import count_bar

    if samples:
        with count_bar(show_progress, "counting") as update:
            dataset = open_dataset(
                list(urls),
                options,
                split=split,
                counting=CountSettings(s3=options),
                progress=update,
            )
        rows = [
            {"url": s.url, "size": s.size, "samples": n}
            for s, n in zip(dataset.shards, dataset.counts, strict=True)
        ]
        return rows, dataset.info
    cache = IndexCache.open()
    try:
        plan = plan_dataset(list(urls), options, split=split, cache=cache)
    finally:
        if cache is not None:
            cache.close()
    rows = []
    for shard in plan.shards:
        row: dict[str, Any] = {"url": shard.url, "size": shard.size}
        if shard.url in plan.counts:
            row["samples"] = plan.counts[shard.url]
        rows.append(row)
    return rows, plan.info


def _print_listing(rows: list[dict[str, Any]], info: IndexInfo, as_json: bool) -> None:
    total = sum(r["size"] for r in rows)
    known = [r["samples"] for r in rows if "samples" in r]
    if as_json:
        listing: dict[str, Any] = {"shards": rows, "total_size": total, "index": info.as_dict()}
        if len(known) == len(rows):
            listing["samples"] = sum(known)
        print(json.dumps(listing, indent=1))
        return
    width = max(len(r["url"]) for r in rows)
    for r in rows:
        extra = f"  {r.get('samples', '?'):>8} samples" if known else ""
        print(f"{r['url']:<{width}}  {r['size']:>14,} B  {human(r['size']):>10}{extra}")
    summary = f"{plural(len(rows), 'shard')}, {plural(total, 'byte')} ({human(total)})"
    if len(known) == len(rows):
        summary += f", {plural(sum(known), 'sample')}"
    else:
        unknown = plural(len(rows) - len(known), "shard")
        summary += f", samples unknown for {unknown} (--samples counts them)"
    print(f"{summary}; {info.describe()}")


def _cmd_ls(args: argparse.Namespace) -> int:
    rows, info = describe_shards(
        args.urls,
        _options(args),
        samples=args.samples,
        split=args.split,
        show_progress=_bars_shown(args),
    )
    _print_listing(rows, info, args.json)
    return 0


def _cmd_index(args: argparse.Namespace) -> int:
    from .._config import FetchConfig
    from ..dataset._count import CountSettings
    from ..dataset._progress import count_bar
    from ..packing._indexer import index_dataset

    options = _options(args)
    fetch = FetchConfig(inflight=args.inflight, chunk_bytes=args.chunk_bytes)
    settings = CountSettings(fetch=fetch, s3=options)
    try:
        with count_bar(_bars_shown(args), "indexing") as update:
            result = index_dataset(
                args.url, output=args.output, options=options, counting=settings, progress=update
            )
    except KeyboardInterrupt:
        print(
            "asyncstream: interrupted; the shards read so far are in the local index cache: "
            "run the same command again to go on from there",
            file=sys.stderr,
        )
        return 130
    print(
        f"indexed {plural(result.shards, 'shard')}, {plural(result.samples, 'sample')}: "
        f"{result.read} read ({megabytes(result.bytes_read)} at {result.mb_per_s:,.1f} MB/s), "
        f"{result.reused} unchanged, {result.cached} from the local index cache; "
        f"wrote {result.manifest}"
    )
    return 0


def _cmd_pack(args: argparse.Namespace) -> int:
    from .._exceptions import SkippedImageWarning
    from ..packing._pack import pack
    from ..packing._packbars import pack_bars

    shard_bytes = args.shard_bytes
    if shard_bytes is None and args.shard_samples is None:
        shard_bytes = 256 << 20
    with (
        warnings.catch_warnings(),  # the skipped images are listed below, one per line
        pack_bars(_bars_shown(args)) as (checked, update),
    ):
        warnings.simplefilter("ignore", SkippedImageWarning)
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
            overwrite=args.overwrite,
            on_error=args.on_error,
            to_jpeg=args.to_jpeg,
            jpeg_quality=args.jpeg_quality,
            check_progress=checked,
        )
    if result.skipped:
        print(
            f"asyncstream: skipped {plural(len(result.skipped), 'bad image')} (--on-error fail "
            "refuses the pack instead):",
            file=sys.stderr,
        )
        for image in result.skipped:
            print(f"  {image}", file=sys.stderr)
    skipped = f", skipped {plural(len(result.skipped), 'bad image')}" if result.skipped else ""
    classes = plural(len(result.classes), "class", "classes")
    print(
        f"packed {plural(result.samples, 'sample')} of {classes} into "
        f"{plural(len(result.shards), 'shard')}, {human(result.size)}, at {args.dest}{skipped}"
    )
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from ..testing import generate_imagefolder

    start = time.perf_counter()
    show = _bars_shown(args)
    with tqdm(total=args.images, unit="img", desc="generating", disable=not show) as bar:
        paths = generate_imagefolder(
            args.dest,
            args.images,
            args.classes,
            seed=args.seed,
            workers=args.workers,
            progress=lambda done, _total: bar.update(done - bar.n),
        )
    elapsed = time.perf_counter() - start
    size = sum(p.stat().st_size for p in paths)
    print(
        f"wrote {len(paths):,} JPEGs in {args.classes} classes to {args.dest}: "
        f"{human(size)}, {human(size / len(paths))} on average, {len(paths) / elapsed:.0f} img/s"
    )
    return 0
