"""Which epoch, and which loaded state, the next iteration of a stream reads.

The rules, in one place (the README's "Epochs" and "A loaded state is never lost in
silence"):

* Without :meth:`ShardStream.set_epoch`, each iteration reads the epoch after the one its
  reader slot (the DataLoader worker, or the main process) began last
  (:class:`._workers.SharedEpoch`); ``set_epoch(e)`` chooses ``e`` for each slot's next
  iteration. An iteration *begins* with its first sample (:class:`Claim`, committed by
  :meth:`Pending.begin`): one made and dropped unread changes nothing.
* A state loaded by ``load_state_dict`` (:class:`Pending`) is resumed by the next
  iteration unless ``set_epoch`` chose another epoch for it: then :class:`StateError`,
  naming both. A state with nothing left counts its epoch as read, and its pass is
  empty unless ``set_epoch`` chose another epoch.
* A state loaded in the main process reaches DataLoader workers in their copy of the
  stream; each worker slot spends it once (``SharedEpoch.use``), so a later DataLoader
  iteration's copies start fresh. A state a worker's copy loaded itself (torchdata's
  StatefulDataLoader does that) is that copy's own (mark :data:`._workers.LOCAL`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from .._exceptions import StateError
from ..order._plan import Topology
from ._state import ReaderState, Start, finished, fresh, left_in, resume
from ._workers import LOCAL, SharedEpoch

if TYPE_CHECKING:
    from ._settings import StreamSettings

__all__ = ["Claim", "Pending"]


@dataclass(frozen=True)
class Claim:
    """What an iteration commits when it begins (its first sample): the epoch its reader
    slot began, and the loaded state it spent (``"own"``: the stream's own, ``"shared"``:
    the main process's, seen by a worker's copy; ``None``: none)."""

    slot: int
    width: int
    epoch: int
    rebased: bool = False
    spends: Literal["own", "shared"] | None = None


class Pending:
    """The states ``load_state_dict`` left for the next iteration, and their mark: the
    load's number in the main process (published in the shared cells), or ``LOCAL`` in a
    worker's copy that loaded them itself."""

    def __init__(self) -> None:
        self.states: list[ReaderState] | None = None
        self.mark = 0

    def load(self, states: list[ReaderState], mark: int) -> None:
        self.states, self.mark = states, mark

    def unspent(
        self, shared: SharedEpoch, topology: Topology | None = None
    ) -> list[ReaderState] | None:
        """The loaded states the next iteration resumes, if any: the stream's own (or its
        worker copy's), or the main process's as a DataLoader worker's copy sees them
        (``topology``: the worker's)."""
        states, mark = self.states, self.mark
        if states is None or mark == LOCAL:
            return states
        if shared.owned or topology is None:
            return None if shared.used_by_any(mark) else states
        if mark != shared.mark or shared.spent(topology.worker, topology.num_workers, mark):
            return None
        return states

    def next_start(
        self, shared: SharedEpoch, settings: StreamSettings, topology: Topology
    ) -> tuple[Start, Claim | None]:
        """Where the next iteration starts, and what it commits when it begins (none for
        an empty pass).

        Raises:
            StateError: the state does not fit this reader (see :func:`._state.resume`),
                set_epoch chose another epoch than the loaded state's, or the main process
                loaded a state after this worker was started.
        """
        slot, width, mark = topology.worker, topology.num_workers, shared.mark
        if (
            not (shared.owned or self.mark == LOCAL or mark == 0)
            and self.mark != mark
            and not shared.used_by_any(mark)
        ):
            raise StateError(
                "load_state_dict() was called after this DataLoader's persistent workers "
                "had started, and a state cannot reach them: create the DataLoader after "
                "load_state_dict(), or use persistent_workers=False"
            )
        states = self.unspent(shared, topology)
        spends: Literal["own", "shared"] = "own" if shared.owned or self.mark == LOCAL else "shared"
        epoch, pinned, rebased = shared.next_epoch(slot, width)
        if states is not None:
            start = resume(states, settings, topology)
            left = left_in(start)
            if left == 0:  # saved at the end of its epoch: that epoch is read
                self.spend(shared, spends, slot)
                shared.finished(slot, width, start.epoch)
                if not pinned or epoch == start.epoch:
                    return start, None  # an empty pass, as torchdata's own ended state
            elif pinned and epoch != start.epoch:
                raise StateError(
                    f"a state of epoch {start.epoch} was loaded ({left} samples of it left "
                    f"to this reader) and set_epoch({epoch}) asks for epoch {epoch}: call "
                    f"set_epoch({start.epoch}), or none, to resume it; to start epoch "
                    f"{epoch} instead, use a stream that did not load the state"
                )
            else:
                return start, Claim(slot, width, start.epoch, spends=spends)
        elif pinned and shared.last(slot) == epoch:
            return finished(settings, epoch, topology), None  # the loaded end, kept
        return fresh(settings, epoch, topology), Claim(slot, width, epoch, rebased)

    def spend(
        self, shared: SharedEpoch, spends: Literal["own", "shared"] | None, slot: int
    ) -> None:
        """The states were resumed by reader ``slot``."""
        if spends == "own" and self.mark == LOCAL:
            self.states = None
        elif spends is not None:
            shared.use(slot, self.mark)

    def begin(self, shared: SharedEpoch, claim: Claim) -> None:
        """The iteration :meth:`next_start` made drew its first sample."""
        shared.begin(claim.slot, claim.width, claim.epoch, rebased=claim.rebased)
        self.spend(shared, claim.spends, claim.slot)
