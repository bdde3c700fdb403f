"""webdataset as the oracle: what its reader yields for a tar's bytes.

:func:`wds_samples` runs webdataset's own pipeline (``tar_file_expander`` then
``group_by_keys``, as ``wds.WebDataset`` does) over the bytes of one shard; tarfile's
``"r|*"`` mode decompresses gzip, bzip2 and xz, and zstd (which Python 3.11's tarfile does
not read) is decompressed here first. :func:`wds_member` is webdataset's naming of one
member (its ``base_plus_ext``, its meta-name rule and lower-casing), for tests that walk a
tar with tarfile themselves.
"""

from __future__ import annotations

import io
import re
from typing import Any

import zstandard
from webdataset.tariterators import base_plus_ext, group_by_keys, tar_file_expander

from asyncstream.shards._compressed import open_reader

__all__ = ["ours", "wds_member", "wds_samples"]

_META = re.compile(r"__[^/]*__($|/)")  # tar_file_iterator's skip_meta default


def wds_member(name: str) -> tuple[str, str] | None:
    """``(key, extension)`` as webdataset names a regular member, or None if it skips it."""
    if "/" not in name and name.startswith("__") and name.endswith("__"):
        return None
    if _META.match(name):
        return None
    key, ext = base_plus_ext(name)
    if key is None:
        return None
    return key, ext.lower()


def wds_samples(data: bytes, url: str = "shard.tar") -> list[dict[str, Any]]:
    """webdataset's samples of a shard's stored bytes, without ``__url__``."""
    if url.endswith((".zst", ".zstd", ".tzst")):
        data = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)).read()
    samples = group_by_keys(tar_file_expander([{"url": url, "stream": io.BytesIO(data)}]))
    return [{k: v for k, v in s.items() if k != "__url__"} for s in samples]


def ours(data: bytes, url: str = "shard.tar", chunk: int | None = None) -> list[dict[str, Any]]:
    """asyncstream's reader over the same bytes fed in ``chunk``-byte ranges, as dicts."""
    reader = open_reader(url, len(data))
    step = chunk or max(len(data), 1)
    out: list[dict[str, Any]] = []
    for offset in range(0, max(len(data), 1), step):
        piece = data[offset : offset + step]
        for sample in reader.feed(piece, offset, final=offset + len(piece) == len(data)):
            out.append({"__key__": sample.key, **{k: bytes(v) for k, v in sample.fields.items()}})
    return out
