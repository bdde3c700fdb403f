"""Types of the native tar walk and records table (``_tarwalk.c``, ``_records.c``), for
mypy: see :mod:`._tarfast`."""

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, SupportsIndex

Field = tuple[str, int, int, bytes | None]
Pending = tuple[str, int, list[Field]]
Record = tuple[str, int, *tuple[Field, ...]]

class Records:
    """A chunk's samples as one table; to Python, the list of :data:`Record` it replaces."""

    def __init__(self) -> None: ...
    def __len__(self) -> int: ...
    def __getitem__(self, i: SupportsIndex, /) -> Record: ...
    def __iter__(self) -> Iterator[Record]: ...
    def __iadd__(self, records: Records | Iterable[Record], /) -> Records: ...
    def append(self, record: Record, /) -> None:
        """Add a record tuple."""
    def extend(self, records: Records | Iterable[Record], /) -> None:
        """Add every record of another table or of an iterable of tuples."""
    def sample(
        self, i: SupportsIndex, view: memoryview, url: str, views: bool = False, /
    ) -> dict[str, Any]:
        """Record ``i`` as the stream's dict: ``__key__``, ``__url__`` and each member
        (``bytes`` copied out of ``view``, or with ``views`` a slice of it, or the bytes
        the record owns)."""
    def members(self, count: SupportsIndex, /) -> tuple[list[str], list[tuple[str, ...]]]:
        """The keys of the first ``count`` samples (all, where there are fewer) and the
        extensions of each one's members, in order; no record tuple made."""

class Member:
    """A tar member's bytes, gathered across ranges into the bytes object it becomes."""

    def __init__(self, size: int) -> None: ...
    @property
    def missing(self) -> int:
        """Bytes the member still lacks."""
    def add(self, data: memoryview | bytes, /) -> bool:
        """Copy ``data`` in after the bytes added so far; True once the member is full."""
    def take(self) -> bytes:
        """The member's bytes, once full; the Member holds nothing after."""

def walk(
    data: memoryview,
    rel: int,
    limit: int,
    stop: int,
    doff: int,
    pending: Pending | None,
    /,
) -> tuple[int, Pending | None, Records, bool, tuple[str, int, int] | None]:
    """The run of plain members at ``rel`` of ``data[:limit]`` (``stop``: the shard's end,
    ``doff``: the range's offset in the shard, ``pending``: the sample in progress), as
    :meth:`~._tarfast.RangeWalker.walk` returns it."""

def deliver(
    lanes: list[tuple[Records | Sequence[Record], memoryview, str, int]],
    indices: Sequence[int],
    samples: Sequence[int],
    sink: Callable[[memoryview, str, Record], object],
    /,
) -> tuple[int, bool, BaseException | None]:
    """``EpochRun.take``'s loop: each draw ``(indices[k], samples[k])`` handed to
    ``sink``; ``(taken, going, error)``."""

def dicts(
    lanes: list[tuple[Records | Sequence[Record], memoryview, str, int]],
    indices: Sequence[int],
    samples: Sequence[int],
    views: bool,
    fallback: Callable[[Any, int, memoryview, str, bool], dict[str, Any]],
    /,
) -> list[dict[str, Any]]:
    """``Emit.run``'s loop: the dict of each draw ``(indices[k], samples[k])``, last
    first; a lane whose records are a list built by ``fallback``."""
