"""Several datasets in one stream: the public :class:`Source`, and opening a list of them.

A :class:`~asyncstream.ShardStream` given sources opens each one as it opens a plain
dataset (its URLs, its S3 options, its index or counts), puts all their shards in one
list, read by one fetch engine into one ring, and sets each source's samples per epoch
(:func:`._mix.quotas`). What an epoch reads of each source, and in which order, is
:mod:`._mix`'s.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass, replace
from typing import TYPE_CHECKING, cast

from .._exceptions import AsyncStreamError
from ..order._mix import SourcePlan, quotas
from ..shards._urls import Shard, url_items
from ..stores._s3 import S3Options
from ._progress import Progress
from ._trust import Scope, TrustIndexURLs

if TYPE_CHECKING:  # they import the fetch engine, which the package itself must not load
    from ._count import CountSettings
    from ._dataset import IndexInfo

__all__ = ["OpenedSources", "Source", "name_source", "open_sources", "split_sources"]


@dataclass(frozen=True)
class Source:
    """One dataset of a mixed :class:`~asyncstream.ShardStream`, and its share of each epoch.

    A source's share is a relative ``weight`` (of what the absolute counts leave of the
    epoch) or an absolute number of ``samples`` per epoch, not both; neither means
    ``weight=1``. A share above the source's size repeats its samples, each once before
    any twice; one below it reads a different part each epoch, every sample before any
    repeats (see the README's "Mixing datasets").

    Args:
        urls: the source's shards, as :class:`~asyncstream.ShardStream` takes them (a
            prefix, a brace pattern, local files, an index file, or a list of these).
        weight: its relative weight (>= 0).
        samples: its samples per epoch (>= 1), all ranks together.
        name: its name, the ``__source__`` of its samples and its key in ``stats()``;
            default: the URL (without a trailing ``/``) where there is one, else
            ``"source<i>"``.
        endpoint_url: its S3-compatible endpoint; default: the stream's.
        s3: its full S3 options; default: the stream's (``endpoint_url`` overrides).
        samples_per_shard: its shards' sample counts (one number or a list), instead of
            an index; see :class:`~asyncstream.ShardStream`.
        split: the split to read, for an index with splits.

    Raises:
        ValueError: no URL, a negative or non-finite weight, a weight and ``samples``
            both, ``samples`` below 1, or an empty name; the message names the source.
        TypeError: a weight or ``samples`` that is not a number.
    """

    urls: str | Sequence[str]
    _: KW_ONLY
    weight: float | None = None
    samples: int | None = None
    name: str | None = None
    endpoint_url: str | None = None
    s3: S3Options | None = None
    samples_per_shard: int | Sequence[int] | None = None
    split: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.urls, str):
            object.__setattr__(self, "urls", tuple(self.urls))
        if isinstance(self.samples_per_shard, Sequence):
            object.__setattr__(self, "samples_per_shard", tuple(self.samples_per_shard))
        where = f"source {self.label!r}"
        urls = [self.urls] if isinstance(self.urls, str) else list(self.urls)
        if not urls or not all(isinstance(u, str) and u for u in urls):
            raise ValueError(f"{where} is empty: it names no shard URL")
        if self.name is not None and (not isinstance(self.name, str) or not self.name):
            raise ValueError(f"{where}: name must be a non-empty string, got {self.name!r}")
        if self.weight is not None and self.samples is not None:
            raise ValueError(
                f"{where} has weight={self.weight!r} and samples={self.samples!r}: its "
                "share of the epoch is either a relative weight or an absolute count, not both"
            )
        if self.weight is not None:
            if isinstance(self.weight, bool) or not isinstance(self.weight, numbers.Real):
                raise TypeError(f"{where}: weight must be a number, got {self.weight!r}")
            if not math.isfinite(self.weight) or self.weight < 0:
                raise ValueError(f"{where}: weight must be a finite number >= 0, got {self.weight}")
        if self.samples is not None:
            if isinstance(self.samples, bool) or not isinstance(self.samples, int):
                raise TypeError(f"{where}: samples must be an integer, got {self.samples!r}")
            if self.samples < 1:
                raise ValueError(f"{where}: samples must be >= 1 per epoch, got {self.samples}")

    @property
    def label(self) -> str:
        """The name if given, else the URLs, for messages."""
        if self.name:
            return self.name
        if isinstance(self.urls, str):
            return self.urls.rstrip("/") or self.urls
        return ", ".join(self.urls) if self.urls else "(no URL)"


@dataclass(frozen=True)
class OpenedSources:
    """The sources of a mixed stream, opened.

    Attributes:
        shards: every source's shards, source after source.
        counts: their sample counts.
        plans: each source's name, shards and quota (:class:`._mix.SourcePlan`).
        endpoints: the options of sources that do not use the stream's, each named
            after the first source that uses them.
        infos: where each source's counts came from, by name.
        withheld: the web origins that only a source's remote index named (admitted by
            ``trust_index_urls``) and no source names itself: they get none of the
            configured credentials, whichever process reads them.
    """

    shards: tuple[Shard, ...]
    counts: tuple[int, ...]
    plans: tuple[SourcePlan, ...]
    endpoints: tuple[tuple[str, S3Options], ...]
    infos: dict[str, IndexInfo]
    withheld: frozenset[str] = frozenset()


def name_source(exc: BaseException, name: str) -> None:
    """Put ``source 'name': `` at the start of an error's message (kept in place, so
    the error keeps its type, attributes and traceback)."""
    if exc.args and isinstance(exc.args[0], str):
        exc.args = (f"source {name!r}: {exc.args[0]}", *exc.args[1:])


def _names(sources: Sequence[Source]) -> list[str]:
    names = []
    for i, source in enumerate(sources):
        if source.name is not None:
            names.append(source.name)
        elif isinstance(source.urls, str) or len(source.urls) == 1:
            names.append(source.label)
        else:
            names.append(f"source{i}")
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(
                f"two sources are named {name!r}: give each a name of its own (Source(name=...))"
            )
        seen.add(name)
    return names


def open_sources(
    sources: Sequence[Source],
    options: S3Options,
    *,
    epoch_size: int | None,
    counting: CountSettings,
    strict: bool = False,
    index_cache: str | os.PathLike[str] | bool | None = None,
    trust_index_urls: TrustIndexURLs = False,
    progress: Progress = None,
) -> OpenedSources:
    """Open every source (as :func:`._dataset.open_dataset` opens a dataset) and set its
    quota.

    Args:
        sources: the sources, in order.
        options: the stream's S3 options (resolved), for sources without their own.
        epoch_size: samples per epoch, all sources together; ``None``: see
            :func:`._mix.quotas`.
        counting: how shards without an index are counted (``s3`` is each source's).
        strict: as :func:`._dataset.open_dataset`.
        index_cache: as :func:`._dataset.open_dataset`.
        trust_index_urls: as :func:`._dataset.open_dataset`.
        progress: as :func:`._dataset.open_dataset`: a bar for each source counted.

    Raises:
        ValueError: no source, two with one name, an empty source, a bad ``epoch_size``,
            weights zero in total; every message names the source(s).
        The errors of :func:`._dataset.open_dataset`, their message starting with the
        source's name.
    """
    if not sources:
        raise ValueError("a stream of sources needs at least one Source")
    if epoch_size is not None and (
        isinstance(epoch_size, bool) or not isinstance(epoch_size, int) or epoch_size < 1
    ):
        raise ValueError(f"epoch_size must be an integer >= 1, got {epoch_size!r}")
    names = _names(sources)
    endpoints: dict[S3Options, str] = {}  # options -> the endpoint's name
    opened = _Opening()
    for source, name in zip(sources, names, strict=True):
        own = source.s3.resolve() if source.s3 is not None else options
        if source.endpoint_url is not None:
            own = replace(own, endpoint_url=source.endpoint_url).resolve()
        endpoint = "" if own == options else endpoints.setdefault(own, name)
        urls = source.urls if isinstance(source.urls, str) else list(source.urls)
        try:
            opened.add(
                urls,
                own,
                source.samples_per_shard,
                source.split,
                endpoint,
                name,
                counting=counting,
                strict=strict,
                index_cache=index_cache,
                trust_index_urls=trust_index_urls,
                progress=progress,
            )
        except (AsyncStreamError, ValueError) as exc:
            name_source(exc, name)
            raise
        first, stop, _ = opened.spans[-1]
        if not any(opened.counts[first:stop]):
            raise ValueError(f"source {name!r} is empty: its {stop - first} shards hold no sample")
    given = quotas(
        names,
        [sum(opened.counts[first:stop]) for first, stop, _ in opened.spans],
        [
            None if s.samples is not None else (1.0 if s.weight is None else s.weight)
            for s in sources
        ],
        [s.samples for s in sources],
        epoch_size,
    )
    plans = tuple(
        SourcePlan(name, first, stop, quota, endpoint)
        for name, (first, stop, endpoint), quota in zip(names, opened.spans, given, strict=True)
    )
    named = tuple((name, own) for own, name in endpoints.items())
    return opened.result(plans, named)


def open_plain(
    urls: str | Sequence[str],
    options: S3Options,
    *,
    samples_per_shard: int | Sequence[int] | None,
    split: str | None,
    counting: CountSettings,
    strict: bool = False,
    index_cache: str | os.PathLike[str] | bool | None = None,
    trust_index_urls: TrustIndexURLs = False,
    progress: Progress = None,
) -> OpenedSources:
    """Open plain shard URLs: a stream of one source, on the same path as a mixed stream's
    sources (:func:`open_sources`), but with no quota (the one source is read whole each
    epoch, so ``plans`` is empty and the order is a plain stream's) and no source name in
    its errors. Its one :class:`IndexInfo` is under the name ``""``.

    Raises:
        The errors of :func:`._dataset.open_dataset`.
    """
    opened = _Opening()
    opened.add(
        urls,
        options,
        samples_per_shard,
        split,
        "",
        "",
        counting=counting,
        strict=strict,
        index_cache=index_cache,
        trust_index_urls=trust_index_urls,
        progress=progress,
    )
    return opened.result((), ())


class _Opening:
    """The shards, counts and index facts of the sources opened so far, in order."""

    def __init__(self) -> None:
        self.shards: list[Shard] = []
        self.counts: list[int] = []
        self.spans: list[tuple[int, int, str]] = []  # (first, stop, endpoint)
        self.infos: dict[str, IndexInfo] = {}
        self.withheld: set[str] = set()  # origins only an index named
        self.named: set[str] = set()  # origins the user named, in any source

    def add(
        self,
        urls: str | Sequence[str],
        options: S3Options,
        samples_per_shard: int | Sequence[int] | None,
        split: str | None,
        endpoint: str,
        name: str,
        *,
        counting: CountSettings,
        strict: bool,
        index_cache: str | os.PathLike[str] | bool | None,
        trust_index_urls: TrustIndexURLs = False,
        progress: Progress = None,
    ) -> None:
        """Open one source's dataset (:func:`._dataset.open_dataset`) and append it."""
        from ._dataset import open_dataset

        dataset = open_dataset(
            urls,
            options,
            samples_per_shard=samples_per_shard,
            split=split,
            strict=strict,
            index_cache=index_cache,
            counting=replace(counting, s3=options),
            trust_index_urls=trust_index_urls,
            progress=progress,
        )
        first = len(self.shards)
        self.shards.extend(dataset.shards)
        self.counts.extend(dataset.counts)
        self.spans.append((first, len(self.shards), endpoint))
        self.infos[name] = dataset.info
        self.withheld |= dataset.withheld
        self.named |= Scope.of(url_items(urls)).named

    def result(
        self, plans: tuple[SourcePlan, ...], endpoints: tuple[tuple[str, S3Options], ...]
    ) -> OpenedSources:
        withheld = frozenset(self.withheld - self.named)  # a source named it: it gets them
        shards, counts = tuple(self.shards), tuple(self.counts)
        return OpenedSources(shards, counts, plans, endpoints, self.infos, withheld)


def split_sources(
    urls: str | Sequence[str] | Source | Sequence[Source],
) -> tuple[list[Source] | None, str | Sequence[str]]:
    """The sources given as ``urls`` (``None`` for plain shard URLs), and the plain URLs.

    Raises:
        TypeError: Sources and URL strings in one list.
    """
    if isinstance(urls, Source):
        return [urls], ()
    if isinstance(urls, str):
        return None, urls
    sources = [item for item in urls if isinstance(item, Source)]
    if not sources:
        return None, cast("Sequence[str]", urls)  # checked where URLs are parsed
    if len(sources) != len(urls):
        raise TypeError(
            "ShardStream takes shard URLs or a list of asyncstream.Source, not both: wrap "
            "every URL in a Source"
        )
    return sources, ()
