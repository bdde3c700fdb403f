"""The stream's saved state: its typed form, its layout and versions, and resume.

:class:`~._checkpoint.Checkpoint` is the one object that builds a reader's state from its
stages' states and splits it back into them; this module holds what it builds with. A
:class:`ReaderState` is the position of one reader (one rank, or one DataLoader worker
of a rank) in one epoch:

* **identity**: the dataset's fingerprint (its shards' relative names, sizes and counts,
  not where they live: :mod:`._dataset_id`, described beside it as ``dataset_shards``)
  and every setting that decides the order (seed, shuffle, mode, window, chunk size,
  remainder policy and, for a mixed stream, each source's name, shards and quota); a
  state of another dataset or configuration is refused, saying what differs;
* **where the reader sits**: epoch, topology (rank, world size, worker, workers) and
  *lineage*: ``"base"`` for the epoch's own plan, else a digest naming the resume it
  descends from (below);
* **its assignment**: the segments of the epoch it reads (:mod:`._plan`), explicit, so
  a state says what is left without the plan being recomputed;
* **its position** in them (:mod:`._position`): draws so far, pieces opened, each open
  lane's resident chunk and not-yet-drawn samples, and for a mixed stream the blend's
  samples drawn and credit per source (:mod:`._mix`).

``to_dict`` gives plain JSON data (``"version": 3``); ``from_dict`` checks every field and
names what is wrong (:class:`~asyncstream.StateError`), reads versions 2 (before mixing:
a stream without sources) and 1 (asyncstream 0.1's layout: the same position, assignment
implied by the plan), and refuses any other.

**Resume** (:func:`resume`). Given the states of the readers of one save:

* onto the same topology, each reader takes its own state and continues exactly where it
  was (same samples, same order as the uninterrupted run);
* onto another one (more or fewer ranks, more or fewer workers), the states of *all* old
  readers are merged into what is left of the epoch: for each old reader, in (rank,
  worker) order, the undrawn samples of its open lanes (each a :class:`~._plan.Piece` that
  starts reading at the lane's saved byte offset) and then the pieces it had not opened.
  That list is split over the new topology with the same arithmetic as a fresh epoch
  (:func:`~._plan.assign`: equal, contiguous shares per rank, then per worker, the
  remainder policy for what does not divide), under a new lineage, a digest of the old
  states and the new world size, which also keys the new readers' shuffle. Every sample
  read before the save, plus every sample read after it, is the epoch exactly once (with
  ``"drop"``, less what does not divide by the new world size).

Why not MosaicML's canonical nodes (a fixed number of logical readers mapped onto the
physical ones)? With a window shuffle, a logical reader's position is a set of open
shards with a few hundred undrawn samples each, which is cheap to hand to another reader
as explicit pieces; fixing the number of logical readers up front would instead fix how
finely the epoch can be split, and a physical reader serving several logical ones would
need one window (and its ring memory) per logical reader. The cost of our way: after a
resume onto another topology, the rest of the epoch keeps the old plan's shard order (each
new reader window-shuffles its own contiguous share of it), and a shard whose samples are
split between new readers is read by each of them.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from .._exceptions import StateError
from ..order._mix import mixed_entries
from ..order._plan import (
    EpochSequence,
    Piece,
    Remainder,
    Segment,
    Span,
    Topology,
    assign,
    cut,
    shard_order,
)
from ..order._position import LaneState, Position
from ..order._position import corrupted as _bad
from ..order._position import int_field as _int
from ..order._position import int_list as _ints
from ._dataset_id import DatasetId, difference

if TYPE_CHECKING:
    from ._settings import StreamSettings

__all__ = [
    "STATE_KIND",
    "STATE_VERSION",
    "Identity",
    "LaneState",
    "Position",
    "ReaderState",
    "Start",
    "base_assignment",
    "epoch_sequence",
    "find_states",
    "finished",
    "fresh",
    "left_in",
    "resume",
    "segment_from_json",
    "segment_to_json",
]

STATE_KIND = "asyncstream.ShardStream"
STATE_VERSION = 3
_READABLE = (1, 2, 3)
BASE = "base"
_DIGEST = re.compile(r"[0-9a-f]{16,64}")


# Why the block is in the identity (see docs/configuration.md). The identity keeps its
# old key, chunk_bytes (states of every version carry it), said as block_bytes.
_WHY = {
    "chunk_bytes": (
        ": the window shuffle draws from each open shard's resident block, so the block "
        "is part of the order; leave OrderConfig.block_bytes unset to resume with the "
        "state's block (under any FetchConfig.chunk_bytes), or set it as saved"
    )
}
_SHOWN = {"chunk_bytes": "block_bytes"}


@dataclass(frozen=True)
class Identity:
    """What a state must share with the stream that loads it."""

    dataset: str
    seed: int
    shuffle: bool
    mode: str
    window: int
    chunk_bytes: int
    remainder: Remainder
    sources: tuple[tuple[str, int, int], ...] = ()  # (name, shards, quota) of each source
    # The dataset's older fingerprint (accepted) and description (:mod:`._dataset_id`).
    dataset_id: DatasetId | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, settings: StreamSettings) -> Identity:
        """The identity of a stream's settings."""
        return cls(
            dataset=settings.fingerprint(),
            seed=settings.seed,
            shuffle=settings.shuffle,
            mode=settings.mode,
            window=settings.window,
            chunk_bytes=settings.chunk_bytes,
            remainder=settings.remainder,
            sources=tuple((s.name, s.stop - s.first, s.quota) for s in settings.sources),
            dataset_id=settings.dataset_id,
        )

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON data, as a state holds it."""
        out: dict[str, Any] = dict(self.__dict__)
        del out["dataset_id"]
        out["sources"] = [{"name": n, "shards": k, "quota": q} for n, k, q in self.sources]
        return out

    def described(self) -> dict[str, Any]:
        """``{"dataset_shards": ...}``, the dataset's description, where known."""
        if self.dataset_id is None:
            return {}
        return {"dataset_shards": self.dataset_id.description()}

    def check(self, data: Mapping[str, Any]) -> None:
        """Refuse state data that does not carry this identity, naming the difference."""
        for name, value in self.as_dict().items():
            if name not in data:
                raise StateError(
                    f"state_dict has no {name!r}: not a ShardStream state, or corrupted"
                )
            if name == "dataset" and self.dataset_id is not None:
                if not self.dataset_id.accepts(data[name]):
                    raise StateError(difference(data.get("dataset_shards"), self.dataset_id))
            elif data[name] != value:
                shown = _SHOWN.get(name, name)
                what = "another dataset" if name == "dataset" else f"{shown}={data[name]!r}"
                why = _WHY.get(name, "")
                raise StateError(
                    f"state_dict was saved from {what}, this stream has {shown}={value!r}{why}"
                )


