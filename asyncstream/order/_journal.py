"""Snapshots of the window shuffle's state that cost next to nothing to take.

:meth:`WindowShuffle.state() <._shuffle.WindowShuffle.state>` copies every open lane's
undrawn samples: a window of large chunks holds tens of thousands, and a loader that
keeps the state of every batch (the DALI loader's producer keeps the position before
each batch, for the one batch its user may checkpoint at) would copy them all once a
batch. A :class:`ShuffleSnapshot` copies nothing: it is a **base** (every lane's
undrawn samples, copied once, immutable) and the length of a **journal** that the
shuffle keeps from that base on (each draw's lane, each lane opened, refilled or
closed). Its :meth:`~ShuffleSnapshot.state` replays the journal over a copy of the base,
each draw removing the sample it removed (the draw's pick is a pure function of the key
and the draw number, :func:`pick_randoms`): the same dict, value for value, as ``state()``
gave when the snapshot was taken.

The journal only grows (an undraw drops its draws from the tail, which no snapshot holds);
once it is longer than a quarter of the base (:func:`journal_limit`) the shuffle drops it,
and the next snapshot starts a new base. Entries a snapshot holds are never changed, and
a snapshot holds no live list of the shuffle, so a snapshot never changes, and its
``state()`` may run in another thread while the shuffle goes on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Base", "Journal", "ShuffleSnapshot", "journal_limit", "pick_randoms"]

_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MUL1, _MUL2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_MIN_LIMIT = 1024  # entries a journal may hold at least before it is dropped

# A journal's entries: an int is a draw from that lane index; a tuple is a lane event.
_OPEN, _REFILL, _CLOSE = "open", "refill", "close"


def pick_randoms(key: int, first: int, count: int) -> list[int]:
    """``_splitmix(key + 2 * d + 1)`` for the draws ``d = first .. first + count - 1``: the
    random number each of those draws picked its sample with (:meth:`WindowShuffle.draw
    <._shuffle.WindowShuffle.draw>`: ``pick = (r * len(items)) >> 64``), in numpy's
    wrapping ``uint64`` arithmetic."""
    start = np.uint64((key + 2 * first + 1 + _GOLDEN) & _M64)
    x = np.arange(count, dtype=np.uint64) * np.uint64(2) + start
    x = (x ^ (x >> np.uint64(30))) * _MUL1
    x = (x ^ (x >> np.uint64(27))) * _MUL2
    out: list[int] = (x ^ (x >> np.uint64(31))).tolist()
    return out


def journal_limit(resident: int) -> int:
    """The entries a journal over a base of ``resident`` samples may hold: replaying it
    then costs at most about what a new base costs to copy, four times over."""
    return max(_MIN_LIMIT, resident // 4)


@dataclass(frozen=True)
class Base:
    """The shuffle's lanes when a journal starts: draws so far, and each lane's piece
    and undrawn samples (in the lane's order), copied."""

    draws: int
    lanes: tuple[tuple[int, tuple[Any, ...]], ...]

    @property
    def resident(self) -> int:
        return sum(len(items) for _, items in self.lanes)


class Journal:
    """What the shuffle did since its base, for the snapshots taken on it."""

    __slots__ = ("base", "limit", "log", "pinned")

    def __init__(self, base: Base) -> None:
        self.base = base
        self.log: list[Any] = []
        self.pinned = 0  # entries before it are held by a snapshot: never changed
        self.limit = journal_limit(base.resident)

    @property
    def full(self) -> bool:
        """Whether the journal is past its limit (the shuffle then drops it)."""
        return len(self.log) > self.limit

    def draws(self, indices: Sequence[int]) -> None:
        self.log.extend(indices)

    def draw(self, index: int) -> None:
        self.log.append(index)

    def open(self, piece: int, items: Sequence[Any]) -> None:
        self.log.append((_OPEN, piece, tuple(items)))

    def refill(self, lane: int, items: Sequence[Any]) -> None:
        self.log.append((_REFILL, lane, tuple(items)))

    def close(self, lane: int) -> None:
        self.log.append((_CLOSE, lane))

    def undraw(self, n: int) -> bool:
        """Drop the last ``n`` draws. Returns False where it cannot (they are not the
        journal's last entries, or a snapshot holds them): the shuffle then drops it."""
        log = self.log
        keep = len(log) - n
        if keep < self.pinned or any(type(entry) is not int for entry in log[keep:]):
            return False
        del log[keep:]
        return True

    def snapshot(self, key: int, shuffle: bool, draws: int, next_piece: int) -> ShuffleSnapshot:
        """A snapshot of the shuffle now (its draws and pieces opened as given)."""
        self.pinned = len(self.log)
        return ShuffleSnapshot(self.base, self.log, self.pinned, key, shuffle, draws, next_piece)


class ShuffleSnapshot:
    """The shuffle's state when it was taken, made by :meth:`state` (module docstring).

    Never changes: it holds the journal's base (immutable) and a length of its log (the
    entries before it are never changed)."""

    __slots__ = ("_base", "_draws", "_end", "_key", "_log", "_next_piece", "_shuffle")

    def __init__(
        self,
        base: Base,
        log: list[Any],
        end: int,
        key: int,
        shuffle: bool,
        draws: int,
        next_piece: int,
    ) -> None:
        self._base, self._log, self._end = base, log, end
        self._key, self._shuffle = key, shuffle
        self._draws, self._next_piece = draws, next_piece

    @property
    def draws(self) -> int:
        """The shuffle's draws when the snapshot was taken."""
        return self._draws

    def state(self) -> dict[str, Any]:
        """The shuffle's :meth:`~._shuffle.WindowShuffle.state` when the snapshot was
        taken, in new lists (each call makes its own).

        Raises:
            RuntimeError: the journal does not add up to the draws (a bug: never).
        """
        base = self._base
        entries = self._log[: self._end]  # one atomic copy: the shuffle may append meanwhile
        # Each lane as [piece, items, cursor]: a draw with the shuffle off moves the cursor.
        lanes: list[list[Any]] = [[piece, list(items), 0] for piece, items in base.lanes]
        draws = sum(1 for entry in entries if type(entry) is int)
        randoms = pick_randoms(self._key, base.draws, draws) if self._shuffle and draws else []
        at = 0
        for entry in entries:
            if type(entry) is int:
                lane = lanes[entry]
                if self._shuffle:
                    items = lane[1]
                    pick = (randoms[at] * len(items)) >> 64
                    items[pick] = items[-1]
                    items.pop()
                    at += 1
                else:
                    lane[2] += 1
            elif entry[0] == _OPEN:
                lanes.append([entry[1], list(entry[2]), 0])
            elif entry[0] == _REFILL:
                lane = lanes[entry[1]]
                lane[1], lane[2] = list(entry[2]), 0
            else:
                del lanes[entry[1]]
        if base.draws + draws != self._draws:
            raise RuntimeError(
                f"a shuffle snapshot's journal holds {draws} draws after draw {base.draws}, "
                f"not the {self._draws - base.draws} the shuffle made"
            )
        return {
            "draws": self._draws,
            "next_piece": self._next_piece,
            "lanes": [
                {"piece": piece, "remaining": items if not cursor else items[cursor:]}
                for piece, items, cursor in lanes
            ],
        }
