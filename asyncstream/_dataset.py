"""Opening a dataset: its shards, and the samples in each, read from an index wherever one is.

:func:`open_dataset` is what a stream (and ``asyncstream ls``) calls. Where counts come
from, first that answers, per shard:

1. ``samples_per_shard=`` given by the caller (then no index is looked for at all);
2. an index: the dataset URL itself (``.../asyncstream.json``, a wids shard index,
   ``_info.json``, ``sizes.json``), or one found beside the shards (:mod:`._index`);
3. the local index cache (:mod:`._index_cache`): counts of shards counted before, by any
   process;
4. counting through the fetch engine (:mod:`._count`), which a log line announces, with
   the ``asyncstream index`` command that makes it unnecessary. The counts go to the cache.

The index is the truth about which shards make the dataset. Under a prefix (or local
folder), the shallowest folder with an index governs every shard below it: shards of
its chosen split are read, shards of its other splits left out silently, and any other
``.tar`` is stale: left out with a :class:`~asyncstream.StaleShardWarning` naming it
(``strict=True``: a :class:`~asyncstream.DataError`). Shards named one by one (a brace
pattern, a list) are read whether or not the index beside them lists them; those it does
not list are counted. Wherever an index and the store disagree (a shard it lists is
missing, its size or ETag differs, or its count cannot fit the shard: every member
takes a 512-byte header) the open fails with a ``DataError`` naming the shard and the
index file, never a silent guess.

An index given as the dataset URL that records every shard's size (asyncstream's
manifest; wids with ``filesize``) opens with that one GET: no listing, no HEAD.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ._count import CountSettings, OnProgress, count_shards, count_shared, distributed
from ._exceptions import DataError, NotFoundError, ShardURLError, StaleShardWarning
from ._index import Entry, Index, find_index, folder_of, parse_index
from ._index_cache import IndexCache
from ._objects import Objects
from ._s3 import S3Options
from ._tar import check_not_empty
from ._urls import (
    Resolved,
    Shard,
    folder_url,
    local_path,
    local_uri,
    reject_duplicates,
    resolve_shards,
    resolve_urls,
)

__all__ = ["Dataset", "IndexInfo", "OnProgress", "open_dataset", "plan_dataset"]

_log = logging.getLogger("asyncstream")
_HEADER = 512
_SOURCES = ("index", "given", "cache", "counted")
_NAMED_IN_MESSAGES = 5


@dataclass(frozen=True)
class IndexInfo:
    """Where a dataset's sample counts came from.

    Attributes:
        indexes: ``(kind, url)`` of every index file used, in order of first use.
        split: the split chosen (``None``: none, or the only one).
        sources: shards whose count came from each source: ``"index"``, ``"given"``
            (``samples_per_shard``), ``"cache"`` (the local index cache) or ``"counted"``.
        stale: ``.tar`` shards under a prefix that its index does not list (left out).
        stale_examples: the first few of them.
    """

    indexes: tuple[tuple[str, str], ...] = ()
    split: str | None = None
    sources: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_SOURCES, 0))
    stale: int = 0
    stale_examples: tuple[str, ...] = ()

    @property
    def kind(self) -> str | None:
        """The kind of the (first) index used, ``None`` without one."""
        return self.indexes[0][0] if self.indexes else None

    @property
    def url(self) -> str | None:
        """The (first) index file used, ``None`` without one."""
        return self.indexes[0][1] if self.indexes else None

    def as_dict(self) -> dict[str, Any]:
        """Plain data, for ``stats()`` and ``asyncstream ls --json``."""
        return {
            "kind": self.kind,
            "url": self.url,
            "indexes": [list(i) for i in self.indexes],
            "split": self.split,
            "shards": dict(self.sources),
            "stale": self.stale,
            "stale_examples": list(self.stale_examples),
        }

    def describe(self) -> str:
        """One line: the index used and where the counts came from."""
        where = f"{self.kind} index {self.url}" if self.indexes else "no index"
        if len(self.indexes) > 1:
            where += f" (and {len(self.indexes) - 1} more)"
        counts = ", ".join(f"{n} {source}" for source, n in self.sources.items() if n)
        stale = f"; {self.stale} stale .tar left out" if self.stale else ""
        return f"{where}{'; counts: ' + counts if counts else ''}{stale}"


@dataclass(frozen=True)
class Dataset:
    """The shards of a dataset, their sample counts, and where the counts came from."""

    shards: tuple[Shard, ...]
    counts: tuple[int, ...]
    info: IndexInfo


@dataclass
class DatasetPlan:
    """A dataset's shards with the counts known without reading any shard.

    Attributes:
        shards: the shards, in dataset order.
        counts: the counts known so far, by shard URL.
        uncovered: positions of shards no index (nor ``samples_per_shard``) covers: the
            same on every rank, whatever each rank's cache holds.
    """

    shards: list[Shard]
    counts: dict[str, int]
    uncovered: list[int]
    info: IndexInfo
    hint: str


class _Opener:
    """One open: the store, the indexes read so far, and what each shard got."""

    def __init__(self, options: S3Options, split: str | None, needs_s3: bool) -> None:
        self.options = options
        self.objects = Objects(options)
        self.client = self.objects.client if needs_s3 else None
        self.split = split
        self.shards: list[Shard] = []
        self.counts: dict[str, int] = {}
        self.sources: Counter[str] = Counter()
        self.indexes: dict[str, str] = {}  # index url -> kind
        self.split_used = False
        self.stale: list[tuple[str, Index]] = []

    def use(self, shard: Shard, index: Index | None, entry: Entry | None) -> None:
        self.shards.append(shard)
        if index is not None and entry is not None:
            _check(shard, entry, index)
            self.counts[shard.url] = entry.samples
            self.sources["index"] += 1
            self.indexes.setdefault(index.url, index.kind)

    def members(self, index: Index) -> list[str]:
        self.split_used |= index.splits is not None
        self.indexes.setdefault(index.url, index.kind)
        return index.members(self.split)

    # -- an index given as the dataset URL --------------------------------------------------

    def index_url(self, url: str) -> None:
        canonical = url if url.startswith("s3://") else local_uri(url)
        raw = self.objects.read(canonical)
        if raw is None:
            raise NotFoundError(f"{url}: no such index file", url=url)
        index = parse_index(canonical, raw, expect=None, rebase=False)
        if index is None:  # pragma: no cover - expect=None never returns None
            raise DataError(f"{url}: not an index")
        members = self.members(index)
        entries = [index.entries[u] for u in members]
        if all(e.size is not None for e in entries):
            shards = [Shard(u, e.size or 0, e.etag) for u, e in zip(members, entries, strict=True)]
        else:
            try:
                shards = resolve_shards(members, self.options, client=self.client)
            except NotFoundError as exc:
                raise DataError(f"{exc.url}: listed by {index.url}, but not found") from exc
        for shard, entry in zip(shards, entries, strict=True):
            self.use(shard, index, entry)

    # -- shards named one by one ------------------------------------------------------------

    def named(self, run: Resolved) -> None:
        by_folder: dict[str, list[Shard]] = {}
        for shard in run.shards:
            by_folder.setdefault(folder_of(shard.url), []).append(shard)
        found: dict[str, Index | None] = {}
        children = _children(run.listed)
        for folder, shards in by_folder.items():
            # A folder listed on the way (many shards named in it) has its named shards in
            # the listing; one sized by HEAD has nothing listed, and its index files are probed.
            known = children.get(folder) or None
            if folder.startswith("file://"):
                known = _local_children(folder)
            found[folder] = find_index(
                folder, self.objects.read, known=known, shard_urls=[s.url for s in shards]
            )
        for shard in run.shards:
            index = found[folder_of(shard.url)]
            entry = index.entries.get(shard.url) if index is not None else None
            if index is not None and index.splits is not None:
                self.split_used = True
            self.use(shard, index, entry)

    # -- a prefix or a local folder ---------------------------------------------------------

    def prefix(self, run: Resolved) -> None:
        root = folder_url(run.url)
        folders: set[str] = set()
        for shard in run.shards:
            folder = folder_of(shard.url)
            while folder.startswith(root) and folder not in folders:
                folders.add(folder)
                folder = folder_of(folder)
        governing: dict[str, Index] = {}
        children = _children(run.listed)
        for folder in sorted(folders, key=lambda f: (f.count("/"), f)):
            if any(_under(folder, g) for g in governing):
                continue  # an index higher up governs this folder already
            local = folder.startswith("file://")
            known = _local_children(folder) if local else children.get(folder, set())
            index = find_index(folder, self.objects.read, known=known)
            if index is not None:
                governing[folder] = index
        governed: dict[str, list[Shard]] = {folder: [] for folder in governing}
        for shard in run.shards:
            owner = next((g for g in governing if _under(folder_of(shard.url), g)), None)
            if owner is None:
                self.use(shard, None, None)
            else:
                governed[owner].append(shard)
        for folder, index in governing.items():
            self._governed(run, index, governed[folder])

    def _governed(self, run: Resolved, index: Index, shards: list[Shard]) -> None:
        members = self.members(index)
        listed = {s.url: s for s in shards}
        absent = [u for u in members if u not in listed]
        if absent:
            raise DataError(
                f"{_names(absent)}: listed by {index.url}, but not under {run.url} "
                f"({len(absent)} of its {len(members)} shards are missing)"
            )
        chosen = set(members)
        for shard in shards:
            if shard.url in chosen:
                continue
            if shard.url not in index.entries:  # in no split at all: stale
                self.stale.append((shard.url, index))
        for url in members:
            self.use(listed[url], index, index.entries[url])

    def plan(self, urls: Sequence[str], strict: bool, cache: IndexCache | None) -> DatasetPlan:
        if self.split is not None and not self.split_used:
            raise ValueError(
                f"split={self.split!r} was given, but no index with splits was found for "
                f"{', '.join(urls)}"
            )
        if self.stale:
            self._report_stale(strict)
        reject_duplicates(self.shards)
        for shard in self.shards:
            check_not_empty(shard.url, shard.size)
        uncovered = [i for i, s in enumerate(self.shards) if s.url not in self.counts]
        if uncovered and cache is not None:
            cached = cache.get([self.shards[i] for i in uncovered])
            self.counts.update(cached)
            self.sources["cache"] += len(cached)
        info = IndexInfo(
            indexes=tuple((kind, url) for url, kind in self.indexes.items()),
            split=self.split,
            sources={source: self.sources[source] for source in _SOURCES},
            stale=len(self.stale),
            stale_examples=tuple(u for u, _ in self.stale[:_NAMED_IN_MESSAGES]),
        )
        return DatasetPlan(self.shards, self.counts, uncovered, info, _hint(urls, self.shards))

    def _report_stale(self, strict: bool) -> None:
        urls = [u for u, _ in self.stale]
        sources = ", ".join(sorted({index.url for _, index in self.stale}))
        message = (
            f"{_names(urls)}: {len(urls)} .tar not listed by the index {sources}, so not "
            "part of the dataset (stale shards of an earlier pack, say; 'asyncstream pack "
            "--overwrite' removes them)"
        )
        if strict:
            raise DataError(message)
        warnings.warn(message + "; strict=True makes this an error", StaleShardWarning, 2)


def _names(urls: Sequence[str]) -> str:
    shown = ", ".join(urls[:_NAMED_IN_MESSAGES])
    return shown + (f", ... ({len(urls)} in all)" if len(urls) > _NAMED_IN_MESSAGES else "")


def _check(shard: Shard, entry: Entry, index: Index) -> None:
    """Refuse an index entry that does not fit the shard in the store."""
    where = f"{shard.url}: the {index.kind} index {index.url}"
    if entry.size is not None and entry.size != shard.size:
        raise DataError(f"{where} gives {entry.size} bytes, the store has {shard.size}")
    if entry.etag and shard.etag and entry.etag.strip('"') != shard.etag.strip('"'):
        raise DataError(
            f"{where} gives ETag {entry.etag}, the store has {shard.etag} (the shard was "
            "rewritten since it was indexed: run 'asyncstream index' again)"
        )
    if entry.samples * _HEADER > shard.size:
        raise DataError(
            f"{where} gives {entry.samples} samples, more than a shard of {shard.size} bytes "
            "can hold (every member takes a 512-byte header)"
        )


def _under(folder: str, ancestor: str) -> bool:
    return folder == ancestor or folder.startswith(ancestor + "/")


def _children(listed: dict[str, Shard]) -> dict[str, set[str]]:
    """Folder URL to the URLs of the listed objects directly in it."""
    out: dict[str, set[str]] = {}
    for url in listed:
        out.setdefault(folder_of(url), set()).add(url)
    return out


def _local_children(folder: str) -> set[str] | None:
    path = local_path(folder)
    try:
        return {(path / name).absolute().as_uri() for name in os.listdir(path)}
    except OSError:
        return None


def _hint(urls: Sequence[str], shards: Sequence[Shard]) -> str:
    if len(urls) == 1 and "{" not in urls[0]:
        return urls[0]
    folders = {folder_of(s.url) for s in shards}
    return f"{folders.pop()}/" if len(folders) == 1 else urls[0]


def _given_counts(given: int | Sequence[int], shards: Sequence[Shard]) -> list[int]:
    if isinstance(given, int):
        if given < 1:
            raise ValueError(f"samples_per_shard must be >= 1, got {given}")
        return [given] * len(shards)
    counts = list(given)
    if len(counts) != len(shards) or any(c < 0 for c in counts):
        raise ValueError(
            f"samples_per_shard needs one count >= 0 per shard: {len(shards)} shards, "
            f"{len(counts)} counts"
        )
    if shards and not any(counts):
        raise ValueError(f"samples_per_shard counts no sample in {len(shards)} shards")
    return counts


def plan_dataset(
    urls: str | Sequence[str],
    options: S3Options,
    *,
    samples_per_shard: int | Sequence[int] | None = None,
    split: str | None = None,
    strict: bool = False,
    cache: IndexCache | None = None,
) -> DatasetPlan:
    """The dataset's shards and the counts known without reading a shard (see
    :func:`open_dataset`, which counts the rest)."""
    items = [urls] if isinstance(urls, str) else list(urls)
    if not items:
        raise ShardURLError("no shard URL given")
    for item in items:
        if not isinstance(item, str):
            raise TypeError(f"shard URLs must be strings, got {type(item).__name__}: {item!r}")
    opener = _Opener(options, split, any(item.startswith("s3://") for item in items))
    if samples_per_shard is not None:
        shards = resolve_shards(items, options, client=opener.client)
        for shard in shards:
            check_not_empty(shard.url, shard.size)
        counts = _given_counts(samples_per_shard, shards)
        info = IndexInfo(split=split, sources={**dict.fromkeys(_SOURCES, 0), "given": len(shards)})
        known = {s.url: n for s, n in zip(shards, counts, strict=True)}
        return DatasetPlan(shards, known, [], info, "")
    segment: list[str] = []

    def flush() -> None:
        if segment:
            for run in resolve_urls(segment, options, client=opener.client):
                (opener.prefix if run.prefix else opener.named)(run)
            segment.clear()

    for item in items:
        if item.lower().endswith(".json"):
            flush()
            opener.index_url(item)
        else:
            segment.append(item)
    flush()
    return opener.plan(items, strict, cache)


def open_dataset(
    urls: str | Sequence[str],
    options: S3Options,
    *,
    samples_per_shard: int | Sequence[int] | None = None,
    split: str | None = None,
    strict: bool = False,
    index_cache: str | os.PathLike[str] | bool | None = None,
    counting: CountSettings | None = None,
    progress: OnProgress | None = None,
) -> Dataset:
    """Resolve a dataset's shards and the samples in each (module docstring).

    Args:
        urls: shard URLs, patterns, prefixes, local folders or index files, or a list.
        options: how to reach S3 (resolved).
        samples_per_shard: counts given by the caller: one for all shards, or a list.
        split: the split of an index with splits (``_info.json``, a manifest with splits).
        strict: a ``.tar`` under a prefix that the index does not list is an error
            rather than a warning.
        index_cache: the local index cache: ``None`` for the default folder, ``False``
            for none, or a folder.
        counting: how shards are read when they must be counted.
        progress: called as counting goes.

    Raises:
        ShardURLError, NotFoundError, AccessDeniedError: bad URLs, missing objects,
            credentials.
        ValueError: bad ``samples_per_shard`` or ``split``.
        DataError: an index that disagrees with the store, a stale shard with ``strict``,
            no sample in any shard.
        CorruptTarError, FetchError: a shard that had to be counted could not be read.
    """
    cache = IndexCache.open(index_cache) if samples_per_shard is None else None
    try:
        plan = plan_dataset(
            urls,
            options,
            samples_per_shard=samples_per_shard,
            split=split,
            strict=strict,
            cache=cache,
        )
        counted = _count_rest(plan, counting or CountSettings(s3=options), cache, progress)
    finally:
        if cache is not None:
            cache.close()
    sources = {**plan.info.sources, "counted": counted}
    counts = tuple(plan.counts[s.url] for s in plan.shards)
    if plan.shards and not any(counts):
        raise DataError(
            f"{_names([s.url for s in plan.shards])}: no sample in any of these "
            f"{len(plan.shards)} shards"
        )
    return Dataset(tuple(plan.shards), counts, replace(plan.info, sources=sources))


def _count_rest(
    plan: DatasetPlan,
    settings: CountSettings,
    cache: IndexCache | None,
    progress: OnProgress | None,
) -> int:
    """Count the shards the plan has no count for; returns how many were counted."""
    shards = plan.shards
    missing = [i for i in plan.uncovered if shards[i].url not in plan.counts]
    group = distributed() if plan.uncovered else None

    def count(todo: Sequence[Shard]) -> list[int]:
        if not todo:
            return []
        size = sum(s.size for s in todo)
        where = f" (rank {group[0]} of {group[1]}: its share)" if group else ""
        _log.warning(
            "counting samples in %d shards (%.0f MB) with no index%s: run "
            "'asyncstream index %s' once to skip this",
            len(todo),
            size / 1e6,
            where,
            plan.hint,
        )
        on_shard = None if cache is None else (lambda s, n: cache.put([(s, n)]))
        return count_shards(todo, settings, on_shard=on_shard, progress=progress).counts

    if group is not None:
        known = plan.counts

        def have(part: Sequence[Shard]) -> dict[str, int]:
            return {s.url: known[s.url] for s in part if s.url in known}

        shared = count_shared(shards, missing, count, have)
        fresh = {shards[i].url: n for i, n in shared.items() if shards[i].url not in plan.counts}
        if cache is not None:
            cache.put((s, fresh[s.url]) for s in shards if s.url in fresh)
    else:
        todo = [shards[i] for i in missing]
        fresh = dict(zip((s.url for s in todo), count(todo), strict=True))
    plan.counts.update(fresh)
    return len(fresh)
