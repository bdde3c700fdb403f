"""Shard URLs: parsing, brace expansion, schemes (resolved into shards by :mod:`._resolve`).

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
from pathlib import Path
from urllib.parse import unquote, urlparse

from .._exceptions import ShardURLError

__all__ = [
    "Shard",
    "canonical_url",
    "expand_braces",
    "folder_url",
    "local_path",
    "local_uri",
    "parse_s3_url",
    "reject_duplicates",
    "scheme_of",
    "url_items",
]

_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
_RANGE_RE = re.compile(r"^(-?\d+)\.\.(-?\d+)(?:\.\.(\d+))?$")
_MAX_EXPANSION = 1_000_000


@dataclass(frozen=True)
class Shard:
    """One resolved shard.

    Attributes:
        url: canonical URL, ``s3://bucket/key`` or ``file:///abs/path``.
        size: size in bytes.
        etag: the object's ETag where the store gives one (``None`` for local files).
    """

    url: str
    size: int
    etag: str | None = None

    @property
    def is_local(self) -> bool:
        """Whether the shard is a local file."""
        return self.url.startswith("file://")

    @property
    def bucket(self) -> str:
        """The S3 bucket (``ValueError`` for a local shard)."""
        return parse_s3_url(self.url)[0]

    @property
    def key(self) -> str:
        """The S3 key (``ValueError`` for a local shard)."""
        return parse_s3_url(self.url)[1]

    @property
    def path(self) -> Path:
        """The local path (``ValueError`` for an S3 shard)."""
        if not self.is_local:
            raise ValueError(f"{self.url} is not a local shard")
        return Path(unquote(urlparse(self.url).path))


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


def parse_s3_url(url: str) -> tuple[str, str]:
    """Split ``s3://bucket/key`` into ``(bucket, key)``; the key may be empty or a prefix.

    Raises:
        ShardURLError: not an ``s3://`` URL, or a missing or invalid bucket name.
    """
    if not url.startswith("s3://"):
        raise ShardURLError(f"{url!r} is not an s3:// URL")
    rest = url[len("s3://") :]
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise ShardURLError(f"{url!r}: no bucket name after s3://")
    try:
        check_bucket(bucket)
    except ShardURLError as exc:
        raise ShardURLError(f"{url!r}: {exc}") from None
    return bucket, key


def check_bucket(name: str) -> None:
    """Raise :class:`ShardURLError` unless ``name`` is a valid S3 bucket name."""
    if not _BUCKET_RE.match(name) or ".." in name:
        rule = "3 to 63 lowercase letters, digits, '.' and '-'"
        raise ShardURLError(f"{name!r} is not a valid bucket name ({rule})")


def local_path(url: str) -> Path:
    """The path of a local URL: ``file:///abs/path`` or a plain path (not made absolute).

    Raises:
        ShardURLError: a ``file://`` URL naming another host.
    """
    if url.startswith("file://"):
        parsed = urlparse(url)
        if parsed.netloc not in ("", "localhost"):
            raise ShardURLError(f"{url!r}: file:// URLs must name a local path (file:///...)")
        return Path(unquote(parsed.path))
    return Path(url)


def local_uri(url: str) -> str:
    """The canonical ``file:///abs/path`` URL of a local URL or path."""
    return local_path(url).expanduser().absolute().as_uri()


def canonical_url(url: str) -> str:
    """``s3://`` URLs as they are, local ones as ``file:///abs/path``."""
    return url if scheme_of(url) == "s3" else local_uri(url)


def folder_url(url: str) -> str:
    """The folder URL of a prefix or local folder (no trailing slash)."""
    return url.rstrip("/") if url.startswith("s3://") else local_uri(url)


def scheme_of(url: str) -> str:
    """``"s3"`` or ``"file"`` (a ``file://`` URL or a plain path): the one place a URL's
    scheme is read.

    Raises:
        ShardURLError: an empty string, or another scheme.
    """
    if not url:
        raise ShardURLError("an empty string is not a shard URL")
    scheme = urlparse(url).scheme
    if scheme == "s3":
        return "s3"
    if scheme in ("", "file") or (len(scheme) == 1 and url[1:3] in (":\\", ":/")):
        return "file"
    raise ShardURLError(
        f"{url!r}: unsupported scheme {scheme!r}; expected s3://, file:// or a local path"
    )


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
