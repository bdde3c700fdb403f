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

A manifest beside the shards that the server has but refuses (``403`` where a file it
does not have is a ``404``) is said in an :class:`~asyncstream.UnreadIndexWarning`, not
taken for a missing one; an index given as the dataset URL that is refused is an
:class:`~asyncstream.AccessDeniedError`, and the shards it names stay within what the user
named (:mod:`._trust`).

An index given as the dataset URL that records every shard's size (asyncstream's
manifest; wids with ``filesize``) opens with that one GET: no listing, no HEAD.
"""

from __future__ import annotations

import os
import warnings
from collections import Counter
from collections.abc import Sequence

from .._exceptions import (
    AccessDeniedError,
    DataError,
    FetchError,
    NotFoundError,
    StaleShardWarning,
    UnreadIndexWarning,
)
from ..shards._compressed import compression_of
from ..shards._tar import check_not_empty
from ..shards._urls import Shard, reject_duplicates
from ..stores._localstore import local_path
from ..stores._registry import canonical_url, folder_url, is_local, origin_of
from ..stores._s3 import S3Options
from ..stores._stores import Stores
from ._index import MANIFEST_NAME, Entry, Index, Reader, find_index, folder_of, parse_index
from ._resolve import Resolved, caller_outside, resolve_shards
from ._trust import Scope

__all__ = ["Opener", "governed", "names", "report_stale"]

_HEADER = 512
_CONTROL = ".asyncstream-no-such-file.json"  # asked beside a refused manifest
_NAMED_IN_MESSAGES = 5


class Opener:
    """One open: the store, the indexes read so far, and what each shard got.

    Feed it the dataset's URLs with :meth:`index_url` (an index as the URL), :meth:`named`
    (shards named one by one) and :meth:`prefix` (a prefix or folder), in order; then
    :meth:`finish`. It holds the shards, the counts the indexes gave, how many came from
    an index, the indexes used, the stale shards, and the origins that only an index
    named (admitted by ``trust_index_urls``), which get none of the user's credentials.
    """

    def __init__(self, options: S3Options, split: str | None, scope: Scope | None = None) -> None:
        self.options = options
        self.objects = Stores(options)
        self.split = split
        self.scope = scope or Scope(frozenset(), False)
        self.shards: list[Shard] = []
        self.counts: dict[str, int] = {}
        self.sources: Counter[str] = Counter()
        self.indexes: dict[str, str] = {}  # index url -> kind
        self.split_used = False
        self.stale: list[tuple[str, Index]] = []
        self.unread: list[AccessDeniedError] = []  # manifests beside the shards, refused
        self.withheld: set[str] = set()  # origins only an index named: no credentials

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
        raw = self._read(canonical)
        if raw is None:
            raise _why_unread(self.objects, canonical, f"{url}: no such index file")
        index = parse_index(canonical, raw, expect=None, rebase=False)
        if index is None:  # pragma: no cover - expect=None never returns None
            raise DataError(f"{url}: not an index")
        members = self.members(index)
        beyond = self.scope.check(index.url, members)
        stores = self.objects
        if beyond:  # admitted by trust_index_urls: none of the user's credentials go there
            self.withheld.update(origin_of(u) for u in beyond if not is_local(u))
            stores = Stores(self.options, withhold=self.withheld)
        entries = [index.entries[u] for u in members]
        if all(e.size is not None for e in entries):
            shards = [Shard(u, e.size or 0, e.etag) for u, e in zip(members, entries, strict=True)]
        else:
            try:
                shards = resolve_shards(members, stores=stores)
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
            # A presigned URL's signature does not cover the files beside it: a 403 is expected.
            signed = any("?" in s.url for s in shards)
            found[folder] = find_index(
                folder,
                self._reader(check=not signed),
                known=known,
                shard_urls=[s.url for s in shards],
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
            index = find_index(folder, self._reader(check=True), known=known)
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

    # -- reading index files ----------------------------------------------------------------

    def _read(self, url: str) -> bytes | None:
        """A whole index file, ``None`` where there is none; a local file that may not be
        read is an :class:`AccessDeniedError`."""
        try:
            return self.objects.read(url)
        except PermissionError as exc:
            raise AccessDeniedError(
                f"{url}: the index file cannot be read ({exc.strerror}): make it readable",
                url=url,
            ) from exc

    def _reader(self, *, check: bool) -> Reader:
        """How index files beside shards are read: a manifest that the store has but
        refuses (a web server's ``403`` for a file it may not read, where a file it does
        not have is a ``404``) is noted, and said after (:meth:`report_unread`), rather
        than taken for a missing one."""

        def read(url: str) -> bytes | None:
            raw = self._read(url)
            if raw is None and check and url.rpartition("/")[2] == MANIFEST_NAME:
                refused = None if is_local(url) else _refused(self.objects, url)
                # A server that refuses a file it does not have (static hosting on S3)
                # refuses the control too: its 403 says nothing. (A local file is there
                # or not: reading it says which.)
                control = url.rpartition("/")[0] + "/" + _CONTROL
                if refused is not None and _refused(self.objects, control) is None:
                    self.unread.append(refused)
            return raw

        return read

    def report_unread(self) -> None:
        """Warn about the manifests beside the shards that could not be read."""
        for error in self.unread:
            warnings.warn(
                f"{error}. This manifest beside the shards was not used: their counts come "
                "from the index cache or from counting them instead. Make it readable to "
                "the server (an older 'asyncstream pack' wrote it with mode 0600: chmod "
                "644), or give its URL as the dataset URL",
                UnreadIndexWarning,
                caller_outside(),
            )
        self.unread.clear()

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
        self.report_unread()
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


def _refused(stores: Stores, url: str) -> AccessDeniedError | None:
    """Why a file that reading found absent was refused, or ``None`` where it is really
    not there: a ``HEAD`` tells, where reading it did not (a web server's ``403``)."""
    try:
        stores.for_url(url).head(url)
    except NotFoundError:
        return None
    except AccessDeniedError as exc:
        return exc
    return AccessDeniedError(f"{url}: the file is there, but reading it was refused", url=url)


def _why_unread(stores: Stores, url: str, missing: str) -> FetchError:
    """The error of an index file given as the dataset URL that could not be read: a
    :class:`NotFoundError` where it is not there, else why it was refused."""
    refused = _refused(stores, url)
    return NotFoundError(missing, url=url) if refused is None else refused


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
