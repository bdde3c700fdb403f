"""A run of plain members named and grouped into samples by numpy at once.

For :mod:`._tarfast`: where a range's table (:mod:`._tarbulk`) gives a long run of plain
members, their name fields are split (the key up to the first dot after the last slash,
the extension after it) and grouped into samples for all members together, instead of
one member at a time in Python; what is left per sample is its key's decoding and its
record's tuple. About a third of the Python walk's cost on small members.

Exactness: only names the Python walk (:meth:`~._tarfast.RangeWalker._group`) would
split the same way are taken: no newline, no leading underscore, a dot after the last
slash with at least one byte between them, an extension of at most 8 bytes that is not
the general parser's to name, and no sample with the same extension twice. Any other run
is left to the Python walk whole (:func:`group_run` returns ``None``), so the outcome is
the walk's, byte for byte (``tests/test_tarfast.py`` reads every input both ways).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import repeat
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["VECTOR_MIN", "group_run"]

VECTOR_MIN = 64  # runs of fewer members are grouped by the Python walk
_COLUMNS = np.arange(100)
_EXT_BYTES = np.arange(8)
_SLASH, _DOT, _NEWLINE, _UNDERSCORE = 0x2F, 0x2E, 0x0A, 0x5F

Field = tuple[str, int, int, bytes | None]
Pending = tuple[str, int, list[Field]]
Grouped = tuple[int, Pending | None, list[tuple[Any, ...]]]
PythonGroup = Callable[[Any, int, Pending | None], Grouped]


def _split(rows: npt.NDArray[np.uint8]) -> tuple[npt.NDArray[Any], ...] | None:
    """Each name field's first dot after its last slash, its extension's bytes as a
    number and their count; ``None`` if any name is not one the vector path may take."""
    nul = rows == 0
    length = np.where(nul.any(axis=1), nul.argmax(axis=1), 100)
    rows = rows[:, : int(length.max())]  # names are short: the rest is NUL padding
    columns = _COLUMNS[: rows.shape[1]]
    inside = columns < length[:, None]
    if (rows[:, 0] == _UNDERSCORE).any() or ((rows == _NEWLINE) & inside).any():
        return None
    slash = (rows == _SLASH) & inside
    width = rows.shape[1]
    last_slash = np.where(slash.any(axis=1), width - 1 - slash[:, ::-1].argmax(axis=1), -1)
    dots = (rows == _DOT) & inside & (columns > last_slash[:, None])
    has_dot = dots.any(axis=1)
    dot = dots.argmax(axis=1)
    tail = length - dot - 1
    if not has_dot.all() or (dot - last_slash < 2).any() or (tail > 8).any():
        return None
    at = np.minimum(dot[:, None] + 1 + _EXT_BYTES, width - 1)
    ext = np.where(tail[:, None] > _EXT_BYTES, np.take_along_axis(rows, at, axis=1), 0)
    code = np.ascontiguousarray(ext.astype(np.uint8)).view("<u8")[:, 0]
    return dot, code, tail


def _extensions(
    codes: npt.NDArray[np.uint64], tails: npt.NDArray[np.int64], name: Callable[[bytes], str | None]
) -> tuple[list[str], npt.NDArray[np.intp]] | None:
    """The field name of each member and a number per distinct field name, or ``None``
    where an extension is the general parser's to name."""
    unique, first, inverse = np.unique(codes, return_index=True, return_inverse=True)
    names: list[str] = []
    number: dict[str, int] = {}
    per_code = []
    for code, at in zip(unique.tolist(), first.tolist(), strict=True):
        ext = name(code.to_bytes(8, "little")[: int(tails[at])])
        if ext is None:
            return None
        per_code.append(number.setdefault(ext, len(number)))
        names.append(ext)
    ext_numbers = np.asarray(per_code, dtype=np.intp)[inverse]
    return [names[i] for i in inverse.tolist()], ext_numbers


def group_run(
    names: memoryview,
    starts: list[int],
    stops: list[int],
    doff: int,
    after: int,
    pending: Pending | None,
    python_group: PythonGroup,
    extension: Callable[[bytes], str | None],
) -> Grouped | None:
    """The samples of a run of plain members, as the Python walk groups them.

    Args:
        names: the members' name fields, 100 bytes each.
        starts, stops: their data, relative to the range (whose offset is ``doff``).
        after: the header after the run, relative to the range.
        pending: the sample in progress before the run, if any.
        python_group: the Python walk's grouping, for the members that finish ``pending``.
        extension: the field name of an extension's bytes (None: not for the fast path).

    Returns:
        ``(rel, pending, records)`` as the Python walk returns them, or ``None`` where the
        run holds a name this path does not take (the caller then walks it in Python).
    """
    rows = np.frombuffer(names, dtype=np.uint8).reshape(-1, 100)
    split = _split(rows)
    if split is None:
        return None
    dot, codes, tails = split
    named = _extensions(codes, tails, extension)
    if named is None:
        return None
    exts, numbers = named
    width = int(dot.max())
    keyed = np.where(_COLUMNS[:width] < dot[:, None], rows[:, :width], 0)
    same = (keyed[1:] == keyed[:-1]).all(axis=1) & (dot[1:] == dot[:-1])
    group = np.concatenate(([0], np.cumsum(~same)))
    if (np.diff(np.sort(group * (int(numbers.max()) + 1) + numbers)) == 0).any():
        return None  # a duplicate field: the Python walk stops there for the parser
    firsts = np.flatnonzero(np.concatenate(([True], ~same))).tolist()
    records: list[tuple[Any, ...]] = []
    head = 0
    if pending is not None:  # the Python walk finishes it with the first sample's members
        head = firsts[1] if len(firsts) > 1 else len(starts)
        to = after if head == len(starts) else starts[head] - 512
        rel, pending, records = python_group(
            zip(
                (names[100 * i : 100 * i + 100].tobytes() for i in range(head)),
                starts[:head],
                stops[:head],
                (start - 512 for start in starts[:head]),
                strict=True,
            ),
            to,
            pending,
        )
        if rel != to or head == len(starts):
            return rel, pending, records
        assert pending is not None
        records.append((pending[0], pending[1], *pending[2]))
        firsts = firsts[1:]
    fields: list[Field] = list(zip(exts, starts, stops, repeat(None), strict=False))
    raw = names.tobytes()
    ends = [*firsts[1:], len(starts)]
    keys = [
        raw[100 * a : 100 * a + d].decode("utf-8", "surrogateescape")
        for a, d in zip(firsts, dot[firsts].tolist(), strict=True)
    ]
    records += [
        (key, doff + starts[a] - 512, *fields[a:b])
        for key, a, b in zip(keys[:-1], firsts[:-1], ends[:-1], strict=True)
    ]
    a = firsts[-1]
    return after, (keys[-1], doff + starts[a] - 512, fields[a:]), records
