"""Shard URLs: parsing, brace expansion, prefix listing, sizes.

Accepted forms, alone or in a list:

* ``s3://bucket/path/shard.tar``: one object.
* ``s3://bucket/train-{0000..0099}.tar``: a brace range; zero padding is kept, and
  ``{a,b}`` alternatives and several braces in one URL are allowed.
* ``s3://bucket/prefix/``: every ``.tar`` under the prefix (recursively), sorted.
* ``file:///abs/path/shard.tar``, ``/abs/path/shard.tar``, ``relative/shard.tar``, or a
  local folder: local shards (a folder means every ``.tar`` in it, sorted).

Everything is resolved once, when a stream or command is opened, so that a typo, a
missing object or bad credentials fail before the first training step.
"""

from __future__ import annotations

import itertools
import posixpath
import re
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from ._exceptions import NotFoundError, ShardURLError
from ._s3 import S3Options, fetch_error_from, sync_client

__all__ = [
    "Resolved",
    "Shard",
    "expand_braces",
    "folder_url",
    "local_path",
    "local_uri",
    "parse_s3_url",
    "reject_duplicates",
    "resolve_shards",
    "resolve_urls",
    "url_items",
]

_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
_RANGE_RE = re.compile(r"^(-?\d+)\.\.(-?\d+)(?:\.\.(\d+))?$")
_MAX_EXPANSION = 1_000_000
# Below this many keys in one folder, HEAD each; from it on, one listing is cheaper.
_LIST_THRESHOLD = 16


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
    if not _BUCKET_RE.match(bucket) or ".." in bucket:
        raise ShardURLError(
            f"{url!r}: {bucket!r} is not a valid bucket name "
            "(3 to 63 lowercase letters, digits, '.' and '-')"
        )
    return bucket, key


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


def folder_url(url: str) -> str:
    """The folder URL of a prefix or local folder (no trailing slash)."""
    return url.rstrip("/") if url.startswith("s3://") else local_uri(url)


def _check_scheme(url: str) -> None:
    if not url:
        raise ShardURLError("an empty string is not a shard URL")
    scheme = urlparse(url).scheme
    if scheme not in ("", "s3", "file") and not (len(scheme) == 1 and url[1:3] in (":\\", ":/")):
        raise ShardURLError(
            f"{url!r}: unsupported scheme {scheme!r}; expected s3://, file:// or a local path"
        )


def _resolve_local(url: str) -> tuple[list[Shard], bool]:
    """The shards of a local file or folder, and whether it is a folder."""
    path = local_path(url).expanduser().absolute()
    if path.is_dir():
        found = sorted(p for p in path.rglob("*.tar") if p.is_file())
        if not found:
            raise NotFoundError(f"{url}: no .tar file in folder {path}", url=url)
        return [Shard(p.as_uri(), p.stat().st_size) for p in found], True
    if not path.exists():
        raise NotFoundError(f"{url}: no such file {path}", url=url)
    if not path.is_file():
        raise ShardURLError(f"{url!r}: {path} is neither a file nor a folder")
    return [Shard(path.as_uri(), path.stat().st_size)], False


def _list_prefix(client: Any, bucket: str, prefix: str, url: str) -> list[Shard]:
    """Every object under ``prefix``, sorted by key (all objects, not only .tar)."""
    shards: list[Shard] = []
    try:
        paginator = client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                shards.append(
                    Shard(f"s3://{bucket}/{obj['Key']}", int(obj["Size"]), obj.get("ETag"))
                )
    except Exception as exc:
        raise fetch_error_from(exc, url) from exc
    return sorted(shards, key=lambda s: s.url)


def _head(client: Any, url: str) -> Shard:
    bucket, key = parse_s3_url(url)
    try:
        head = client.head_object(Bucket=bucket, Key=key)
    except Exception as exc:
        error = fetch_error_from(exc, url)
        if isinstance(error, NotFoundError):
            # HEAD has no body to tell a missing bucket from a missing key: ask the bucket.
            _check_bucket(client, bucket, url)
            error = NotFoundError(f"{url}: no such key in bucket {bucket!r}", url=url)
        raise error from exc
    return Shard(url, int(head["ContentLength"]), head.get("ETag"))


