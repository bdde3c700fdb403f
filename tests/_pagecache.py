"""Files out of the page cache, for the tests of reads that try it first (``RWF_NOWAIT``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def evict(path: Path, warm: int = 0) -> None:
    """Evict ``path``'s pages from the page cache (written back first), then read its
    first ``warm`` bytes back in, with no readahead; skip where the file system keeps the
    file in memory (tmpfs). The whole file is evicted: the kernel keeps a large folio
    that a range evicted only in part."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # this descriptor: no readahead
        if warm:
            os.preadv(fd, [bytearray(warm)], 0)
        try:
            os.preadv(fd, [bytearray(4096)], max(0, path.stat().st_size - 4096), os.RWF_NOWAIT)
        except BlockingIOError:
            return
    finally:
        os.close(fd)
    pytest.skip(f"{path.parent} keeps its files in memory: no read of it waits for a disk")
