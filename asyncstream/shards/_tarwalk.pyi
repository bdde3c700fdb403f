"""Types of the native tar walk (``_tarwalk.c``), for mypy: see :mod:`._tarfast`."""

Field = tuple[str, int, int, bytes | None]
Pending = tuple[str, int, list[Field]]
Record = tuple[str, int, *tuple[Field, ...]]

def walk(
    data: memoryview,
    rel: int,
    limit: int,
    stop: int,
    doff: int,
    pending: Pending | None,
    /,
) -> tuple[int, Pending | None, list[Record], bool]:
    """The run of plain members at ``rel`` of ``data[:limit]`` (``stop``: the shard's end,
    ``doff``: the range's offset in the shard, ``pending``: the sample in progress), as
    :meth:`~._tarfast.RangeWalker.walk` returns it."""
