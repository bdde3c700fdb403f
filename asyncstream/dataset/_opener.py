"""Which shards make a dataset, and what the indexes beside them say about each.

The index is the truth about which shards make the dataset. Under a prefix (or local
folder), the shallowest folder with an index governs every shard below it: shards of its
chosen split are read, shards of its other splits left out silently, and any other
shard (``.tar``, ``.tar.gz``, ...) is stale: left out with a
:class:`~asyncstream.StaleShardWarning` naming it
(``strict=True``: a :class:`~asyncstream.DataError`). Shards named one by one (a brace
pattern, a list) are read whether or not the index beside them lists them; those it does
not list get no count here (the cache or counting gives it, :mod:`._dataset`). Wherever
an index and the store disagree (a shard it lists is missing, its size or ETag differs,
or its count cannot fit the shard: every member takes a 512-byte header) the open fails
with a ``DataError`` naming the shard and the index file, never a silent guess.

An index given as the dataset URL that records every shard's size (asyncstream's
manifest; wids with ``filesize``) opens with that one GET: no listing, no HEAD.
"""

from __future__ import annotations

import os
import warnings
from collections import Counter
from collections.abc import Sequence

from .._exceptions import DataError, NotFoundError, StaleShardWarning
from ..shards._compressed import compression_of
from ..shards._tar import check_not_empty
from ..shards._urls import Shard, reject_duplicates
from ..stores._localstore import local_path
from ..stores._registry import canonical_url, folder_url, is_local
from ..stores._s3 import S3Options
from ..stores._stores import Stores
from ._index import Entry, Index, find_index, folder_of, parse_index
from ._resolve import Resolved, caller_outside, resolve_shards

__all__ = ["Opener", "governed", "names", "report_stale"]

_HEADER = 512
_NAMED_IN_MESSAGES = 5


class Opener:
    """One open: the store, the indexes read so far, and what each shard got.

    Feed it the dataset's URLs with :meth:`index_url` (an index as the URL), :meth:`named`
    (shards named one by one) and :meth:`prefix` (a prefix or folder), in order; then
    :meth:`finish`. It holds the shards, the counts the indexes gave, how many came from
    an index, the indexes used and the stale shards.
    """

    def __init__(self, options: S3Options, split: str | None) -> None:
        self.options = options
        self.objects = Stores(options)
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
        canonical = canonical_url(url)
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
                shards = resolve_shards(members, stores=self.objects)
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
            if is_local(folder):
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
            local = is_local(folder)
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
        chosen, stale = governed(index, self.members(index), shards, run.url)
        self.stale += [(url, index) for url in stale]
        for shard in chosen:
            self.use(shard, index, index.entries[shard.url])

    def finish(self, urls: Sequence[str], strict: bool) -> None:
        """Check what was gathered: a split that was used, stale shards, shards named
        twice, empty objects.

        Raises:
            ValueError: ``split`` given, but no index with splits was found.
            DataError: stale shards, with ``strict``.
            ShardURLError: a shard named twice.
            CorruptTarError: an empty (0-byte) object.
        """
        if self.split is not None and not self.split_used:
            raise ValueError(
                f"split={self.split!r} was given, but no index with splits was found for "
                f"{', '.join(urls)}"
            )
        if self.stale:
            report_stale(self.stale, strict)
        reject_duplicates(self.shards)
        for shard in self.shards:
            check_not_empty(shard.url, shard.size)


def governed(
    index: Index, members: Sequence[str], shards: Sequence[Shard], where: str
) -> tuple[list[Shard], list[str]]:
    """The shards an index governs: its ``members`` (in its order) and the stale ones.

    Args:
        index: the index found above ``shards``.
        members: the shards of the chosen split (or all of them).
        shards: the shards listed under the index's folder.
        where: the prefix or folder listed, named in errors.

    Returns:
        The members' shards, and the URLs of the listed shards the index has in no split.

    Raises:
        DataError: a member that is not among ``shards``.
    """
    listed = {s.url: s for s in shards}
    absent = [u for u in members if u not in listed]
    if absent:
        raise DataError(
            f"{names(absent)}: listed by {index.url}, but not under {where} "
            f"({len(absent)} of its {len(members)} shards are missing)"
        )
    stale = [s.url for s in shards if s.url not in index.entries]
    return [listed[u] for u in members], stale


def report_stale(stale: Sequence[tuple[str, Index]], strict: bool) -> None:
    """Warn about (``strict``: refuse) shards that their folder's index does not list.

    Raises:
        DataError: with ``strict``.
    """
    urls = [u for u, _ in stale]
    sources = ", ".join(sorted({index.url for _, index in stale}))
    message = (
        f"{names(urls)}: {len(urls)} shards not listed by the index {sources}, so not "
        "part of the dataset (stale shards of an earlier pack, say; 'asyncstream pack "
        "--overwrite' removes them)"
    )
    if strict:
        raise DataError(message)
    warnings.warn(
        message + "; strict=True makes this an error", StaleShardWarning, caller_outside()
    )


def names(urls: Sequence[str]) -> str:
    """The first few URLs, and how many there are in all if more."""
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
    if entry.samples * _HEADER > shard.size and compression_of(shard.url) is None:
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
