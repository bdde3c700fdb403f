"""The one owner of a reader's state: built from its stages' states, checked, versioned
and split back into them.

Each stage of an epoch (:mod:`._run`) keeps its own state as plain data, ``state()``, and
continues exactly from it, ``reset(state)``: the plan source (epoch, lineage, assignment,
pieces handed out: :mod:`._plansource`), the chunk reader (each open lane's resident chunk
and where its shard's reader stands: :mod:`._lanes`), the window shuffle (draws, pieces
opened, each lane's undrawn samples: :mod:`..order._shuffle`), the blend of a mixed stream
(drawn and credit per source: :mod:`..order._mix`) and emit (samples emitted:
:mod:`._emit`). No stage reads another's state.

:class:`Checkpoint` alone turns the stages' states into the reader's saved state (a
:class:`~._state.ReaderState`, whose ``to_dict`` is ``state_dict()``'s layout, version
:data:`~._state.STATE_VERSION`), reads a saved one back (every field checked, older
versions read: :meth:`ReaderState.from_dict`), and splits a saved position into the state
each stage restores from. The saved layout is the one versions 1 to 3 share: a saved lane
(``position.lanes[i]``) joins the chunk reader's lane and the shuffle's lane of one piece,
in the shuffle's lane order; ``position.sources`` is the blend's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from .._exceptions import StateError
from ..order._plan import Topology
from ..order._position import Blended, lane_dict, position_dict
from ._state import (
    STATE_VERSION,
    Identity,
    LaneState,
    Position,
    ReaderState,
    Start,
    find_states,
    segment_from_json,
    segment_to_json,
)

if TYPE_CHECKING:
    from ._settings import StreamSettings

__all__ = ["Checkpoint", "StageStates", "StateSnapshot"]


@dataclass(frozen=True)
class StageStates:
    """The state of each stage of one reader, as each stage's ``state()`` gives it."""

    plan: Mapping[str, Any]
    reader: Mapping[str, Any]
    shuffle: Mapping[str, Any]
    blend: Mapping[str, Any] | None
    emit: Mapping[str, Any]


