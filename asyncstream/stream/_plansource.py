"""The plan source: the pieces one reader reads in its epoch, handed out in plan order.

The first stage of an epoch (:mod:`._run`). Where the reader starts (a fresh epoch's
share, or the share a resume gave it: :class:`~._state.Start`) fixes its assignment, the
segments of the epoch it reads; the plan source cuts them into pieces (:mod:`..order._plan`)
and hands them out one by one as the window opens them. Its state is the assignment and
how many pieces were handed out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._exceptions import StateError
from ..order._plan import Piece
from ._state import Start, epoch_sequence, segment_from_json, segment_to_json

if TYPE_CHECKING:
    from ._settings import StreamSettings

__all__ = ["PlanSource"]


class PlanSource:
    """The reader's pieces, in the order the window opens them.

    Args:
        settings: the stream's settings.
        start: where the reader starts: its epoch, lineage and assignment.
    """

    def __init__(self, settings: StreamSettings, start: Start) -> None:
        self.settings = settings
        self.epoch, self.lineage, self.assignment = start.epoch, start.lineage, start.assignment
        self.pieces: list[Piece] = epoch_sequence(settings, start.epoch).pieces(start.assignment)
        self.next_piece = 0

    def __len__(self) -> int:
        return len(self.pieces)

    def next(self) -> tuple[int, Piece]:
        """The next piece to open, with its position. Raises StopIteration after the last."""
        if self.next_piece >= len(self.pieces):
            raise StopIteration
        position = self.next_piece
        self.next_piece += 1
        return position, self.pieces[position]

    def state(self) -> dict[str, Any]:
        """The plan source's state as plain data: ``epoch``, ``lineage``, ``assignment``
        (the segments this reader reads) and ``next_piece`` (pieces handed out)."""
        return {
            "epoch": self.epoch,
            "lineage": self.lineage,
            "assignment": [segment_to_json(s) for s in self.assignment],
            "next_piece": self.next_piece,
        }

    def reset(self, state: Mapping[str, Any] | None = None) -> None:
        """Back to the first piece (``None``), or continue exactly from a saved :meth:`state`
        (its assignment replaces this one's).

        Raises:
            StateError: a state whose assignment or ``next_piece`` does not fit the epoch.
        """
        if state is None:
            self.next_piece = 0
            return
        n_shards = len(self.settings.shards)
        assignment = tuple(segment_from_json(s, n_shards) for s in state["assignment"])
        try:
            pieces = epoch_sequence(self.settings, state["epoch"]).pieces(assignment)
        except ValueError as exc:
            raise StateError(f"state_dict is corrupted: {exc}") from None
        if not 0 <= state["next_piece"] <= len(pieces):
            raise StateError("state_dict position is corrupted: next_piece is past the plan")
        self.epoch, self.lineage = state["epoch"], state["lineage"]
        self.assignment, self.pieces = assignment, pieces
        self.next_piece = state["next_piece"]
