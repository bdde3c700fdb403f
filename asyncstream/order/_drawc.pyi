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

def draw_blend(
    lists: list[list[T]],
    groups: list[int],
    totals: list[int],
    drawn: list[int],
    credit: list[int],
    key: int,
    draws: int,
    n: int,
    shards: bool,
    /,
) -> tuple[list[int], list[T]]:
    """As :func:`draw`, each draw's source picked first by the blend
    (:meth:`~._mix.Blend.choose` over the sources with a lane, ``groups`` giving each
    lane's; ``drawn`` and ``credit`` updated in place), then one of its lanes.

    Raises:
        OverflowError: the blend's numbers leave 64 bits at the first draw (nothing changed).
    """

def below(key: int, n: int, bound: int, /) -> int:
    """A uniform integer in ``[0, bound)`` for random number ``n`` of ``key``, as
    :func:`~._shuffle._below`."""
