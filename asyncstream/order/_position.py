"""A reader's position in its epoch, as saved in its state (see :mod:`._state`).

Parsed field by field: a position that does not parse names what is wrong
(:class:`~asyncstream.StateError`, "state_dict is corrupted: ...").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._exceptions import StateError

__all__ = [
    "Blended",
    "LaneState",
    "Position",
    "corrupted",
    "int_field",
    "int_list",
    "lane_dict",
    "position_dict",
]

Blended = tuple[tuple[int, ...], tuple[int, ...]]  # a mixed stream's (drawn, credit) by source


def corrupted(why: str) -> StateError:
    """The error of a state that does not parse, saying why."""
    return StateError(f"state_dict is corrupted: {why}")


def int_field(data: Mapping[str, Any], name: str, where: str) -> int:
    value = data.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise corrupted(f"{where}{name} must be an integer >= 0, got {value!r}")
    return value


def int_list(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value
    ):
        raise corrupted(f"{what} must be a list of integers >= 0")
    return tuple(value)


@dataclass(frozen=True)
class LaneState:
    """An open lane: its piece (by position), resident chunk and undrawn samples.

    Attributes:
        piece: position of the lane's piece in the reader's pieces.
        chunk: the resident chunk (numbered from the piece's first chunk).
        reader_start: byte offset of the first header fed with the resident chunk (the
            header of a sample carried over from the chunk before, if any).
        returned_before: in-shard index of the sample that starts at ``reader_start``.
        returned: in-shard index of the first sample after the resident chunk's
            (``None`` in a version 1 state, which did not record it).
        remaining: undrawn samples of the resident chunk, as in-shard indices, in the
            lane's current order.
    """

    piece: int
    chunk: int
    reader_start: int
    returned_before: int
    returned: int | None
    remaining: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data."""
        return lane_dict(
            self.piece,
            self.chunk,
            self.reader_start,
            self.returned_before,
            self.returned,
            list(self.remaining),
        )

    @classmethod
    def from_dict(cls, data: Any) -> LaneState:
        """Parse and check a lane (``returned`` is new in version 2; 1 had none)."""
        if not isinstance(data, dict):
            raise corrupted("a lane must be a dict")
        remaining = int_list(data.get("remaining"), "a lane's remaining")
        before = int_field(data, "returned_before", "lane ")
        returned = None if "returned" not in data else int_field(data, "returned", "lane ")
        lane = cls(
            piece=int_field(data, "piece", "lane "),
            chunk=int_field(data, "chunk", "lane "),
            reader_start=int_field(data, "reader_start", "lane "),
            returned_before=before,
            returned=returned,
            remaining=remaining,
        )
        if lane.reader_start % 512:
            raise corrupted("a lane's reader_start is not at a tar header boundary")
        end = math.inf if returned is None else returned
        if any(not before <= i < end for i in remaining):
            raise corrupted("a lane's remaining samples are not those of its resident chunk")
        return lane


@dataclass(frozen=True)
class Position:
    """Where a reader is in its pieces."""

    draws: int = 0
    next_piece: int = 0
    emitted: int = 0
    lanes: tuple[LaneState, ...] = ()
    blend: Blended | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data."""
        lanes = [lane.to_dict() for lane in self.lanes]
        return position_dict(self.draws, self.next_piece, self.emitted, lanes, self.blend)

    @classmethod
    def from_dict(cls, data: Any, window: int, sources: int = 0) -> Position:
        """Parse and check a position (of a stream of ``sources`` sources, 0 unmixed)."""
        if not isinstance(data, dict):
            raise corrupted("position is missing")
        lanes = data.get("lanes")
        if not isinstance(lanes, list) or len(lanes) > window:
            raise corrupted("lanes must be a list of at most window entries")
        position = cls(
            draws=int_field(data, "draws", ""),
            next_piece=int_field(data, "next_piece", ""),
            emitted=int_field(data, "emitted", ""),
            lanes=tuple(LaneState.from_dict(lane) for lane in lanes),
            blend=_blend_from(data.get("sources"), sources),
        )
        if any(lane.piece >= position.next_piece for lane in position.lanes):
            raise corrupted("a lane's piece is not yet opened")
        if position.blend is not None and sum(position.blend[0]) != position.draws:
            raise corrupted("the samples drawn from each source do not add up to the draws")
        return position


def lane_dict(
    piece: int,
    chunk: int,
    reader_start: int,
    returned_before: int,
    returned: int | None,
    remaining: list[int],
) -> dict[str, Any]:
    """A lane as plain JSON data (:meth:`LaneState.to_dict`'s layout), holding
    ``remaining`` itself: the one place the layout is written."""
    return {
        "piece": piece,
        "chunk": chunk,
        "reader_start": reader_start,
        "returned_before": returned_before,
        **({} if returned is None else {"returned": returned}),
        "remaining": remaining,
    }


def position_dict(
    draws: int, next_piece: int, emitted: int, lanes: list[dict[str, Any]], blend: Blended | None
) -> dict[str, Any]:
    """A position as plain JSON data (:meth:`Position.to_dict`'s layout), holding ``lanes``
    (each a :func:`lane_dict`) itself: the one place the layout is written."""
    out: dict[str, Any] = {
        "draws": draws,
        "next_piece": next_piece,
        "emitted": emitted,
        "lanes": lanes,
    }
    if blend is not None:
        drawn, credit = blend
        out["sources"] = {"drawn": list(drawn), "credit": list(credit)}
    return out


def _blend_from(data: Any, sources: int) -> Blended | None:
    """A position's blend (:class:`._mix.Blend`): ``None`` where it has none."""
    if data is None:
        return None
    if not isinstance(data, dict) or sources == 0:
        raise corrupted("a position's sources do not belong to a stream of sources")
    drawn = int_list(data.get("drawn"), "the samples drawn from each source")
    credit = data.get("credit")
    if not isinstance(credit, list) or not all(
        isinstance(c, int) and not isinstance(c, bool) for c in credit
    ):
        raise corrupted("the sources' credit must be a list of integers")
    if not len(drawn) == len(credit) == sources:
        raise corrupted(f"a position's sources must have {sources} entries, as the stream")
    return drawn, tuple(credit)
