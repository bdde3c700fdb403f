"""A pack's progress, shown: two tqdm bars on stderr (images checked, then samples
packed into shards) and, for :func:`~._pack.pack` called with ``progress=True``, a
one-line summary there. The command line decides whether the bars show (a terminal,
``--quiet``) and prints its own summary on stdout."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

__all__ = ["pack_bars", "pack_summary"]

OnChecked = Callable[[int, int], None]
OnPacked = Callable[[int, int, int], None]


def _mib(n: float) -> str:
    return f"{n / (1 << 20):,.1f} MiB"


@contextlib.contextmanager
def pack_bars(enabled: bool) -> Iterator[tuple[OnChecked, OnPacked]]:
    """The bars, and the callbacks that move them: ``checked(done, total)`` for the
    images decoded, ``packed(samples_done, bytes_done, samples_total)`` for the shards
    written. Disabled, the callbacks do nothing."""
    from tqdm import tqdm

    check = tqdm(unit="img", desc="checking", disable=not enabled, miniters=64, file=sys.stderr)
    packing = tqdm(unit="img", desc="packing", disable=not enabled, file=sys.stderr)
    try:

        def checked(done: int, total: int) -> None:
            check.total = total
            check.update(done - check.n)

        def packed(done: int, nbytes: int, total: int) -> None:
            packing.total = total
            packing.n = done
            packing.set_postfix_str(_mib(nbytes))
            packing.refresh()

        yield checked, packed
    finally:
        check.close()
        packing.close()


def pack_summary(samples: int, shards: int, size: int, dest: str, skipped: int) -> str:
    """One line for a finished pack."""
    line = f"packed {samples:,} samples into {shards:,} shards ({_mib(size)}) at {dest}"
    return line + (f", skipped {skipped:,} bad images" if skipped else "")
