"""Sizes, counts and help text for the command line: ``parse_size``, ``human``,
``megabytes``, ``plural`` and the help formatter that states every option's default."""

from __future__ import annotations

import argparse
import re

__all__ = ["DefaultsHelpFormatter", "human", "megabytes", "parse_size", "plural"]

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``"256MiB"``, ``"64M"``, ``"1.5G"``, ``"4096"`` -> bytes (binary units)."""
    match = _SIZE_RE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 256MiB, 64M or 1G)")
    number, unit = match.groups()
    return int(float(number) * _UNITS[unit.lower()])


def parse_inflight(text: str) -> int | str:
    """``"16"`` -> 16, ``"auto"`` -> ``"auto"`` (``FetchConfig.inflight``: the engine finds
    K itself)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"not a count of GETs: {text!r} (try 8, 16 or auto)")
    return value


def human(n: float) -> str:
    """Bytes in binary units, e.g. ``"12.3 MiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def megabytes(n: float) -> str:
    """Bytes in decimal megabytes, to a tenth below 10 MB: ``"0.3 MB"``, ``"105 MB"``."""
    mb = n / 1e6
    return f"{mb:,.1f} MB" if mb < 10 else f"{mb:,.0f} MB"


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """``n`` and the noun, singular for 1: ``"1 shard"``, ``"14 shards"``, ``"1,000 samples"``."""
    return f"{n:,} {noun if n == 1 else (nouns or noun + 's')}"


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