def _resolve_s3_keys(client: Any, urls: Sequence[str], listed: dict[str, Shard]) -> list[Shard]:
    """Sizes of many named objects: HEAD for a few, one listing per folder for many.

    Every object a folder listing returns is added to ``listed`` (by URL).
    """
    by_folder: dict[tuple[str, str], list[str]] = {}
    for url in urls:
        bucket, key = parse_s3_url(url)
        by_folder.setdefault((bucket, posixpath.dirname(key)), []).append(url)
    found: dict[str, Shard] = {}
    heads: list[str] = []
    for (bucket, folder), members in by_folder.items():
        if len(members) < _LIST_THRESHOLD:
            heads.extend(members)
            continue
        prefix = f"{folder}/" if folder else ""
        listing = _list_prefix(client, bucket, prefix, f"s3://{bucket}/{prefix}")
        listed.update((s.url, s) for s in listing)
        for url in members:
            if url in listed:
                found[url] = listed[url]
            else:
                heads.append(url)  # a HEAD gives the precise reason
    if heads:
        with ThreadPoolExecutor(max_workers=min(16, len(heads))) as pool:
            for shard in pool.map(lambda u: _head(client, u), heads):
                found[shard.url] = shard
    return [found[u] for u in urls]


@dataclass(frozen=True)
class Resolved:
    """One run of shard URLs after expansion: its shards and what was listed on the way.

    Attributes:
        url: the URL as given (a prefix, a folder, a file or an expanded pattern's first).
        shards: its shards, in order.
        prefix: whether it is a prefix or folder (every ``.tar`` under it) rather than
            shards named one by one.
        listed: every object a listing returned on the way, ``.tar`` or not, by URL
            (empty where nothing was listed: local files, or S3 keys sized by HEAD).
    """

    url: str
    shards: list[Shard]
    prefix: bool
    listed: dict[str, Shard]


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


def resolve_urls(
    urls: str | Sequence[str], options: S3Options | None = None, *, client: Any = None
) -> list[Resolved]:
    """Resolve shard URLs run by run (see :func:`resolve_shards`, which flattens them).

    Named S3 keys that follow one another are resolved together (one listing per folder
    of many), as one :class:`Resolved` with ``prefix=False``; each prefix or local
    folder is one with ``prefix=True``.

    Raises:
        The errors of :func:`resolve_shards`, except that a shard named twice is not
        checked here.
    """
    items = url_items(urls)
    runs: list[Resolved] = []
    pending_keys: list[str] = []

    def s3() -> Any:
        nonlocal client
        client = client or sync_client((options or S3Options()).resolve())
        return client

    def flush() -> None:
        if pending_keys:
            listed: dict[str, Shard] = {}
            shards = _resolve_s3_keys(s3(), pending_keys, listed)
            runs.append(Resolved(pending_keys[0], shards, False, listed))
            pending_keys.clear()

    for item in items:
        _check_scheme(item)
        for url in expand_braces(item):
            if not url.startswith("s3://"):
                flush()
                shards, folder = _resolve_local(url)
                runs.append(Resolved(url, shards, folder, {}))
                continue
            bucket, key = parse_s3_url(url)
            if key and not key.endswith("/"):
                pending_keys.append(url)
                continue
            flush()
            everything = _list_prefix(s3(), bucket, key, url)
            listed = [s for s in everything if s.url.endswith(".tar")]
            if not listed:
                _check_bucket(s3(), bucket, url)
                raise NotFoundError(f"{url}: no .tar object under this prefix", url=url)
            runs.append(Resolved(url, listed, True, {s.url: s for s in everything}))
    flush()
    return runs


def resolve_shards(
    urls: str | Sequence[str], options: S3Options | None = None, *, client: Any = None
) -> list[Shard]:
    """Resolve shard URLs to a list of shards with sizes, in the order given.

    Args:
        urls: one URL or pattern, or a list of them (see the module docstring).
        options: how to reach S3; resolved from the environment if not already.
        client: a synchronous botocore S3 client to reuse (made from ``options`` if
            ``None``).

    Returns:
        The shards, in the order of ``urls`` (expansions and listings in sorted order).

    Raises:
        ShardURLError: a malformed URL, an empty list or expansion, a shard named twice.
        NotFoundError: a missing bucket, key, file or an empty prefix or folder.
        AccessDeniedError: bad or missing credentials, no permission.
        TransientFetchError: the store could not be reached.
    """
    shards = [s for run in resolve_urls(urls, options, client=client) for s in run.shards]
    reject_duplicates(shards)
    return shards


def _check_bucket(client: Any, bucket: str, url: str) -> None:
    try:
        client.head_bucket(Bucket=bucket)
    except Exception as exc:
        error = fetch_error_from(exc, url)
        if isinstance(error, NotFoundError):
            error = NotFoundError(f"{url}: no such bucket {bucket!r}", url=url)
        raise error from exc


def reject_duplicates(shards: Iterable[Shard]) -> None:
    """Refuse a shard named twice (``ShardURLError``)."""
    seen: set[str] = set()
    for shard in shards:
        if shard.url in seen:
            raise ShardURLError(
                f"{shard.url} is named more than once; each shard may appear once per dataset"
            )
        seen.add(shard.url)
