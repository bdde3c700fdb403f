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

Which shards make the dataset is the index's to say (:mod:`._opener`: stale shards,
splits, an index that disagrees with the store). The cache is opened only when a shard
has no index to count it.

Under ``torch.distributed`` the job opens once: rank 0 plans, the other ranks take its
plan (:mod:`._shared`), and shards without a count are counted between them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..shards._tar import check_not_empty
from ..shards._urls import Shard, url_items
from ..stores._registry import scheme_of, store_class
from ..stores._s3 import S3Options
from ._count import CountSettings, count_shards, count_shared, distributed
from ._index import folder_of
from ._index_cache import IndexCache
from ._opener import Opener
from ._progress import Progress, check_progress, showing
from ._resolve import resolve_shards, resolve_urls
from ._shared import natural, once, shared_open, text
from ._trust import Scope, TrustIndexURLs

__all__ = ["Dataset", "DatasetPlan", "IndexInfo", "open_dataset", "plan_dataset"]

_log = logging.getLogger("asyncstream")
_SOURCES = ("index", "given", "cache", "counted")
_SOURCE_WORDS = {  # IndexInfo.describe(): where a shard's count came from, in words
    "index": "from the index",
    "given": "given (samples_per_shard)",
    "cache": "from the local index cache",
    "counted": "counted by reading them",
}
_STALE_EXAMPLES = 5


@dataclass(frozen=True)
class IndexInfo:
    """Where a dataset's sample counts came from.

    Attributes:
        indexes: ``(kind, url)`` of every index file used, in order of first use.
        split: the split chosen (``None``: none, or the only one).
        sources: shards whose count came from each source: ``"index"``, ``"given"``
            (``samples_per_shard``), ``"cache"`` (the local index cache) or ``"counted"``.
        stale: shards under a prefix that its index does not list (left out).
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
        counts = ", ".join(
            f"{n} {'shard' if n == 1 else 'shards'} {_SOURCE_WORDS[source]}"
            for source, n in self.sources.items()
            if n
        )
        stale = f"; {self.stale} stale .tar left out" if self.stale else ""
        return f"{where}{'; sample counts: ' + counts if counts else ''}{stale}"


@dataclass(frozen=True)
class Dataset:
    """The shards of a dataset, their sample counts, and where the counts came from."""

    shards: tuple[Shard, ...]
    counts: tuple[int, ...]
    info: IndexInfo
    #: the origins (``origin_of``) that only a remote index named, admitted by
    #: ``trust_index_urls``: whoever reads the shards sends the web ones none of the
    #: configured credentials (an object store's bucket has no such split)
    withheld: frozenset[str] = frozenset()


@dataclass
class DatasetPlan:
    """A dataset's shards with the counts known without reading any shard.

    Attributes:
        shards: the shards, in dataset order.
        counts: the counts known so far, by shard URL.
        uncovered: positions of shards no index (nor ``samples_per_shard``) covers: the
            same on every rank, whatever each rank's cache holds.
        withheld: the web origins that get none of the configured credentials
            (:attr:`Dataset.withheld`).
    """

    shards: list[Shard]
    counts: dict[str, int]
    uncovered: list[int]
    info: IndexInfo
    hint: str
    withheld: frozenset[str] = frozenset()

    def as_data(self) -> dict[str, Any]:
        """Plain data (JSON), for the ranks that take rank 0's plan (:mod:`._shared`)."""
        info = self.info
        return {
            "shards": [[s.url, s.size, s.etag] for s in self.shards],
            "counts": self.counts,
            "uncovered": self.uncovered,
            "indexes": [list(i) for i in info.indexes],
            "split": info.split,
            "sources": info.sources,
            "stale": info.stale,
            "stale_examples": list(info.stale_examples),
            "hint": self.hint,
            "withheld": sorted(self.withheld),
        }

    @classmethod
    def from_data(cls, data: Any) -> DatasetPlan:
        """The plan of :meth:`as_data`, every field checked.

        Raises:
            TypeError, ValueError, KeyError, AttributeError: data that is not a plan.
        """
        shards = [Shard(text(u), natural(n), _optional(e)) for u, n, e in data["shards"]]
        counts = {text(u): natural(n) for u, n in data["counts"].items()}
        uncovered = [natural(i) for i in data["uncovered"]]
        if not set(counts) <= {s.url for s in shards} or any(i >= len(shards) for i in uncovered):
            raise ValueError("counts or positions of shards that are not in the plan")
        info = IndexInfo(
            indexes=tuple((text(kind), text(url)) for kind, url in data["indexes"]),
            split=_optional(data["split"]),
            sources={text(k): natural(n) for k, n in data["sources"].items()},
            stale=natural(data["stale"]),
            stale_examples=tuple(text(u) for u in data["stale_examples"]),
        )
        withheld = frozenset(text(o) for o in data["withheld"])
        return cls(shards, counts, uncovered, info, text(data["hint"]), withheld)


def _optional(value: object) -> str | None:
    return None if value is None else text(value)


