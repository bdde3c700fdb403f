"""The ``asyncstream`` command: ``pack``, ``ls``, ``index``, ``generate``, ``serve``, ``probe`` and
``demo``.

``demo``, the end-to-end run, is registered by ``dali_ops`` (it needs DALI, which
asyncstream never imports) through the ``asyncstream.commands`` entry point group.
Every option's help states its default (:class:`DefaultsHelpFormatter`).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import sys
from collections.abc import Sequence
from typing import Any

from .._exceptions import AsyncStreamError
from ._commands import _cmd_generate, _cmd_index, _cmd_ls, _cmd_pack
from ._format import DefaultsHelpFormatter, human, parse_inflight, parse_size

__all__ = ["DefaultsHelpFormatter", "human", "main", "parse_size"]


def _version() -> str:
    try:
        return importlib.metadata.version("asyncstream")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        from .. import __version__

        return __version__


_BUILT_IN = ("ls", "index", "pack", "generate", "serve", "probe")

PROGRESS_HELP = (
    "no progress bar (default: shown when stderr is a terminal, without -q); the "
    "one-line summary is printed on stdout either way"
)


def _parser(plugins: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="asyncstream",
        description="Stream tar shards of images from S3 into training.",
        epilog=(
            "Progress: pack, index, ls --samples and generate show progress bars on stderr "
            "only when it is a terminal, and never with -q/--quiet or the command's "
            "--no-progress; each ends with a one-line summary on stdout, always (-q too)."
        ),
        formatter_class=DefaultsHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="warnings and errors only, and no progress bars (by default each retried "
        "request is said too); the one-line summary is still printed on stdout",
    )
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
        help="no progress bar while --samples counts (default: shown when stderr is a "
        "terminal, without -q)",
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
    ix.add_argument(
        "--inflight",
        type=parse_inflight,
        default=8,
        help="ranged GETs in flight, or auto: the engine finds the count (default 8)",
    )
    ix.add_argument(  # a string default goes through type=, and reads as the user writes it
        "--chunk-bytes", type=parse_size, default="16MiB", help="bytes per GET (default 16MiB)"
    )
    ix.add_argument("--no-progress", action="store_true", help=PROGRESS_HELP)
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
    pk.add_argument("--no-progress", action="store_true", help=PROGRESS_HELP)
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
    gen.add_argument("--no-progress", action="store_true", help=PROGRESS_HELP)
    gen.set_defaults(func=_cmd_generate)

    from ._serve import register as register_serve

    register_serve(sub)
    from ._probe import register as register_probe

    register_probe(sub, s3_flags)
    if plugins:
        _plugins(sub)
    for command in sub.choices.values():  # those the plugins added too
        command.formatter_class = DefaultsHelpFormatter
    return parser


def _plugins(sub: Any) -> None:
    """Add the subcommands other packages register (``dali_ops`` registers ``demo``)."""
    for entry in importlib.metadata.entry_points(group="asyncstream.commands"):
        entry.load()(sub)


class _Stderr(logging.Handler):
    """The command's own handler: ``asyncstream: message`` on stderr as it is now (a test's
    captured stderr included), so that a slow store is not silence: a request retried is
    said at INFO, with its cause and the wait, and retries past 30 s warn."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("asyncstream: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            print(self.format(record), file=sys.stderr, flush=True)
        except Exception:  # as logging's own handlers do: never raise into the caller
            self.handleError(record)


def _log_to_stderr(level: int) -> None:
    """Send the library's log records at ``level`` and above to stderr, once per process."""
    logger = logging.getLogger("asyncstream")
    if not any(isinstance(h, _Stderr) for h in logger.handlers):
        logger.addHandler(_Stderr())
    logger.setLevel(level)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``asyncstream`` command."""
    words = list(sys.argv[1:] if argv is None else argv)
    command = next((word for word in words if not word.startswith("-")), None)
    # Other packages' commands load only when one may be asked for or listed (the command
    # alone, its --help, or a command not built in), never for `--version` or a built-in
    # command's run or help. Loading one costs its module's imports only: dali_ops's demo
    # imports torch and DALI when it runs, not to add its parser.
    if command is None:
        wanted = not words or "-h" in words or "--help" in words
    else:
        wanted = command not in _BUILT_IN
    parser = _parser(plugins=wanted)
    args = parser.parse_args(words)
    _log_to_stderr(logging.WARNING if args.quiet else logging.INFO)
    try:
        return int(args.func(args))
    except (AsyncStreamError, ValueError, OSError, ImportError) as exc:
        print(f"asyncstream: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("asyncstream: interrupted", file=sys.stderr)
        return 130
