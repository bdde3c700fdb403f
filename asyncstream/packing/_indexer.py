"""``asyncstream index``: read every shard once and write asyncstream's manifest.

The manifest, ``asyncstream.json``, records every shard's samples, size and ETag (see
:mod:`._index`); a stream opens an indexed dataset from it with one GET and no shard
read. :func:`index_dataset` builds it:

* **The shards**: every shard (plain or compressed) the URL resolves to (a prefix, a
  pattern, a folder), or the shards of an index given as the URL (a wids index,
  ``_info.json``, ...). A new
  shard under the prefix is indexed, whatever an older ``asyncstream.json`` said; but
  where another tool's index lies in the prefix's folder, its shards (every split) are
  the dataset, as for a stream, and a shard it does not list is left out with a
  :class:`~asyncstream.StaleShardWarning`. Splits (of an ``_info.json``, or of the older
  manifest) are carried over.
* **What is read**: nothing for a shard whose entry in the manifest already there keeps
  its size and ETag (a local file, which has no ETag, is read again unless the local
  index cache has it); nothing for a shard the local index cache has; every other shard
  is read once through the fetch engine (:mod:`._count`: ``inflight`` ranged GETs, the
  stream's retries, timeouts, adaptive concurrency and ETag checks). Counts of other
  tools' indexes are not trusted here: the manifest says what the bytes hold.
* **Resuming**: each shard's count goes to the local index cache as soon as it is read,
  so a run interrupted (Ctrl-C, a kill, a failure) and started again reads only the
  shards it had not finished.
* **Where**: beside the shards (``{folder}/asyncstream.json``), or ``output`` (a local
  path or an ``s3://`` URL, for a bucket that cannot be written): shard URLs under the
  manifest's folder are written relative to it, others absolute, so a manifest kept
  elsewhere opens the dataset when given as the stream's URL. A local manifest is
  replaced atomically, an S3 one with one PUT.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass

from .._exceptions import DataError, NotFoundError, ShardURLError
from ..dataset._count import CountSettings, count_shards
from ..dataset._index import (
    MANIFEST_NAME,
    Index,
    find_index,
    folder_of,
    manifest_bytes,
    parse_index,
)
from ..dataset._index_cache import IndexCache
from ..dataset._opener import governed, report_stale
from ..dataset._progress import Progress, check_progress, showing
from ..dataset._resolve import resolve_shards, resolve_urls
from ..shards._tar import check_not_empty
from ..shards._urls import Shard, reject_duplicates
from ..stores._registry import canonical_url, folder_url
from ..stores._s3 import S3Options
from ..stores._stores import Stores

__all__ = ["IndexResult", "index_dataset"]

_log = logging.getLogger("asyncstream")


@dataclass(frozen=True)
class IndexResult:
    """What :func:`index_dataset` did.

    Attributes:
        manifest: the URL of the manifest written.
        shards: shards in the manifest.
        samples: samples in them.
        read: shards read (counted) by this run.
        reused: shards whose entry in the previous manifest was kept (same size and ETag).
        cached: shards whose count came from the local index cache.
        bytes_read: bytes of the shards read.
        seconds: time spent reading them (from the fetch engine up to the last byte).
        retries: chunk downloads retried.
    """

    manifest: str
    shards: int
    samples: int
    read: int
    reused: int
    cached: int
    bytes_read: int
    seconds: float
    retries: int

    @property
    def mb_per_s(self) -> float:
        """Reading speed, MB/s (0 when nothing was read)."""
        return self.bytes_read / self.seconds / 1e6 if self.seconds > 0 else 0.0


def _manifest_url(output: str | None, default_folder: str) -> str:
    if output is None:
        return f"{default_folder}/{MANIFEST_NAME}"
    url = canonical_url(output)
    return url if url.endswith(".json") else f"{url.rstrip('/')}/{MANIFEST_NAME}"


def _shards_and_splits(
    url: str, options: S3Options, objects: Stores
) -> tuple[list[Shard], dict[str, list[str]] | None, str]:
    """The shards to index, the splits to carry over, and the folder they live in."""
    if url.lower().endswith(".json"):
        canonical = canonical_url(url)
        raw = objects.read(canonical)
        if raw is None:
            raise NotFoundError(f"{url}: no such index file", url=url)
        index = parse_index(canonical, raw, expect=None, rebase=False)
        if index is None:  # pragma: no cover - expect=None never returns None
            raise DataError(f"{url}: not an index")
        try:
            shards = resolve_shards(list(index.entries), stores=objects)
        except NotFoundError as exc:
            raise DataError(f"{exc.url}: listed by {index.url}, but not found") from exc
        return shards, _splits(index, shards), index.folder
    runs = resolve_urls(url, stores=objects)
    shards = [s for run in runs for s in run.shards]
    reject_duplicates(shards)
    if len(runs) == 1 and runs[0].prefix:
        folder = folder_url(runs[0].url)
    else:
        folders = {folder_of(s.url) for s in shards}
        if len(folders) != 1:
            raise ValueError(
                f"{url}: the shards lie in {len(folders)} folders; give --output (output=)"
            )
        folder = folders.pop()
    known = {u for run in runs for u in run.listed if folder_of(u) == folder}
    try:
        found = find_index(folder, objects.read, known=known or None)
    except DataError as exc:  # a broken index is what indexing replaces
        _log.warning("%s (ignored: every shard is indexed anew)", exc)
        return shards, None, folder
    if found is None:
        return shards, None, folder
    if found.kind != "asyncstream" and len(runs) == 1 and runs[0].prefix:
        # Another tool's index says which shards make the dataset (all its splits).
        shards, stale = governed(found, list(found.entries), shards, url)
        if stale:
            report_stale([(u, found) for u in stale], strict=False)
    return shards, _splits(found, shards), folder


def _splits(index: Index, shards: Sequence[Shard]) -> dict[str, list[str]] | None:
    if index.splits is None:
        return None
    present = {s.url for s in shards}
    return {name: [u for u in urls if u in present] for name, urls in index.splits.items()}


def _previous(objects: Stores, url: str) -> dict[str, tuple[int, int, str]]:
    """Entries of the manifest already at ``url`` that carry an ETag: url -> (n, size, etag)."""
    try:
        raw = objects.read(url)
        index = parse_index(url, raw, expect="asyncstream", rebase=False) if raw else None
    except DataError as exc:
        _log.warning("%s cannot be read (%s): every shard will be indexed again", url, exc)
        return {}
    if index is None:
        return {}
    return {
        u: (e.samples, e.size, e.etag.strip('"'))
        for u, e in index.entries.items()
        if e.size is not None and e.etag
    }


def index_dataset(
    url: str,
    *,
    output: str | None = None,
    options: S3Options | None = None,
    counting: CountSettings | None = None,
    index_cache: str | os.PathLike[str] | bool | None = None,
    progress: Progress = None,
) -> IndexResult:
    """Count every shard's samples and write ``asyncstream.json`` (module docstring).

    Args:
        url: a prefix, a brace pattern, a local folder, or an index file.
        output: where to write the manifest (a local path or ``s3://`` URL; a folder
            gets ``asyncstream.json`` in it); default: beside the shards.
        options: how to reach S3.
        counting: how shards are read (``inflight``, ``chunk_bytes``, retries, ...).
        index_cache: the local index cache (``None``: the default folder; ``False``:
            none, so an interrupted run cannot resume).
        progress: while shards are read, ``True`` shows a progress bar and then a
            one-line summary on stderr; a callable is called with each
            :class:`~asyncstream.CountProgress` and shows nothing; ``None`` or
            ``False`` (the default), nothing is shown.

    Returns:
        What was written and read.

    Raises:
        ShardURLError, NotFoundError, AccessDeniedError: bad URL, missing objects.
        CorruptTarError, FetchError: a shard could not be read (the shards read before
            are kept in the cache).
        ValueError: shards in several folders and no ``output``.
    """
    if not isinstance(url, str) or not url:
        raise ShardURLError(f"index needs one URL, got {url!r}")
    check_progress(progress)
    options = (options or S3Options()).resolve()
    objects = Stores(options)
    shards, splits, folder = _shards_and_splits(url, options, objects)
    for shard in shards:
        check_not_empty(shard.url, shard.size)
    target = _manifest_url(output, folder)
    objects.for_url(target).prepare(folder_of(target))  # a read-only store refuses now
    previous = _previous(objects, target)
    counts: dict[str, int] = {}
    for shard in shards:
        old = previous.get(shard.url)
        if old and shard.etag and old[1:] == (shard.size, shard.etag.strip('"')):
            counts[shard.url] = old[0]
    reused = len(counts)
    cache = IndexCache.open(index_cache)
    try:
        todo = [s for s in shards if s.url not in counts]
        cached = cache.get(todo) if cache is not None else {}
        counts.update(cached)
        todo = [s for s in todo if s.url not in counts]
        on_shard = None if cache is None else (lambda s, n: cache.put([(s, n)]))
        settings = counting or CountSettings(s3=options)
        with showing(progress, "indexing") as update:
            counted = count_shards(todo, settings, on_shard=on_shard, progress=update)
    finally:
        if cache is not None:
            cache.close()
    counts.update(zip((s.url for s in todo), counted.counts, strict=True))
    rows = [(s.url, counts[s.url], s.size, s.etag) for s in shards]
    objects.write(target, manifest_bytes(folder_of(target), rows, splits=splits))
    return IndexResult(
        manifest=target,
        shards=len(shards),
        samples=sum(counts.values()),
        read=len(todo),
        reused=reused,
        cached=len(cached),
        bytes_read=counted.bytes,
        seconds=counted.seconds,
        retries=counted.retries,
    )
