"""``asyncstream probe URL``: what will limit a stream of this dataset here
(:mod:`asyncstream.probe`), in words or, with ``--json``, as JSON for scripts."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ._format import parse_size

__all__ = ["register"]


def _ks(text: str) -> tuple[int, ...]:
    try:
        ks = tuple(int(word) for word in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected K values like 1,4,16,64, got {text!r}"
        ) from None
    if not ks or any(k < 1 for k in ks) or list(ks) != sorted(set(ks)):
        raise argparse.ArgumentTypeError(f"expected distinct K >= 1, ascending, got {text!r}")
    return ks


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"expected seconds in (0, 3600], got {text!r}")
    return value


def register(sub: Any, s3_flags: Any) -> None:
    """Add the ``probe`` subcommand (``s3_flags`` adds the store's flags, as for ``ls``)."""
    p = sub.add_parser(
        "probe",
        help="measure what will limit a stream of URL here: network, reader, stream, decode",
        description=(
            "Measure, stage by stage, what limits a stream of URL on this machine: the "
            "first byte and one connection's rate, MB/s against K ranged GETs in flight, "
            "the reader's CPU per GB and per GET, the stream's samples/s without decode, "
            "the feed's and DALI's images/s (where dali_ops and DALI are installed; on "
            "the GPU where there is one); then each stage's ceiling, the one that binds and "
            "the settings to try. Reads only the shards URL names, with the credentials "
            "and settings a stream of it would use."
        ),
    )
    p.add_argument("url", help="s3://bucket/prefix/, a brace pattern, https://..., a folder")
    p.add_argument(
        "--seconds",
        type=_seconds,
        default=30.0,
        help="the measuring budget, shared by the stages (listing, engine starts and "
        "DALI's import come on top)",
    )
    p.add_argument(
        "--k",
        type=_ks,
        default="1,4,16,64",
        help="the ranged GETs in flight to try, comma-separated, ascending",
    )
    p.add_argument(
        "--chunk-bytes",
        type=parse_size,
        default="4MiB",
        help="bytes per GET in the sweep, and the stream's chunk size",
    )
    p.add_argument("--no-decode", action="store_true", help="skip the feed and DALI's decoder")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    s3_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..probe import probe, render
    from ._commands import _options

    def say(line: str) -> None:
        if not args.json and sys.stderr.isatty():
            print(f"asyncstream: probe: {line}", file=sys.stderr, flush=True)

    report = probe(
        args.url,
        _options(args),
        seconds=args.seconds,
        ks=args.k,
        chunk_bytes=args.chunk_bytes,
        decode=not args.no_decode,
        say=say,
    )
    print(json.dumps(report, indent=1) if args.json else render(report))
    return 0