def _hint(urls: Sequence[str], shards: Sequence[Shard]) -> str:
    if shards and not store_class(scheme_of(shards[0].url)).writable:
        return f"'{urls[0]}' --output asyncstream.json"  # a manifest kept elsewhere
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
    trust_index_urls: TrustIndexURLs = False,
) -> DatasetPlan:
    """The dataset's shards and the counts known without reading a shard (see
    :func:`open_dataset`, which counts the rest)."""
    items = url_items(urls)
    scope = Scope.of(items, trust_index_urls)
    opener = Opener(options, split, scope)
    if samples_per_shard is not None:
        shards = resolve_shards(items, stores=opener.objects)
        for shard in shards:
            check_not_empty(shard.url, shard.size)
        given = _given_counts(samples_per_shard, shards)
        info = IndexInfo(split=split, sources={**dict.fromkeys(_SOURCES, 0), "given": len(shards)})
        known = {s.url: n for s, n in zip(shards, given, strict=True)}
        return DatasetPlan(shards, known, [], info, "")
    segment: list[str] = []

    def flush() -> None:
        if segment:
            for run in resolve_urls(segment, stores=opener.objects):
                (opener.prefix if run.prefix else opener.named)(run)
            segment.clear()

    for item in items:
        if item.lower().endswith(".json"):
            flush()
            opener.index_url(item)
        else:
            segment.append(item)
    flush()
    opener.finish(items, strict)
    shards, counts, sources = opener.shards, opener.counts, opener.sources
    uncovered = [i for i, s in enumerate(shards) if s.url not in counts]
    if uncovered and cache is not None:
        cached = cache.get([shards[i] for i in uncovered])
        counts.update(cached)
        sources["cache"] += len(cached)
    info = IndexInfo(
        indexes=tuple((kind, url) for url, kind in opener.indexes.items()),
        split=split,
        sources={source: sources[source] for source in _SOURCES},
        stale=len(opener.stale),
        stale_examples=tuple(u for u, _ in opener.stale[:_STALE_EXAMPLES]),
    )
    withheld = frozenset(opener.withheld)
    return DatasetPlan(shards, counts, uncovered, info, _hint(items, shards), withheld)


def open_dataset(
    urls: str | Sequence[str],
    options: S3Options,
    *,
    samples_per_shard: int | Sequence[int] | None = None,
    split: str | None = None,
    strict: bool = False,
    index_cache: str | os.PathLike[str] | bool | None = None,
    counting: CountSettings | None = None,
    progress: Progress = None,
    trust_index_urls: TrustIndexURLs = False,
) -> Dataset:
    """Resolve a dataset's shards and the samples in each (module docstring).

    Args:
        urls: shard URLs, patterns, prefixes, local folders or index files, or a list.
        options: how to reach S3 (resolved).
        samples_per_shard: counts given by the caller: one for all shards, or a list.
        split: the split of an index with splits (``_info.json``, a manifest with splits).
        strict: a shard under a prefix that the index does not list is an error
            rather than a warning.
        index_cache: the local index cache: ``None`` for the default folder, ``False``
            for none, or a folder.
        counting: how shards are read when they must be counted.
        progress: while shards are counted, ``True`` shows a bar and a summary line on
            stderr, a callable is called with each
            :class:`~asyncstream.CountProgress`; ``None`` or ``False``, nothing
            (:mod:`._progress`).
        trust_index_urls: what a remote index given as the dataset URL may name beyond
            the origins of ``urls`` (:mod:`._trust`): ``True`` any remote URL, or a list
            of URL prefixes; those admitted get no configured credentials.

    Raises:
        ShardURLError, NotFoundError, AccessDeniedError: bad URLs, missing objects,
            credentials.
        ValueError: bad ``samples_per_shard`` or ``split``.
        DataError: an index that disagrees with the store, a stale shard with ``strict``,
            a remote index naming a shard beyond the origins given (``trust_index_urls``).
        CorruptTarError, FetchError: a shard that had to be counted could not be read.
    """
    check_progress(progress)
    cache = IndexCache.open(index_cache) if samples_per_shard is None else None
    try:

        def make_plan() -> DatasetPlan:
            return plan_dataset(
                urls,
                options,
                samples_per_shard=samples_per_shard,
                split=split,
                strict=strict,
                cache=cache,
                trust_index_urls=trust_index_urls,
            )

        # Under torch.distributed, rank 0 opens and the others take its plan (:mod:`._shared`).
        if shared_open() is None:
            plan = make_plan()
        else:
            plan = once(make_plan, DatasetPlan.as_data, DatasetPlan.from_data)
        counting = counting or CountSettings(s3=options)
        counting = replace(counting, withhold=counting.withhold | plan.withheld)
        counted = _count_rest(plan, counting, cache, progress)
    finally:
        if cache is not None:
            cache.close()
    sources = {**plan.info.sources, "counted": counted}
    counts = tuple(plan.counts[s.url] for s in plan.shards)
    info = replace(plan.info, sources=sources)
    return Dataset(tuple(plan.shards), counts, info, plan.withheld)


def _count_rest(
    plan: DatasetPlan,
    settings: CountSettings,
    cache: IndexCache | None,
    progress: Progress,
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
        with showing(progress) as update:
            return count_shards(todo, settings, on_shard=on_shard, progress=update).counts

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
