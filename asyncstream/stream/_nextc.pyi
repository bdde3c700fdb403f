"""Types of the stream's native piece (``_nextc.c``), for mypy: see :mod:`._native`."""

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

class Meter:
    """The stall meter's core (the reference: ``_stall.StallMeter``)."""

    waited: float
    worked: float
    calls: int
    window: int
    last_return: float | None

    def __init__(self, window: int = 200) -> None: ...
    def begin(self) -> float: ...
    def end(self, started: float, /) -> None: ...
    def record(self, started: float, now: float, /) -> None: ...
    def timed(self, produce: Callable[[], T], /) -> T: ...
    def new_epoch(self) -> None: ...
    def pause(self) -> None: ...
    def recent(self) -> tuple[float, float, int]: ...

class Handout:
    """The fast path of ``Iteration.__next__``."""

    _ready: list[dict[str, Any]]
    _token: list[bool]
    meter: Any
    _on_begin: Callable[[], None] | None
    closed: bool
    replaced: bool

    def __iter__(self) -> Handout: ...
    def __next__(self) -> dict[str, Any]: ...

def clock() -> float:
    """The meter's clock: ``time.perf_counter()``."""

def soonest(
    lanes: Sequence[tuple[int, tuple[int, int, float, int, int] | None]],
    upcoming: Sequence[tuple[int, int, float, int, int]],
    window: int,
    budget: int,
    /,
) -> list[tuple[int, int]]:
    """The prefetch ranking (the reference: ``_prefetch._soonest``)."""