def segment_to_json(segment: Segment) -> list[Any]:
    """A segment of an assignment as plain data: ``["span", lo, hi]`` or ``["piece", ...]``."""
    if isinstance(segment, Span):
        return ["span", segment.lo, segment.hi]
    p = segment
    return ["piece", p.shard, p.first, p.stop, list(p.take), p.offset, p.index0]


def segment_from_json(data: Any, n_shards: int) -> Segment:
    """Parse and check a segment saved by :func:`segment_to_json`."""
    if isinstance(data, list) and data[:1] == ["span"] and len(data) == 3:
        lo, hi = _ints(data[1:], "a span")
        if lo > hi:
            raise _bad("a span runs backwards")
        return Span(lo, hi)
    if isinstance(data, list) and data[:1] == ["piece"] and len(data) == 7:
        shard, first, stop = _ints(data[1:4], "a piece")
        take = _ints(data[4], "a piece's take")
        offset, index0 = _ints(data[5:], "a piece")
        if shard >= n_shards or list(take) != sorted(set(take)) or offset % 512:
            raise _bad("a piece names no shard of this dataset, or is malformed")
        if take and not (index0 <= take[0] and take[-1] < first):
            raise _bad("a piece's take is outside its range")
        return Piece(shard, first, stop, take, offset, index0)
    raise _bad(f"not a segment: {data!r}"[:200])


