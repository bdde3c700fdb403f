"""Types of the native window draw (``_drawc.c``), for mypy: see :mod:`._shuffle`."""

from typing import TypeVar

T = TypeVar("T")

def draw(
    lists: list[list[T]], key: int, draws: int, n: int, shards: bool, /
) -> tuple[list[int], list[T]]:
    """Up to ``n`` draws from draw number ``draws`` on, over the lanes' ``lists`` (changed
    in place), as :meth:`~._shuffle.WindowShuffle.draw_many` makes them: each draw's lane
    index and sample; stops after a draw that empties a lane. ``shards``: lanes picked
    uniformly, else by resident samples."""

def below(key: int, n: int, bound: int, /) -> int:
    """A uniform integer in ``[0, bound)`` for random number ``n`` of ``key``, as
    :func:`~._shuffle._below`."""
