"""A count's progress, shown: a tqdm bar on stderr and a one-line summary.

The library shows nothing unless asked. What a caller passes as ``progress`` (to
:class:`~asyncstream.ShardStream`, :func:`~._dataset.open_dataset` or
:func:`~asyncstream.index_dataset`) decides: ``None`` or ``False``, nothing; a callable,
called with each :class:`~._count.CountProgress` and nothing shown; ``True``, a bar on
stderr while the shards are read and, once they are, a summary line there. The command
line decides ``True`` or ``False`` (a terminal, ``--quiet``) and prints its own summary.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:  # it imports the fetch engine, which opening a dataset may not need
    from ._count import CountProgress, OnProgress

__all__ = ["Progress", "check_progress", "count_bar", "count_summary", "showing"]

Progress: TypeAlias = "bool | Callable[[CountProgress], None] | None"
"""What a caller asks for: nothing (``None``, ``False``), a bar (``True``), or its own
callback."""


def check_progress(progress: object) -> None:
    """Refuse a ``progress`` that is neither a flag nor a callable."""
    if progress is not None and not isinstance(progress, bool) and not callable(progress):
        raise TypeError(
            f"progress must be True, False or a callable taking a CountProgress, got {progress!r}"
        )


def count_summary(last: CountProgress) -> str:
    """One line for a finished count: ``counted 4 shards: 400 samples, 1.2 MB in 0.3 s
    (4.0 MB/s), 0 retries``."""
    mb = last.bytes / 1e6
    rate = mb / last.seconds if last.seconds > 0 else 0.0
    shards = "1 shard" if last.shards == 1 else f"{last.shards:,} shards"
    samples = "1 sample" if last.samples == 1 else f"{last.samples:,} samples"
    retries = "1 retry" if last.retries == 1 else f"{last.retries:,} retries"
    return (
        f"counted {shards}: {samples}, {mb:,.1f} MB in {last.seconds:.1f} s "
        f"({rate:,.1f} MB/s), {retries}"
    )


@contextlib.contextmanager
def count_bar(enabled: bool, desc: str, *, summary: bool = False) -> Iterator[OnProgress]:
    """A progress bar for reading shards, on stderr: MB/s and ETA, shards, samples and
    retries; the callback that moves it.

    Args:
        enabled: show it (else the callback does nothing).
        desc: the bar's label.
        summary: once the shards are read, print :func:`count_summary` on stderr.
    """
    from tqdm import tqdm

    bar = tqdm(unit="B", unit_scale=True, desc=desc, disable=not enabled, file=sys.stderr)
    seen: list[CountProgress] = []
    try:

        def update(p: CountProgress) -> None:
            if seen:
                seen[0] = p
            else:
                seen.append(p)
            bar.total = p.bytes_total
            bar.set_postfix_str(
                f"{p.shards}/{p.shards_total} shards, {p.samples:,} samples, {p.retries} retries",
                refresh=False,
            )
            bar.update(p.bytes - bar.n)

        yield update
    finally:
        bar.close()
    if enabled and summary and seen:
        print(f"asyncstream: {count_summary(seen[0])}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def showing(progress: Progress, desc: str = "counting") -> Iterator[OnProgress | None]:
    """The callback for what the caller asked (module docstring)."""
    if progress is True:
        with count_bar(True, desc, summary=True) as update:
            yield update
        return
    yield progress if callable(progress) else None