@dataclass(frozen=True)
class ReaderState:
    """The position of one reader in one epoch (see the module docstring)."""

    identity: Identity
    epoch: int
    topology: Topology
    lineage: str
    assignment: tuple[Segment, ...]
    position: Position

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data, ``state_dict()``'s layout."""
        t = self.topology
        return {
            "kind": STATE_KIND,
            "version": STATE_VERSION,
            **self.identity.as_dict(),
            "epoch": self.epoch,
            "topology": [t.rank, t.world_size, t.worker, t.num_workers],
            "lineage": self.lineage,
            "assignment": [segment_to_json(s) for s in self.assignment],
            "position": self.position.to_dict(),
            **self.identity.described(),
        }

    @classmethod
    def from_dict(cls, data: Any, settings: StreamSettings) -> ReaderState:
        """Parse a state saved by :meth:`to_dict` (or by asyncstream 0.1), checking it.

        Raises:
            StateError: not a state, another version, dataset or configuration, or
                corrupted; the message says which.
        """
        if not isinstance(data, dict):
            raise StateError(f"a state_dict must be a dict, got {type(data).__name__}")
        try:
            json.dumps(data)
        except (TypeError, ValueError) as exc:
            raise StateError(f"state_dict is not plain JSON data: {exc}") from exc
        if "version" not in data:
            raise StateError("state_dict has no 'version': not a ShardStream state, or corrupted")
        version = data["version"]
        if version not in _READABLE:
            raise StateError(
                f"state_dict has version {version!r}; this asyncstream reads versions "
                f"{', '.join(map(str, _READABLE))} (saved by a newer asyncstream?)"
            )
        if version < 3:  # saved before mixing: by a stream without sources
            data = {**data, "sources": []}
        identity = Identity.of(settings)
        identity.check(data)
        epoch = _int(data, "epoch", "")
        raw = data.get("topology")
        if not (isinstance(raw, list) and len(raw) == 4):
            raise _bad("topology must be [rank, world_size, worker, num_workers]")
        try:
            topology = Topology(*_ints(raw, "topology"))
        except ValueError as exc:
            raise _bad(f"topology: {exc}") from None
        position = Position.from_dict(data.get("position"), settings.window, len(settings.sources))
        if version == 1:
            lineage = BASE
            assignment = base_assignment(settings, epoch, topology)
        else:
            raw_lineage = data.get("lineage")
            if not isinstance(raw_lineage, str) or not (
                raw_lineage == BASE or _DIGEST.fullmatch(raw_lineage)
            ):
                raise _bad(f"lineage must be {BASE!r} or a hex digest, got {raw_lineage!r}")
            lineage = raw_lineage
            segments = data.get("assignment")
            if not isinstance(segments, list):
                raise _bad("assignment must be a list of segments")
            n = len(settings.shards)
            assignment = tuple(segment_from_json(s, n) for s in segments)
            if lineage == BASE and assignment != base_assignment(settings, epoch, topology):
                raise _bad("the assignment is not this epoch's plan for this reader")
        state = cls(identity, epoch, topology, lineage, assignment, position)
        state.sequence(settings)  # spans must lie in the epoch
        return state

    def sequence(self, settings: StreamSettings) -> EpochSequence:
        """The epoch's sample sequence (checks that the assignment lies within it)."""
        sequence = epoch_sequence(settings, self.epoch)
        for segment in self.assignment:
            if isinstance(segment, Span) and segment.hi > sequence.total:
                raise _bad("a span passes the end of the epoch")
            if isinstance(segment, Piece) and segment.stop > settings.counts[segment.shard]:
                raise _bad("a piece passes the end of its shard")
        return sequence

    def digest(self) -> str:
        """A digest of the whole state."""
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def left(self, settings: StreamSettings) -> list[Segment]:
        """What this reader has not read yet: its open lanes' undrawn samples, then the
        pieces it has not opened, as segments."""
        pieces = self.sequence(settings).pieces(self.assignment)
        p = self.position
        if p.next_piece > len(pieces):
            raise _bad("next_piece is past the reader's pieces")
        out: list[Segment] = []
        for lane in p.lanes:
            if lane.returned is None:
                raise StateError(
                    "a version 1 state (asyncstream 0.1) resumes onto the same topology "
                    "only: it does not record where its open shards' samples end"
                )
            piece = pieces[lane.piece]
            later = (i for i in piece.take if i >= lane.returned)
            take = tuple(sorted({*lane.remaining, *later}))
            first, stop = max(piece.first, lane.returned), piece.stop
            if first >= stop:  # nothing after the resident chunk: end at the last taken
                first = stop = take[-1] + 1 if take else first
            if take or stop > first:
                out.append(
                    Piece(piece.shard, first, stop, take, lane.reader_start, lane.returned_before)
                )
        opened = sum(pieces[i].count for i in range(p.next_piece))
        total = sum(s.count for s in self.assignment)
        out.extend(cut(self.assignment, opened, total))
        return out


def epoch_sequence(settings: StreamSettings, epoch: int) -> EpochSequence:
    """The epoch's global sample sequence for a stream's settings: its sources'
    interleaved pieces for a mixed stream (:mod:`._mix`)."""
    if settings.sources:
        entries = mixed_entries(
            settings.counts,
            settings.sources,
            seed=settings.seed,
            epoch=epoch,
            shuffle=settings.shuffle,
        )
        return EpochSequence(settings.counts, entries=entries)
    order = shard_order(
        len(settings.counts), seed=settings.seed, epoch=epoch, shuffle=settings.shuffle
    )
    return EpochSequence(settings.counts, order)


def base_assignment(
    settings: StreamSettings, epoch: int, topology: Topology
) -> tuple[Segment, ...]:
    """A reader's segments in the epoch's own plan."""
    return fresh(settings, epoch, topology).assignment


@dataclass(frozen=True)
class Start:
    """Where a reader starts an epoch.

    Attributes:
        epoch: the epoch.
        lineage: ``"base"``, or the digest of the resume the assignment comes from.
        assignment: the reader's segments.
        position: the position in them (``None``: the start).
        extra: samples this rank drops or repeats (the remainder policy).
    """

    epoch: int
    lineage: str
    assignment: tuple[Segment, ...]
    position: Position | None
    extra: int


