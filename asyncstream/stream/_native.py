"""The stream layer's native piece (``_nextc.c``): the stall meter's core and the fast path
of the iterator's ``next()``, or None where the Python references are to run
(``ASYNCSTREAM_NATIVE=0`` in the environment, read once at import, or no build)."""

from __future__ import annotations

import os
from types import ModuleType

__all__ = ["NEXTC"]


def _load() -> ModuleType | None:
    if os.environ.get("ASYNCSTREAM_NATIVE", "1") == "0":
        return None
    try:
        # Not `from ._nextc import Meter`: with no .py to find, grimp reads it as `asyncstream`.
        from . import _nextc
    except ImportError:
        return None
    return _nextc


NEXTC = _load()
