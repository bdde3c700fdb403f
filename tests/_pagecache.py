"""Files out of the page cache, for the tests of reads that try it first (``RWF_NOWAIT``)."""

from __future__ import annotations

import ctypes
import mmap
import os
import time
from pathlib import Path

import pytest

_LIBC = ctypes.CDLL(None, use_errno=True)


def resident(path: Path) -> int:
    """How many of ``path``'s pages the page cache holds, by ``mincore`` on a mapping of
    the file that touches none of them. (A read with ``RWF_NOWAIT`` would tell too, but
    a miss starts the kernel's readahead, which brings the file back in.)"""
    size = path.stat().st_size
    if not size:
        return 0
    pages = -(-size // mmap.PAGESIZE)
    vector = (ctypes.c_ubyte * pages)()
    with open(path, "rb") as f:
        mapping = mmap.mmap(f.fileno(), size, flags=mmap.MAP_PRIVATE)  # never written
        try:
            anchor = ctypes.c_char.from_buffer(mapping)
            try:
                code = _LIBC.mincore(
                    ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(size), vector
                )
            finally:
                del anchor
        finally:
            mapping.close()
    if code:
        raise OSError(ctypes.get_errno(), f"mincore of {path}")
    return sum(byte & 1 for byte in vector)


def evict(path: Path, warm: int = 0) -> None:
    """Evict ``path``'s pages from the page cache (written back first), then read its
    first ``warm`` bytes back in, with no readahead; skip where the file system keeps the
    file in memory (tmpfs). The whole file is evicted: the kernel keeps a large folio
    that a range evicted only in part. A page another process has just written can stay
    a moment after the first try: it is tried again, 20 times at most."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        for attempt in range(20):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            if not resident(path):
                break
            time.sleep(0.01 * attempt)
        else:
            pytest.skip(f"{path.parent} keeps its files in memory: no read of it waits")
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # this descriptor: no readahead
        if warm:
            os.preadv(fd, [bytearray(warm)], 0)
    finally:
        os.close(fd)
