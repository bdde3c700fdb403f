"""Shard URLs resolved into shards with sizes, through the stores (:mod:`._store`).

Resolved once, when a stream or command is opened, so that a typo, a missing object or
bad credentials fail before the first training step. How: a URL its store calls a
folder (a local folder, an S3 prefix) is listed (every object, ``.tar`` or not: the
listing also finds the index files beside the shards); named objects are sized with a
HEAD each, or, in a store where a listing is cheap (:attr:`Store.lists_folders`: S3) and
a folder has many of them, by one listing of the folder (a listing of 1,000 keys costs
one request). Nothing here reads a URL's scheme: the store of each URL says.
"""

from __future__ import annotations

import os
import posixpath
import sys
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .._exceptions import NotFoundError, UnreadShardWarning
from ..shards._compressed import SHARD_SUFFIXES, is_shard_name, unread_format
from ..shards._urls import Shard, expand_braces, reject_duplicates, url_items
from ..stores._registry import scheme_of
from ..stores._s3 import S3Options
from ..stores._store import Store
from ..stores._stores import Stores

__all__ = ["Resolved", "resolve_shards", "resolve_urls"]

# Below this many keys in one folder, HEAD each; from it on, one listing is cheaper.
_LIST_THRESHOLD = 16


@dataclass(frozen=True)
class Resolved:
    """One run of shard URLs after expansion: its shards and what was listed on the way.

    Attributes:
        url: the URL as given (a prefix, a folder, a file or an expanded pattern's first).
        shards: its shards, in order.
        prefix: whether it is a prefix or folder (every shard under it) rather than
            shards named one by one.
        listed: every object a listing returned on the way, ``.tar`` or not, by URL
            (empty where nothing was listed: local files, or S3 keys sized by HEAD).
    """

    url: str
    shards: list[Shard]
    prefix: bool
    listed: dict[str, Shard]


_SHARD_NAMES = "/".join(SHARD_SUFFIXES)


def caller_outside() -> int:
    """The ``stacklevel`` of the first caller outside asyncstream: a warning names the
    user's line, not ours."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def _shards_of(url: str, everything: list[Shard], where: str) -> Resolved:
    """The shards among a listing (by name: ``.tar``, ``.tar.gz``, ... see
    :mod:`._compressed`); tar archives in a format that is not read are named in an
    :class:`~asyncstream.UnreadShardWarning`."""
    shards = [s for s in everything if is_shard_name(s.url)]
    unread = [s.url for s in everything if unread_format(s.url) is not None]
    if unread:
        formats = sorted({str(unread_format(u)) for u in unread})
        shown = ", ".join(unread[:3]) + (f", ... ({len(unread)} in all)" if len(unread) > 3 else "")
        warnings.warn(
            f"{url}: {len(unread)} tar archives in a format asyncstream does not read "
            f"({', '.join(formats)}) are left out: {shown}; recompress them as .tar.gz, "
            ".tar.zst, .tar.xz or .tar.bz2, or unpack them to .tar",
            UnreadShardWarning,
            caller_outside(),
        )
    if not shards:
        raise NotFoundError(f"{url}: no shard ({_SHARD_NAMES}) {where}", url=url)
    return Resolved(url, shards, True, {s.url: s for s in everything})


def _resolve_folder(store: Store, url: str) -> Resolved:
    """Every shard under a prefix or in a folder."""
    where = "under this prefix" if url.endswith("/") else "in this folder"
    return _shards_of(url, store.list(url), where)


def _resolve_keys(store: Store, urls: Sequence[str]) -> Resolved:
    """Sizes of named objects of one store: a HEAD each, or one listing per folder of
    many where the store lists cheaply."""
    by_folder: dict[str, list[str]] = {}
    for url in urls:
        by_folder.setdefault(posixpath.dirname(url) + "/", []).append(url)
    found: dict[str, Shard] = {}
    listed: dict[str, Shard] = {}
    heads: list[str] = []
    for folder, members in by_folder.items():
        if not store.lists_folders or len(members) < _LIST_THRESHOLD:
            heads.extend(members)
            continue
        listed.update((s.url, s) for s in store.list(folder))
        for url in members:
            if url in listed:
                found[url] = listed[url]
            else:
                heads.append(url)  # a HEAD gives the precise reason
    if len(heads) == 1:
        found[heads[0]] = store.head(heads[0])
    elif heads:
        with ThreadPoolExecutor(max_workers=min(16, len(heads))) as pool:
            for url, shard in zip(heads, pool.map(store.head, heads), strict=True):
                found[url] = shard
    return Resolved(urls[0], [found[u] for u in urls], False, listed)


def resolve_urls(
    urls: str | Sequence[str],
    options: S3Options | None = None,
    *,
    stores: Stores | None = None,
) -> list[Resolved]:
    """Resolve shard URLs run by run (see :func:`resolve_shards`, which flattens them).

    Named S3 keys that follow one another are resolved together (one listing per folder
    of many), as one :class:`Resolved` with ``prefix=False``; each prefix or local
    folder is one with ``prefix=True``.

    Args:
        stores: the stores to use (made from ``options`` if ``None``).

    Raises:
        The errors of :func:`resolve_shards`, except that a shard named twice is not
        checked here.
    """
    items = url_items(urls)
    stores = stores or Stores(options)
    runs: list[Resolved] = []
    pending: list[str] = []

    pending_store: Store | None = None

    def flush() -> None:
        if pending and pending_store is not None:
            runs.append(_resolve_keys(pending_store, list(pending)))
            pending.clear()

    for item in items:
        scheme_of(item)  # an unsupported scheme fails before any request
        for url in expand_braces(item):
            store = stores.for_url(url)
            store.canonical(url)  # a malformed URL fails before any request
            if store is not pending_store:
                flush()
                pending_store = store
            if store.is_folder(url):
                flush()
                runs.append(_resolve_folder(store, url))
            elif store.lists_folders:
                pending.append(url)  # sized together: one listing per folder of many
            else:
                flush()
                runs.append(Resolved(url, [store.head(url)], False, {}))
    flush()
    return runs


def resolve_shards(
    urls: str | Sequence[str],
    options: S3Options | None = None,
    *,
    stores: Stores | None = None,
) -> list[Shard]:
    """Resolve shard URLs to a list of shards with sizes, in the order given.

    Accepted forms, alone or in a list: ``s3://bucket/key.tar``, a brace pattern
    ``s3://bucket/train-{0000..0099}.tar``, a prefix ``s3://bucket/train/`` (every
    ``.tar`` under it, sorted), ``file:///abs/path.tar``, a path, or a local folder.

    Args:
        urls: one URL or pattern, or a list of them.
        options: how to reach S3; resolved from the environment if not already.
        stores: the stores to reuse (made from ``options`` if ``None``).

    Returns:
        The shards, in the order of ``urls`` (expansions and listings in sorted order).

    Raises:
        ShardURLError: a malformed URL, an empty list or expansion, a shard named twice.
        NotFoundError: a missing bucket, key, file or an empty prefix or folder.
        AccessDeniedError: bad or missing credentials, no permission.
        PermanentFetchError: a TLS mismatch or a certificate that does not verify.
        TransientFetchError: the store could not be reached.
    """
    shards = [s for run in resolve_urls(urls, options, stores=stores) for s in run.shards]
    reject_duplicates(shards)
    return shards
