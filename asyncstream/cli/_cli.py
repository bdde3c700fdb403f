"""The ``asyncstream`` command: ``pack``, ``ls``, ``index``, ``generate``, ``serve`` and
``demo``.

``demo``, the end-to-end run, is registered by ``dali_ops`` (it needs DALI, which
asyncstream never imports) through the ``asyncstream.commands`` entry point group.
Every option's help states its default (:class:`DefaultsHelpFormatter`).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import re
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from .._exceptions import AsyncStreamError

if TYPE_CHECKING:  # imported where used: `asyncstream --version` loads none of them
    from ..dataset._count import CountProgress
    from ..dataset._dataset import IndexInfo
    from ..stores._s3 import S3Options

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


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Help in which every option with a default states it: ``(default: X)`` is appended
    where the help text does not already say ``default``, as
    :class:`argparse.ArgumentDefaultsHelpFormatter` does, but never ``(default: None)`` or
    ``(default: False)``, which say nothing."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (
            not action.option_strings
            or "default" in text
            or action.default is None
            or action.default is False
            or action.default is argparse.SUPPRESS
        ):
            return action.help
        return f"{text} (default: %(default)s)"


def _version() -> str:
    try:
        return importlib.metadata.version("asyncstream")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        from .. import __version__

        return __version__


def _options(args: argparse.Namespace) -> S3Options:
    from ..stores._s3 import S3Options

    return S3Options(
        endpoint_url=args.endpoint_url,
        profile=args.profile,
        ca_bundle=args.ca_bundle,
        verify=not args.no_verify_ssl,
    ).resolve()


@contextlib.contextmanager
def _count_bar(enabled: bool, desc: str) -> Iterator[Callable[[CountProgress], None]]:
    """A progress bar for reading shards: MB/s and ETA, shards, samples and retries."""
    from tqdm import tqdm

    bar = tqdm(unit="B", unit_scale=True, desc=desc, disable=not enabled)
    try:

        def update(p: CountProgress) -> None:
            bar.total = p.bytes_total
            bar.set_postfix_str(
                f"{p.shards}/{p.shards_total} shards, {p.samples:,} samples, {p.retries} retries",
                refresh=False,
            )
            bar.update(p.bytes - bar.n)

        yield update
    finally:
        bar.close()


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

    if samples:
        with _count_bar(show_progress, "counting") as update:
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
    summary = f"{len(rows)} shards, {total:,} bytes ({human(total)})"
    if len(known) == len(rows):
        summary += f", {sum(known):,} samples"
    else:
        summary += f", samples unknown for {len(rows) - len(known)} shards (--samples counts them)"
    print(f"{summary}; {info.describe()}")


def _cmd_ls(args: argparse.Namespace) -> int:
    rows, info = describe_shards(
        args.urls,
        _options(args),
        samples=args.samples,
        split=args.split,
        show_progress=sys.stderr.isatty() and not args.no_progress,
    )
    _print_listing(rows, info, args.json)
    return 0


def _cmd_index(args: argparse.Namespace) -> int:
    from .._config import FetchConfig
    from ..dataset._count import CountSettings
    from ..packing._indexer import index_dataset

    options = _options(args)
    fetch = FetchConfig(inflight=args.inflight, chunk_bytes=args.chunk_bytes)
    settings = CountSettings(fetch=fetch, s3=options)
    try:
        with _count_bar(not args.no_progress, "indexing") as update:
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
        f"indexed {result.shards} shards, {result.samples:,} samples: {result.read} read "
        f"({result.bytes_read / 1e6:,.0f} MB at {result.mb_per_s:,.0f} MB/s), {result.reused} "
        f"unchanged, {result.cached} from the local index cache; wrote {result.manifest}"
    )
    return 0


@contextlib.contextmanager
def _pack_bar(enabled: bool, desc: str = "packing") -> Iterator[Any]:
    from tqdm import tqdm

    bar = tqdm(unit="img", desc=desc, disable=not enabled)
    try:

        def update(done: int, nbytes: int, total: int) -> None:
            bar.total = total
            bar.n = done
            bar.set_postfix_str(human(nbytes))
            bar.refresh()

        yield update
    finally:
        bar.close()


@contextlib.contextmanager
def _check_bar(enabled: bool) -> Iterator[Callable[[int, int], None]]:
    from tqdm import tqdm

    bar = tqdm(unit="img", desc="checking", disable=not enabled, miniters=64)
    try:

        def update(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        yield update
    finally:
        bar.close()


def _cmd_pack(args: argparse.Namespace) -> int:
    from .._exceptions import SkippedImageWarning
    from ..packing._pack import pack

    shard_bytes = args.shard_bytes
    if shard_bytes is None and args.shard_samples is None:
        shard_bytes = 256 << 20
    show = not args.no_progress
    with (
        warnings.catch_warnings(),  # the skipped images are listed below, one per line
        _check_bar(show) as checked,
        _pack_bar(show) as update,
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
            f"asyncstream: skipped {len(result.skipped)} bad images (--on-error fail refuses "
            "the pack instead):",
            file=sys.stderr,
        )
        for image in result.skipped:
            print(f"  {image}", file=sys.stderr)
    skipped = f", skipped {len(result.skipped)} bad images" if result.skipped else ""
    print(
        f"packed {result.samples:,} samples of {len(result.classes)} classes into "
        f"{len(result.shards)} shards, {human(result.size)}, at {args.dest}{skipped}"
    )
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from ..testing import generate_imagefolder

    start = time.perf_counter()
    with tqdm(total=args.images, unit="img", desc="generating", disable=args.no_progress) as bar:
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


_BUILT_IN = ("ls", "index", "pack", "generate", "serve")


def _parser(plugins: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="asyncstream",
        description="Stream tar shards of images from S3 into training.",
        formatter_class=DefaultsHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    def s3_flags(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--endpoint-url",
            help="S3-compatible endpoint (MinIO, moto, ...); default: AWS_ENDPOINT_URL or AWS",
        )
        p.add_argument(
            "--profile",
            help="AWS profile from the shared configuration files (default: AWS_PROFILE, "
            "else the default profile)",
        )
        p.add_argument(
            "--ca-bundle",
            help="PEM file of the certificate authorities to trust for https:// endpoints; "
            "default: AWS_CA_BUNDLE, else the system's store",
        )
        p.add_argument(
            "--no-verify-ssl",
            action="store_true",
            help="do not verify TLS certificates (test servers only)",
        )

    ls = sub.add_parser("ls", help="list shards with sizes (and sample counts)")
    ls.add_argument(
        "urls", nargs="+", help="s3://bucket/prefix/, a brace pattern, files, an index file"
    )
    ls.add_argument(
        "--samples", action="store_true", help="count the samples of shards no index covers"
    )
    ls.add_argument(
        "--split", help="the split of an index with splits (_info.json) (default: the only one)"
    )
    ls.add_argument("--json", action="store_true", help="print JSON")
    ls.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar while --samples counts (default: shown on a terminal)",
    )
    s3_flags(ls)
    ls.set_defaults(func=_cmd_ls)

    ix = sub.add_parser(
        "index",
        help="read every shard once and write asyncstream.json (samples, sizes, ETags)",
    )
    ix.add_argument("url", help="s3://bucket/prefix/, a brace pattern, a folder, an index file")
    ix.add_argument(
        "--output",
        help="where to write the manifest (a path or s3:// URL); default: beside the shards",
    )
    ix.add_argument("--inflight", type=int, default=8, help="ranged GETs in flight (default 8)")
    ix.add_argument(  # a string default goes through type=, and reads as the user writes it
        "--chunk-bytes", type=parse_size, default="16MiB", help="bytes per GET (default 16MiB)"
    )
    ix.add_argument("--no-progress", action="store_true", help="no progress bar (default: shown)")
    s3_flags(ix)
    ix.set_defaults(func=_cmd_index)

    pk = sub.add_parser(
        "pack",
        help="pack an ImageFolder tree into tar shards",
        description=(
            "Pack SRC/<class>/<image> into webdataset tar shards of KEY.<image>, KEY.cls and "
            "KEY.json (the source path, class and label). Every image is decoded first; "
            "JPEG, PNG, WebP and BMP are stored as they are, other formats (GIF, TIFF) "
            "converted to PNG, or everything to JPEG with --to-jpeg."
        ),
    )
    pk.add_argument("src", help="folder with one subfolder per class")
    pk.add_argument("dest", help="local folder or s3://bucket/prefix/")
    pk.add_argument(
        "--shard-bytes",
        type=parse_size,
        help="target shard size (default 256MiB unless --shard-samples is given)",
    )
    pk.add_argument(
        "--shard-samples", type=int, help="samples per shard, instead of bytes (default: none)"
    )
    pk.add_argument(
        "--shuffle-seed",
        type=int,
        help="shuffle samples with this seed before sharding (default: class-sorted order)",
    )
    pk.add_argument("--prefix", default="shard-", help="shard name prefix (default shard-)")
    pk.add_argument(
        "--workers",
        type=int,
        default=8,
        help="images checked and shards uploaded in parallel (default 8)",
    )
    pk.add_argument("--no-progress", action="store_true", help="no progress bars (default: shown)")
    pk.add_argument(
        "--overwrite",
        action="store_true",
        help="pack into a destination that holds shards, removing those not written now "
        "(default: refuse)",
    )
    pk.add_argument(
        "--on-error",
        choices=("skip", "fail"),
        default="skip",
        help="an image that does not decode: skip it and list it on stderr, or fail the "
        "pack naming it, before anything is written (default skip)",
    )
    pk.add_argument(
        "--to-jpeg",
        action="store_true",
        help="store every image as a JPEG; JPEGs are kept as they are (default: JPEG, PNG, "
        "WebP and BMP as they are, other formats converted to PNG)",
    )
    pk.add_argument(
        "--jpeg-quality",
        type=int,
        default=95,
        help="quality of images converted by --to-jpeg, 1-100 (default 95)",
    )
    s3_flags(pk)
    pk.set_defaults(func=_cmd_pack)

    gen = sub.add_parser(
        "generate",
        help="generate a synthetic ImageFolder of JPEGs",
        description="Write synthetic photo-like JPEGs (about 108 KB each, ImageNet-like sizes) "
        "into DEST/<class>/, deterministically: the same arguments write the same bytes.",
    )
    gen.add_argument("dest", help="the folder to write into (created if missing)")
    gen.add_argument("--images", type=int, default=2000, help="how many images")
    gen.add_argument(
        "--classes", type=int, default=10, help="how many classes (one subfolder each)"
    )
    gen.add_argument("--seed", type=int, default=0, help="the dataset seed")
    gen.add_argument(
        "--workers", type=int, help="processes rendering images (default: one per core)"
    )
    gen.add_argument("--no-progress", action="store_true", help="no progress bar (default: shown)")
    gen.set_defaults(func=_cmd_generate)

    from ._serve import register as register_serve

    register_serve(sub)
    if plugins:
        _plugins(sub)
    for command in sub.choices.values():  # those the plugins added too
        command.formatter_class = DefaultsHelpFormatter
    return parser


def _plugins(sub: Any) -> None:
    """Add the subcommands other packages register (``dali_ops`` registers ``demo``)."""
    for entry in importlib.metadata.entry_points(group="asyncstream.commands"):
        entry.load()(sub)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``asyncstream`` command."""
    words = list(sys.argv[1:] if argv is None else argv)
    command = next((word for word in words if not word.startswith("-")), None)
    # Other packages' commands load only when one may be asked for or listed: dali_ops's
    # demo imports torch and DALI, seconds that `--version` or `ls` have no use for.
    wanted = command not in _BUILT_IN if command is not None else not words or "-h" in words
    parser = _parser(plugins=wanted or "--help" in words)
    args = parser.parse_args(words)
    try:
        return int(args.func(args))
    except (AsyncStreamError, ValueError, OSError, ImportError) as exc:
        print(f"asyncstream: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("asyncstream: interrupted", file=sys.stderr)
        return 130
