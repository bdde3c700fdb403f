"""Tar members and samples in the webdataset layout.

A sample is the group of consecutive tar members sharing a key: the member's path up
to the first dot of its basename (``train/000017.jpg`` and ``train/000017.cls`` form the
sample ``train/000017`` with the fields ``jpg`` and ``cls``).
"""

from __future__ import annotations

import posixpath
import tarfile
from typing import IO

from ._exceptions import CorruptTarError

__all__ = ["count_samples", "split_member_name"]


def split_member_name(name: str) -> tuple[str, str]:
    """Split a member name into ``(key, extension)`` by the webdataset convention.

    Example: ``"a/b/000017.seg.png"`` gives ``("a/b/000017", "seg.png")``.
    """
    folder, base = posixpath.split(name)
    stem, dot, ext = base.partition(".")
    key = posixpath.join(folder, stem) if folder else stem
    return key, ext if dot else ""


def count_samples(fileobj: IO[bytes], url: str) -> int:
    """Count the samples in a tar stream read front to back (no seeking needed).

    Args:
        fileobj: the tar bytes, e.g. an S3 response body.
        url: the shard, named in errors.

    Raises:
        CorruptTarError: the stream is not a readable tar.
    """
    count = 0
    last_key: str | None = None
    try:
        with tarfile.open(fileobj=fileobj, mode="r|") as archive:
            for member in archive:
                if not member.isfile():
                    continue
                key, _ = split_member_name(member.name)
                if key != last_key:
                    count += 1
                    last_key = key
    except (tarfile.TarError, EOFError) as exc:
        offset = _position(fileobj)
        raise CorruptTarError(
            f"{url}: not a readable tar (near byte {offset}): {exc}", url=url, offset=offset
        ) from exc
    return count


def _position(fileobj: IO[bytes]) -> int:
    try:
        return int(fileobj.tell())
    except (OSError, AttributeError, ValueError):
        return -1
