"""Index files: what asyncstream and other tools write beside tar shards, read into one shape.

Every format becomes an :class:`Index`: per shard URL, its samples (and its size and ETag
where the format has them), and the splits where the format has splits. Discovery
(:func:`find_index`) looks in a folder for these files, in this order; the first found
wins:

====================  ==============================  =========================================
kind                  file                            shape
====================  ==============================  =========================================
``"asyncstream"``     ``asyncstream.json``            ``{"__kind__": "asyncstream-manifest-v1",
                                                      "shards": [{"url", "samples", "size",
                                                      "etag"}], "splits": {name: [url]}}``
                                                      (``splits`` optional)
``"classes.json"``    ``classes.json`` of an older    ``{"shards": [{"url", "samples"}]}``;
                      ``asyncstream pack``            one without ``"shards"`` is somebody
                                                      else's file, and ignored
``"wids"``            any other ``.json`` of the      ``{"__kind__": "wids-shard-index-v1",
                      folder (probed without a        "shardlist": [{"url", "nsamples",
                      listing: ``wids-index.json``,   "filesize"}], "base"}`` (``filesize``
                      ``shardindex.json``)            and ``base`` optional)
``"info.json"``       ``_info.json``, ``info.json``   ``{"splits": {name: {"filenames": [...],
                      (timm, Hugging Face ``-wds``)   "shard_lengths": [...]}}}``
``"sizes.json"``      ``sizes.json`` (OpenCLIP)       ``{shard file name: samples}``
``"img2dataset"``     ``{stem}_stats.json`` beside    ``{"successes": samples, ...}``
                      each ``{stem}.tar``
====================  ==============================  =========================================

A URL in an index is resolved against the index's folder (wids: against its ``base`` when
it has one), or kept when absolute. An index found *beside* the shards matches them by
file name, as a copied dataset still should: an absolute URL outside the index's folder
is taken as that file name in the folder. An index given *as* the dataset URL keeps its
absolute ``s3://`` and ``file://`` URLs (its shards may live elsewhere), within what the
user named: a remote index names shards only on its own origin or another given, never a
local file, unless ``trust_index_urls=`` admits more (:mod:`._trust`, checked at open).

Strictness: a file recognised as an index (by its ``__kind__``, or by its name and shape)
that holds a bad entry is a :class:`DataError` naming the file; a file that is merely
named like one (a ``classes.json`` that is a class map only, a ``.json`` of another kind)
is ignored.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .._exceptions import DataError
from ..stores._registry import is_served, scheme_of, store_class

__all__ = [
    "MANIFEST_KIND",
    "MANIFEST_NAME",
    "Entry",
    "Index",
    "find_index",
    "folder_of",
    "join_url",
    "manifest_bytes",
    "parse_index",
]

MANIFEST_NAME = "asyncstream.json"
MANIFEST_KIND = "asyncstream-manifest-v1"
WIDS_KIND = "wids-shard-index-v1"
_STATS_SUFFIX = "_stats.json"
_WIDS_PROBES = ("wids-index.json", "shardindex.json")
_NAMED = {"asyncstream.json", "classes.json", "_info.json", "info.json", "sizes.json"}
_MAX_WIDS_CANDIDATES = 16  # other .json files read from one folder, looking for a wids index


@dataclass(frozen=True, slots=True)
class Entry:
    """What an index says about one shard."""

    samples: int
    size: int | None = None
    etag: str | None = None


@dataclass(frozen=True)
class Index:
    """One index file, parsed.

    Attributes:
        kind: the format (see the module docstring).
        url: the index file (for img2dataset, ``{folder}/*_stats.json``).
        folder: the folder its relative URLs were resolved against.
        entries: shard URL to :class:`Entry`, in the index's order (every split).
        splits: split name to its shard URLs, for formats with splits.
    """

    kind: str
    url: str
    folder: str
    entries: Mapping[str, Entry]
    splits: Mapping[str, tuple[str, ...]] | None = None

    def members(self, split: str | None) -> list[str]:
        """The shards of ``split`` (of the only split, or every shard without splits).

        Raises:
            ValueError: ``split`` is not one of the index's splits, or none was given
                and the index has several; or a split was asked of an index without.
        """
        if self.splits is None:
            if split is not None:
                raise ValueError(f"split={split!r} was given, but {self.url} has no splits")
            return list(self.entries)
        names = ", ".join(repr(n) for n in self.splits)
        if split is None:
            if len(self.splits) == 1:
                return list(next(iter(self.splits.values())))
            raise ValueError(f"{self.url} has several splits ({names}): choose one with split=")
        if split not in self.splits:
            raise ValueError(f"{self.url} has no split {split!r}; its splits are {names}")
        return list(self.splits[split])


def folder_of(url: str) -> str:
    """The folder URL of a shard or file URL (no trailing slash)."""
    return posixpath.dirname(url)


def join_url(folder: str, ref: str) -> str:
    """Resolve ``ref`` (relative, or a URL a store serves) against a folder URL,
    normalising ``..``, as the folder's store joins its URLs."""
    if "://" in ref and is_served(ref):
        return ref
    return store_class(scheme_of(folder)).join(folder, ref)


def _rebased(folder: str, url: str) -> str:
    """``url`` if it lies in ``folder`` or below, else its file name in ``folder``."""
    if url.startswith(folder + "/"):
        return url
    return join_url(folder, posixpath.basename(url.rstrip("/")))


def _count(value: Any, what: str, url: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DataError(f"{url}: {what} must be an integer >= 0, got {value!r}")
    return value


def _optional_count(value: Any, what: str, url: str) -> int | None:
    return None if value is None else _count(value, what, url)


class _Builder:
    """Entries of one index as they are parsed, with their URLs resolved."""

    def __init__(self, kind: str, url: str, base: str, rebase: bool) -> None:
        self.kind, self.url, self.base, self.rebase = kind, url, base, rebase
        self.folder = folder_of(url)
        self.entries: dict[str, Entry] = {}

    def resolve(self, ref: Any) -> str:
        if not isinstance(ref, str) or not ref:
            raise DataError(f"{self.url}: a shard URL must be a non-empty string, got {ref!r}")
        resolved = join_url(self.base, ref) if "://" not in ref else ref
        if self.rebase or not is_served(resolved):
            return _rebased(self.folder, resolved)  # another scheme, or matched by file name
        return resolved

    def add(self, ref: Any, samples: Any, size: Any = None, etag: Any = None) -> str:
        url = self.resolve(ref)
        entry = Entry(
            _count(samples, f"samples of {ref!r}", self.url),
            _optional_count(size, f"size of {ref!r}", self.url),
            etag if isinstance(etag, str) else None,
        )
        if self.entries.get(url, entry) != entry:
            raise DataError(f"{self.url}: {ref!r} is listed twice, with different counts")
        self.entries[url] = entry
        return url

    def build(self, splits: Mapping[str, tuple[str, ...]] | None = None) -> Index:
        return Index(self.kind, self.url, self.folder, self.entries, splits)


def _fail(url: str, what: str) -> DataError:
    return DataError(f"{url}: not a valid index: {what}")


def _objects(doc: dict[str, Any], key: str, url: str) -> list[dict[str, Any]]:
    """``doc[key]``, which must be a list of JSON objects."""
    items = doc.get(key)
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise _fail(url, f"{key!r} must be a list of objects, got {items!r:.80}")
    return items


def _manifest(doc: dict[str, Any], b: _Builder) -> Index:
    for item in _objects(doc, "shards", b.url):
        b.add(item.get("url"), item.get("samples"), item.get("size"), item.get("etag"))
    raw = doc.get("splits")
    if raw is None:
        return b.build()
    if not isinstance(raw, dict) or not all(isinstance(v, list) for v in raw.values()):
        raise _fail(b.url, "'splits' must map split names to lists of shard URLs")
    splits = {name: tuple(b.resolve(ref) for ref in refs) for name, refs in raw.items()}
    for name, urls in splits.items():
        for url in urls:
            if url not in b.entries:
                raise _fail(b.url, f"split {name!r} names {url}, which is not in 'shards'")
    return b.build(splits)


def _wids(doc: dict[str, Any], b: _Builder) -> Index:
    base = doc.get("base")
    if isinstance(base, str) and base:
        b.base = join_url(b.folder, base.rstrip("/"))
    for item in _objects(doc, "shardlist", b.url):
        b.add(item.get("url"), item.get("nsamples"), item.get("filesize"))
    return b.build()


def _info(doc: dict[str, Any], b: _Builder) -> Index:
    splits: dict[str, tuple[str, ...]] = {}
    for name, split in doc["splits"].items():
        if not isinstance(split, dict):
            raise _fail(b.url, f"split {name!r} must be an object")
        files, lengths = split.get("filenames"), split.get("shard_lengths")
        if not isinstance(files, list) or not isinstance(lengths, list):
            raise _fail(b.url, f"split {name!r} needs 'filenames' and 'shard_lengths' lists")
        if len(files) != len(lengths):
            raise _fail(
                b.url, f"split {name!r} has {len(files)} filenames and {len(lengths)} lengths"
            )
        splits[str(name)] = tuple(b.add(f, n) for f, n in zip(files, lengths, strict=True))
    return b.build(splits)


def _sizes(doc: dict[str, Any], b: _Builder) -> Index:
    for name, samples in doc.items():
        b.add(name, samples)
    return b.build()


def _load(raw: bytes, url: str, strict: bool) -> dict[str, Any] | None:
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        if strict:
            raise DataError(f"{url}: not JSON: {exc}") from exc
        return None
    if not isinstance(doc, dict):
        if strict:
            raise DataError(f"{url}: not an index (a JSON object was expected)")
        return None
    return doc


def _kind_of(doc: dict[str, Any]) -> str | None:
    """The format of a parsed file, from its content."""
    marker = doc.get("__kind__")
    if marker == MANIFEST_KIND:
        return "asyncstream"
    if marker == WIDS_KIND:
        return "wids"
    if marker is not None:
        return None
    if isinstance(doc.get("shards"), list):
        return "classes.json"
    if isinstance(doc.get("splits"), dict):
        return "info.json"
    if doc and all(_is_count(v) for v in doc.values()):
        return "sizes.json"
    return None


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


_PARSERS: dict[str, Callable[[dict[str, Any], _Builder], Index]] = {
    "asyncstream": _manifest,
    "classes.json": _manifest,
    "wids": _wids,
    "info.json": _info,
    "sizes.json": _sizes,
}


def parse_index(url: str, raw: bytes, *, expect: str | None = None, rebase: bool) -> Index | None:
    """Parse an index file.

    Args:
        url: the file's URL (relative shard URLs are resolved against its folder).
        raw: its bytes.
        expect: the kind its name suggests (discovery); ``None``: the file was given as
            the dataset URL, and must be an index of some kind.
        rebase: match shards by file name in the index's folder (an index found beside
            the shards), rather than keeping absolute URLs.

    Returns:
        The index, or ``None`` for a file that is not the index its name suggests.

    Raises:
        DataError: a recognised index with a bad entry, or (``expect=None``) a file that
            is no index at all.
    """
    doc = _load(raw, url, strict=expect is None or expect == "asyncstream")
    if doc is None:
        return None
    kind = _kind_of(doc)
    if expect is None:
        if kind is None:
            raise DataError(
                f"{url}: not an index asyncstream reads (asyncstream.json, a wids shard "
                "index, _info.json or sizes.json)"
            )
    elif kind != expect:
        if expect == "asyncstream":
            raise DataError(f"{url}: not an asyncstream manifest (no {MANIFEST_KIND!r} kind)")
        return None
    return _PARSERS[kind](doc, _Builder(kind, url, folder_of(url), rebase))


def _stats_index(folder: str, found: Mapping[str, bytes]) -> Index | None:
    """img2dataset's per-shard ``{stem}_stats.json`` files (stats URL to bytes)."""
    url = f"{folder}/*{_STATS_SUFFIX}"
    b = _Builder("img2dataset", url, folder, rebase=True)
    for stats_url, raw in found.items():
        doc = _load(raw, stats_url, strict=False)
        if doc is None or not _is_count(doc.get("successes")):
            continue  # somebody else's *_stats.json
        name = posixpath.basename(stats_url)[: -len(_STATS_SUFFIX)] + ".tar"
        b.add(name, doc["successes"])
    return b.build() if b.entries else None


Reader = Callable[[str], bytes | None]


def find_index(
    folder: str,
    read: Reader,
    *,
    known: Collection[str] | None,
    shard_urls: Sequence[str] = (),
) -> Index | None:
    """The index beside shards in ``folder``: the first format found (module docstring).

    Args:
        folder: the folder URL (no trailing slash).
        read: reads a file's bytes, ``None`` when there is no such file.
        known: URLs of every object directly in the folder, where a listing gave them;
            ``None``: unknown, so the usual names are tried (in parallel).
        shard_urls: the shards in the folder, whose ``{stem}_stats.json`` are tried
            (img2dataset) when no other index is found and nothing was listed.

    Raises:
        DataError: an index file that is recognised but malformed.
        FetchError: the store refused a read.
    """
    candidates = [("asyncstream.json", "asyncstream"), ("classes.json", "classes.json")]
    if known is None:
        others: list[str] = list(_WIDS_PROBES)
    else:
        jsons = (posixpath.basename(u) for u in known if u.endswith(".json"))
        others = sorted(n for n in jsons if n not in _NAMED and not n.endswith(_STATS_SUFFIX))
    candidates += [(name, "wids") for name in others[:_MAX_WIDS_CANDIDATES]]
    candidates += [("_info.json", "info.json"), ("info.json", "info.json")]
    candidates += [("sizes.json", "sizes.json")]
    if known is not None:
        present = {posixpath.basename(u) for u in known}
        candidates = [(name, kind) for name, kind in candidates if name in present]
    kinds = dict(candidates)
    for name, raw in _read_all(read, [f"{folder}/{name}" for name, _ in candidates]):
        index = parse_index(f"{folder}/{name}", raw, expect=kinds[name], rebase=True)
        if index is not None:
            return index
    if known is not None:
        stats = sorted(u for u in known if u.endswith(_STATS_SUFFIX))
    else:
        stats = [u[: -len(".tar")] + _STATS_SUFFIX for u in shard_urls if u.endswith(".tar")]
    return _stats_index(folder, dict(_read_all(read, stats, full=True))) if stats else None


def _read_all(
    read: Reader, urls: Sequence[str], *, full: bool = False
) -> Iterator[tuple[str, bytes]]:
    """``(name or URL, bytes)`` of the files that exist, in the order given; read in parallel."""
    if not urls:
        return
    with ThreadPoolExecutor(max_workers=min(16, len(urls))) as pool:
        for url, raw in zip(urls, pool.map(read, urls), strict=True):
            if raw is not None:
                yield (url if full else posixpath.basename(url)), raw


def manifest_bytes(
    folder: str,
    shards: Sequence[tuple[str, int, int, str | None]],
    *,
    splits: Mapping[str, Sequence[str]] | None = None,
) -> bytes:
    """An ``asyncstream.json`` manifest, one shard per line.

    Args:
        folder: where the manifest goes; shard URLs under it are written relative to it.
        shards: ``(url, samples, size, etag)`` of every shard, in dataset order.
        splits: split name to shard URLs, for a dataset of several splits.
    """

    def ref(url: str) -> str:
        return url[len(folder) + 1 :] if url.startswith(folder + "/") else url

    head = {"__kind__": MANIFEST_KIND, "samples": sum(s[1] for s in shards)}
    lines = [json.dumps(head)[:-1] + ', "shards": [']
    rows = [
        json.dumps({"url": ref(url), "samples": n, "size": size, "etag": etag})
        for url, n, size, etag in shards
    ]
    lines.append(",\n".join(rows))
    tail = "]"
    if splits:
        tail += ', "splits": ' + json.dumps({k: [ref(u) for u in v] for k, v in splits.items()})
    lines.append(tail + "}\n")
    return "\n".join(lines).encode()