def fresh(settings: StreamSettings, epoch: int, topology: Topology) -> Start:
    """The start of a fresh epoch."""
    total = settings.epoch_samples
    segments, extra = assign([Span(0, total)], topology, settings.remainder)
    return Start(epoch, BASE, tuple(segments), None, extra)


def finished(settings: StreamSettings, epoch: int, topology: Topology) -> Start:
    """A reader at the end of its share of ``epoch``: nothing left to draw."""
    start = fresh(settings, epoch, topology)
    pieces = epoch_sequence(settings, epoch).pieces(start.assignment)
    total = sum(segment.count for segment in start.assignment)
    return replace(start, position=Position(total, len(pieces), total))


def left_in(start: Start) -> int:
    """Samples a reader starting at ``start`` has left to draw."""
    drawn = start.position.draws if start.position is not None else 0
    return sum(segment.count for segment in start.assignment) - drawn


def resume(states: Sequence[ReaderState], settings: StreamSettings, topology: Topology) -> Start:
    """Where ``topology``'s reader continues from the states of one save (module docs).

    Raises:
        StateError: the states do not come from one save of one epoch, or (for another
            topology) do not cover every old reader exactly once.
    """
    if not states:
        raise StateError("no state to resume from")
    first = states[0]
    for state in states[1:]:
        if (state.epoch, state.lineage) != (first.epoch, first.lineage):
            raise StateError(
                "the states come from different epochs or resumes "
                f"(epoch {first.epoch} and {state.epoch}); pass the states of one save"
            )
    shapes = {(s.topology.world_size, s.topology.num_workers) for s in states}
    if len(shapes) > 1:
        raise StateError(
            f"the states come from readers of different topologies {sorted(shapes)}; pass "
            "the states of one save"
        )
    ((world, workers),) = shapes
    if (world, workers) == (topology.world_size, topology.num_workers):
        own = [s for s in states if s.topology == topology]
        if not own:
            raise StateError(f"no state of this reader ({topology}) among the states given")
        if any(s != own[0] for s in own[1:]):
            raise StateError(f"two different states of this reader ({topology})")
        mine = own[0]
        extra = _extra(settings, mine)
        return Start(mine.epoch, mine.lineage, mine.assignment, mine.position, extra)
    by_reader: dict[tuple[int, int], ReaderState] = {}
    for state in states:
        key = (state.topology.rank, state.topology.worker)
        if key in by_reader and by_reader[key] != state:
            raise StateError(f"two different states of reader {state.topology}")
        by_reader[key] = state
    missing = [
        f"rank {r} worker {w}"
        for r in range(world)
        for w in range(workers)
        if (r, w) not in by_reader
    ]
    if missing:
        raise StateError(
            f"resuming onto another topology ({topology.world_size} ranks x "
            f"{topology.num_workers} workers) needs the states of all {world * workers} "
            f"readers of the save ({world} ranks x {workers} workers); missing: "
            + ", ".join(missing[:8])
            + (" ..." if len(missing) > 8 else "")
        )
    left: list[Segment] = []
    for key in sorted(by_reader):
        left.extend(by_reader[key].left(settings))
    digest = hashlib.sha256(
        "\n".join(
            [first.lineage, str(first.epoch), str(topology.world_size)]
            + [by_reader[k].digest() for k in sorted(by_reader)]
        ).encode()
    ).hexdigest()[:24]
    segments, extra = assign(left, topology, settings.remainder)
    return Start(first.epoch, digest, tuple(segments), None, extra)


def _extra(settings: StreamSettings, state: ReaderState) -> int:
    if state.lineage != BASE:
        return 0  # reported by the reader that made the resume; not kept in the state
    return fresh(settings, state.epoch, state.topology).extra


def find_states(data: Any) -> Iterator[dict[str, Any]]:
    """Every ShardStream state inside ``data``: a state itself, a list of them, or the
    state of a loader that holds them (``StatefulDataLoader``: one per worker, under
    ``dataset_state``; ``DALIImageLoader``: under ``stream``), found by their shape."""
    if isinstance(data, dict):
        if data.get("kind") == STATE_KIND or ("position" in data and "dataset" in data):
            yield data
            return
        steps = data.get("_steps_since_snapshot")
        if isinstance(steps, int) and steps > 0:
            raise StateError(
                "a StatefulDataLoader state taken between snapshots "
                f"({steps} steps since the last one) cannot resume exactly: use "
                "snapshot_every_n_steps=1 (the default)"
            )
        for value in data.values():
            yield from find_states(value)
    elif isinstance(data, list | tuple):
        for value in data:
            yield from find_states(value)
