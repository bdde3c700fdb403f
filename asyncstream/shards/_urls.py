"""Shard URLs: brace expansion and lists (resolved into shards by
:mod:`asyncstream.dataset._resolve`; what a scheme means is its store's, see
:mod:`asyncstream.stores._registry`).

Accepted forms, alone or in a list:

* ``s3://bucket/path/shard.tar``: one object.
* ``s3://bucket/train-{0000..0099}.tar``: a brace range; zero padding is kept, and
  ``{a,b}`` alternatives and several braces in one URL are allowed.
* ``s3://bucket/prefix/``: every shard (``.tar``, or compressed: ``.tar.gz``, ``.tar.zst``,
  ..., see :mod:`._compressed`) under the prefix (recursively), sorted.
* ``file:///abs/path/shard.tar``, ``/abs/path/shard.tar``, ``relative/shard.tar``, or a
  local folder: local shards (a folder means every shard in it, sorted).

Everything is resolved once, when a stream or command is opened, so that a typo, a
missing object or bad credentials fail before the first training step.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .._exceptions import ShardURLError

__all__ = ["Shard", "expand_braces", "reject_duplicates", "url_items"]

_RANGE_RE = re.compile(r"^(-?\d+)\.\.(-?\d+)(?:\.\.(\d+))?$")
_MAX_EXPANSION = 1_000_000


@dataclass(frozen=True)
class Shard:
    """One resolved shard.

    Attributes:
        url: canonical URL (``s3://bucket/key``, ``file:///abs/path``, ...: its store's).
        size: size in bytes.
        etag: the object's ETag where the store gives one (``None`` for local files).
    """

    url: str
    size: int
    etag: str | None = None


def _split_braces(pattern: str) -> list[str | list[str]]:
    """Split ``pattern`` into literal text and lists of brace alternatives."""
    parts: list[str | list[str]] = []
    pos = 0
    while True:
        start = pattern.find("{", pos)
        close = pattern.find("}", pos)
        if start < 0:
            if close >= 0:
                raise ShardURLError(f"{pattern!r}: unbalanced '}}' at position {close}")
            parts.append(pattern[pos:])
            return parts
        if 0 <= close < start:
            raise ShardURLError(f"{pattern!r}: unbalanced '}}' at position {close}")
        end = pattern.find("}", start)
        if end < 0:
            raise ShardURLError(f"{pattern!r}: unbalanced '{{' at position {start}")
        body = pattern[start + 1 : end]
        if "{" in body:
            raise ShardURLError(f"{pattern!r}: nested braces are not supported")
        parts.append(pattern[pos:start])
        parts.append(_alternatives(pattern, body))
        pos = end + 1


def _alternatives(pattern: str, body: str) -> list[str]:
    match = _RANGE_RE.match(body)
    if match:
        first, last, step_text = match.groups()
        step = int(step_text) if step_text else 1
        lo, hi = int(first), int(last)
        if step < 1:
            raise ShardURLError(f"{pattern!r}: step in {{{body}}} must be >= 1")
        if hi < lo:
            raise ShardURLError(f"{pattern!r}: range {{{body}}} runs backwards")
        if (hi - lo) // step + 1 > _MAX_EXPANSION:
            raise ShardURLError(f"{pattern!r}: range {{{body}}} is too large")
        padded = first.lstrip("-").startswith("0") and len(first.lstrip("-")) > 1
        width = len(first) if padded else 0
        return [str(i).zfill(width) for i in range(lo, hi + 1, step)]
    if "," in body:
        return body.split(",")
    raise ShardURLError(
        f"{pattern!r}: cannot read {{{body}}}: expected a range like {{0000..0099}} "
        "or alternatives like {a,b}"
    )


def expand_braces(pattern: str) -> list[str]:
    """Expand brace ranges and alternatives in a URL.

    Args:
        pattern: e.g. ``"s3://b/train-{0000..0002}.tar"``.

    Returns:
        The expanded URLs in order, e.g. ``[".../train-0000.tar", ..., ".../train-0002.tar"]``.

    Raises:
        ShardURLError: unbalanced or nested braces, a backwards or oversized range.
    """
    parts = _split_braces(pattern)
    choices = [[p] if isinstance(p, str) else p for p in parts]
    total = 1
    for c in choices:
        total *= len(c)
    if total > _MAX_EXPANSION:
        raise ShardURLError(f"{pattern!r}: expands to {total} URLs, more than {_MAX_EXPANSION}")
    return ["".join(combo) for combo in itertools.product(*choices)]


def url_items(urls: str | Sequence[str]) -> list[str]:
    """One URL or a list of them, as a list, checked: non-empty, strings only.

    Raises:
        ShardURLError: an empty list.
        TypeError: an item that is not a string.
    """
    items = [urls] if isinstance(urls, str) else list(urls)
    if not items:
        raise ShardURLError("no shard URL given")
    for item in items:
        if not isinstance(item, str):
            raise TypeError(f"shard URLs must be strings, got {type(item).__name__}: {item!r}")
    return items


def reject_duplicates(shards: Iterable[Shard]) -> None:
    """Refuse a shard named twice (``ShardURLError``)."""
    seen: set[str] = set()
    for shard in shards:
        if shard.url in seen:
            raise ShardURLError(
                f"{shard.url} is named more than once; each shard may appear once per dataset"
            )
        seen.add(shard.url)