class Checkpoint:
    """Builds, checks, versions and restores the state of one reader of a stream.

    Args:
        settings: the stream's settings (its identity and plan).
        topology: the reader's rank and worker.
    """

    version = STATE_VERSION

    def __init__(self, settings: StreamSettings, topology: Topology) -> None:
        self.settings = settings
        self.topology = topology

    @functools.cached_property
    def identity(self) -> Identity:
        """The identity of the settings (they never change)."""
        return Identity.of(self.settings)

    @staticmethod
    def _lanes(stages: StageStates) -> Iterator[tuple[Mapping[str, Any], Mapping[str, Any]]]:
        """Each saved lane's shuffle lane and chunk reader lane, in the shuffle's order.

        Raises:
            StateError: stages that disagree (a lane the chunk reader does not hold).
        """
        shuffle = stages.shuffle
        if stages.plan["next_piece"] != shuffle["next_piece"]:
            raise StateError(
                "the plan source and the shuffle disagree on the pieces opened "
                f"({stages.plan['next_piece']} and {shuffle['next_piece']})"
            )
        readers = {lane["piece"]: lane for lane in stages.reader["lanes"]}
        for lane in shuffle["lanes"]:
            if lane["piece"] not in readers:
                raise StateError(f"the chunk reader holds no lane of piece {lane['piece']}")
            yield lane, readers[lane["piece"]]

    @staticmethod
    def _blend(stages: StageStates) -> Blended | None:
        blend = stages.blend
        return None if blend is None else (tuple(blend["drawn"]), tuple(blend["credit"]))

    @classmethod
    def position(cls, stages: StageStates) -> Position:
        """Where the reader is, from its stages' states.

        Raises:
            StateError: stages that disagree (a lane the chunk reader does not hold).
        """
        lanes = tuple(
            LaneState(
                piece=lane["piece"],
                chunk=reader["chunk"],
                reader_start=reader["reader_start"],
                returned_before=reader["returned_before"],
                returned=reader.get("returned"),
                remaining=tuple(lane["remaining"]),
            )
            for lane, reader in cls._lanes(stages)
        )
        shuffle = stages.shuffle
        return Position(
            draws=shuffle["draws"],
            next_piece=shuffle["next_piece"],
            emitted=stages.emit["emitted"],
            lanes=lanes,
            blend=cls._blend(stages),
        )

    def build(self, stages: StageStates, position: Position | None = None) -> ReaderState:
        """The reader's state, from its stages' states (at ``position``, if given, instead
        of the stages')."""
        plan = stages.plan
        n_shards = len(self.settings.shards)
        return ReaderState(
            self.identity,
            plan["epoch"],
            self.topology,
            plan["lineage"],
            tuple(segment_from_json(s, n_shards) for s in plan["assignment"]),
            self.position(stages) if position is None else position,
        )

    def save(self, stages: StageStates) -> dict[str, Any]:
        """The reader's state as plain JSON data: ``state_dict()``'s layout, equal to
        ``build(stages).to_dict()``.

        The shuffle's lists of undrawn samples become the state's own, uncopied (a list
        of tens of thousands of samples costs more to copy than the rest of the state):
        give stage states made for this call, as :meth:`~._run.EpochRun.stages` and a
        shuffle snapshot's ``state()`` make them, and keep no other reference to them.
        """
        out = self.build(stages, Position()).to_dict()  # "position" last: replaced below
        lanes = [
            lane_dict(
                lane["piece"],
                reader["chunk"],
                reader["reader_start"],
                reader["returned_before"],
                reader.get("returned"),
                _owned_list(lane["remaining"]),
            )
            for lane, reader in self._lanes(stages)
        ]
        shuffle = stages.shuffle
        out["position"] = position_dict(
            shuffle["draws"],
            shuffle["next_piece"],
            stages.emit["emitted"],
            lanes,
            self._blend(stages),
        )
        return out

    def at(self, start: Start) -> dict[str, Any]:
        """The state of a reader that has not begun: at ``start``, plain JSON data."""
        return ReaderState(
            self.identity,
            start.epoch,
            self.topology,
            start.lineage,
            start.assignment,
            start.position or Position(),
        ).to_dict()

    def load(self, data: Any) -> ReaderState:
        """A saved state, read and checked (older versions converted).

        Raises:
            StateError: not a state, another version, dataset or configuration, or
                corrupted; the message says which.
        """
        return ReaderState.from_dict(data, self.settings)

    def adopted(self, data: Any) -> StreamSettings:
        """The settings to load ``data`` with: these, or, where the order leaves the block
        unset (``OrderConfig.block_bytes=None``), these with the block the states were
        saved with. The block is part of the order, but a chunk size given only as a
        fetch setting is tuning: a checkpoint then resumes under any chunk size, its
        blocks read by GETs of the new size."""
        order = self.settings.order
        if order.block_bytes is not None:
            return self.settings
        saved = {state.get("chunk_bytes") for state in _found(data)}
        if len(saved) != 1:
            return self.settings  # none, or several: load_all says what is wrong
        block = saved.pop()
        if (
            isinstance(block, bool)
            or not isinstance(block, int)
            or block < 1
            or block == self.settings.chunk_bytes
        ):
            return self.settings
        return replace(self.settings, order=replace(order, block_bytes=block))

    def load_all(self, data: Any) -> list[ReaderState]:
        """Every reader state of one save inside ``data`` (a state, a list of them, or a
        loader's state that holds them: :func:`~._state.find_states`), read and checked.

        Raises:
            StateError: no state found, a state :meth:`load` refuses, or states of
                different epochs.
        """
        found = _found(data)
        if not found:
            raise StateError(
                f"no ShardStream state in the {type(data).__name__} given to load_state_dict"
            )
        states = [self.load(state) for state in found]
        epochs = {state.epoch for state in states}
        if len(epochs) > 1:
            raise StateError(
                f"the states come from different epochs {sorted(epochs)}; pass one save's"
            )
        return states

    @staticmethod
    def split(start: Start, position: Position | None) -> StageStates:
        """The state each stage restores from, for a reader starting at ``start`` at a
        saved ``position`` (``None``: the start of its assignment)."""
        position = position if position is not None else Position()
        plan = {
            "epoch": start.epoch,
            "lineage": start.lineage,
            "assignment": [segment_to_json(s) for s in start.assignment],
            "next_piece": position.next_piece,
        }
        reader = {
            "lanes": [
                {
                    "piece": lane.piece,
                    "chunk": lane.chunk,
                    "reader_start": lane.reader_start,
                    "returned_before": lane.returned_before,
                    **({} if lane.returned is None else {"returned": lane.returned}),
                }
                for lane in position.lanes
            ]
        }
        shuffle = {
            "draws": position.draws,
            "next_piece": position.next_piece,
            "lanes": [
                {"piece": lane.piece, "remaining": list(lane.remaining)} for lane in position.lanes
            ],
        }
        blend = None
        if position.blend is not None:
            blend = {"drawn": list(position.blend[0]), "credit": list(position.blend[1])}
        return StageStates(plan, reader, shuffle, blend, {"emitted": position.emitted})


class StateSnapshot:
    """A reader's state as it was when taken, made into ``state_dict()``'s dict only when
    asked (:meth:`to_dict`): taken before every batch by a loader that hands out the state
    of one batch now and then, it costs a few microseconds where the dict would copy every
    open lane's undrawn samples (see :meth:`~asyncstream.ShardStream.state_snapshot`).

    It never changes as the stream goes on, and :meth:`to_dict` may be called in any
    thread, any number of times.

    Args:
        topology: the reader's, for the repr.
        make: makes the dict, anew each call, from what never changes.
    """

    __slots__ = ("_make", "_topology")

    def __init__(self, topology: Topology, make: Callable[[], dict[str, Any]]) -> None:
        self._topology = topology
        self._make = make

    def to_dict(self) -> dict[str, Any]:
        """The state as ``state_dict()`` returned it when the snapshot was taken: equal
        value for value, a new dict (and new lists) each call."""
        return self._make()

    def __repr__(self) -> str:
        return f"<StateSnapshot of reader {self._topology}>"


def _owned_list(remaining: Any) -> list[Any]:
    """``remaining`` itself where it is a list (the caller gave it away), else a list."""
    return remaining if type(remaining) is list else list(remaining)


def _found(data: Any) -> list[dict[str, Any]]:
    """The reader states inside ``data`` (:func:`~._state.find_states`), else ``data``
    itself where it is a dict (parsing it says what it lacks)."""
    found = list(find_states(data))
    return found or ([data] if isinstance(data, dict) else [])
