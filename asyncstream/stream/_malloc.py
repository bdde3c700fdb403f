"""Freed memory kept in the process, not given back to the kernel and faulted in again.

glibc's malloc gives the top of its heap back to the kernel once more of it is free than
its trim threshold (128 KiB at start; twice the mmap threshold once freeing large blocks
has moved that, a few hundred KiB for ImageNet-sized images). A reader that hands out a
sample's members as ``bytes`` allocates about 100 kB a sample and frees it a few samples
later: the heap's top shrinks and grows again, and every page of it is faulted in,
zeroed, when it grows. Measured (``python -m bench.samplecost --url real-4000 --defaults
--baseline c158cce``, ImageNet-sized samples, bench/RESULTS.md): plain iteration cost 26.0
µs of the consumer's CPU a sample and 3.7 minor page faults; with the thresholds raised,
16.0 µs and 0.03.
The loaders that hand out ``bytes`` in Python pay the same, and the usual advice for them
is an allocator preloaded or ``MALLOC_TRIM_THRESHOLD_`` set by hand; a data loader should
not need either.

So once per process, where the C library is glibc, the first time a stream is iterated:
``mallopt(M_MMAP_THRESHOLD, 16 MiB)`` (blocks below it come from the heap, as glibc's own
threshold would have let them once it had grown; setting the trim threshold stops that
growth) and ``mallopt(M_TRIM_THRESHOLD, 64 MiB)`` (the heap's top is given back once more
than 64 MiB of it is free: a batch of large samples fits under it). The memory a process
keeps is memory it already used at its peak; its peak does not grow. Left alone where the
environment sets glibc's own variables (``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_TOP_PAD_``,
``MALLOC_MMAP_THRESHOLD_``: the user tuned it) or ``ASYNCSTREAM_MALLOC=0``.
``ShardStream.stats()["malloc"]`` says which: ``"tuned"``, ``"environment"``, ``"off"``,
``"unavailable"`` (not glibc), or ``"untouched"`` (not iterated yet in this process).
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Mapping
from typing import Any

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "decide", "state", "tune"]

MMAP_THRESHOLD = 16 << 20
TRIM_THRESHOLD = 64 << 20
_M_TRIM_THRESHOLD = -1  # glibc's malloc.h
_M_MMAP_THRESHOLD = -3
_GLIBC_VARIABLES = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_THRESHOLD_")

_lock = threading.Lock()
_state = "untouched"  # a forked child inherits it with the settings themselves


def state() -> str:
    """What :func:`tune` did in this process (see the module's doc)."""
    return _state


def tune() -> str:
    """Keep freed memory in this process, once (see the module's doc); returns
    :func:`state`."""
    global _state
    if _state != "untouched":
        return _state
    with _lock:
        if _state == "untouched":
            _state = decide(os.environ, _glibc())
    return _state


def decide(environ: Mapping[str, str], libc: Any) -> str:
    """Set glibc's thresholds through ``libc`` (its ``mallopt``) unless ``environ`` says
    not to or ``libc`` is None; returns what was done."""
    if environ.get("ASYNCSTREAM_MALLOC", "1") == "0":
        return "off"
    if any(name in environ for name in _GLIBC_VARIABLES):
        return "environment"
    if libc is None:
        return "unavailable"
    if not libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD):
        return "unavailable"
    if not libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD):
        return "unavailable"
    return "tuned"


def _glibc() -> Any:
    """The process's C library where it is glibc, else None (musl, macOS, Windows)."""
    if os.name != "posix":
        return None
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return None
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    return libc
