"""The epoch plan: which samples of which shards one reader reads, in which order.

Pure functions of their inputs (sample counts, seed, epoch, topology, saved positions).

**The epoch's sequence.** The shards are permuted with a generator seeded by ``(seed,
epoch)`` (or kept in order without shuffle) and concatenated: the epoch's global sample
sequence. A position ``p`` in it names one sample. A stream of several sources
(:mod:`._mix`) has a sequence of shard *pieces* instead (a shard may be cut, or come
twice); everything below works on either.

**Segments.** What a reader reads is an *assignment*: a list of segments, read in order.
A :class:`Span` is a range of positions of the epoch's sequence; a :class:`Piece` is an
explicit set of samples of one shard (used for what is left of a shard that a reader had
open when its state was saved). Both count their samples, can be cut at any sample, and
expand to pieces, the unit the stream opens one at a time.

**Splitting.** :func:`assign` splits an ordered list of segments into equal, contiguous
ranges for the ranks (DDP needs equal steps) and again for each rank's DataLoader workers
(sizes differ by at most one). When the total does not divide by the world size, the
**remainder policy** decides: ``"drop"`` (default) leaves out the last ``total %
world_size`` samples of the list (different samples each epoch when shuffled), ``"pad"``
repeats the first few samples of the list to fill the last ranks. Either way the count is
reported in the stream's stats. A fresh epoch is ``assign([Span(0, total)])``
(:func:`epoch_plan`); an epoch resumed onto another topology is ``assign`` of what every
old reader had left (see :mod:`asyncstream.stream._state`), so the same arithmetic serves both.

Exactly once: the ranges of all (rank, worker) pairs tile the list, so with ``"drop"``
every sample but the dropped remainder is read once, and with a total that divides by the
world size, every sample is read exactly once. Only the pieces at the ends of a range are
partial shards.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "EpochSequence",
    "Piece",
    "Segment",
    "Span",
    "Topology",
    "assign",
    "cut",
    "epoch_plan",
    "reader_samples",
    "shard_order",
]

Remainder = Literal["drop", "pad"]


@dataclass(frozen=True)
class Topology:
    """Where this reader sits: its rank among ``world_size``, its worker among ``num_workers``."""

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"need 0 <= rank < world_size, got {self.rank} and {self.world_size}")
        if self.num_workers < 1 or not 0 <= self.worker < self.num_workers:
            raise ValueError(
                f"need 0 <= worker < num_workers, got {self.worker} and {self.num_workers}"
            )

    def __str__(self) -> str:
        return f"rank {self.rank} of {self.world_size}, worker {self.worker} of {self.num_workers}"


@dataclass(frozen=True)
class Piece:
    """Samples of shard number ``shard`` that one reader reads, in in-shard order.

    The samples are those of ``take`` (ascending in-shard indices, each below ``first``),
    then every sample ``first <= i < stop``. Reading starts at byte ``offset`` of the
    shard, the header of sample ``index0`` (``0, 0``: the shard's start); samples from
    ``index0`` on that are not wanted are read past. A piece of a fresh plan has no
    ``take`` and starts at the shard's start.
    """

    shard: int
    first: int
    stop: int
    take: tuple[int, ...] = ()
    offset: int = 0
    index0: int = 0

    @property
    def count(self) -> int:
        """Samples in the piece."""
        return len(self.take) + max(0, self.stop - self.first)

    def wants(self, index: int) -> bool:
        """Whether in-shard sample ``index`` belongs to the piece."""
        if self.first <= index < self.stop:
            return True
        at = bisect.bisect_left(self.take, index)
        return at < len(self.take) and self.take[at] == index


@dataclass(frozen=True)
class Span:
    """Positions ``lo <= p < hi`` of the epoch's sample sequence."""

    lo: int
    hi: int

    @property
    def count(self) -> int:
        """Samples in the span."""
        return self.hi - self.lo


Segment = Span | Piece


def shard_order(n_shards: int, *, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """The epoch's shard permutation (the identity without shuffle)."""
    order = list(range(n_shards))
    if shuffle:
        random.Random(f"asyncstream:{seed}:{epoch}").shuffle(order)
    return order


class EpochSequence:
    """The epoch's global sample sequence: shards in the epoch's order, concatenated.

    Args:
        counts: samples in each shard, in dataset order.
        order: the epoch's shard order (:func:`shard_order`).
        entries: instead of ``order``, the epoch's pieces of shards in order, as
            ``(shard, first, stop)`` (samples ``first <= i < stop`` of the shard): a
            mixed stream's interleaved sources (:mod:`._mix`), where a shard may be cut
            or come more than once.
    """

    def __init__(
        self,
        counts: Sequence[int],
        order: Sequence[int] = (),
        *,
        entries: Sequence[tuple[int, int, int]] | None = None,
    ) -> None:
        if any(n < 0 for n in counts):
            raise ValueError("sample counts must be >= 0")
        self.counts = counts
        if entries is None:
            entries = [(shard, 0, counts[shard]) for shard in order]
        self.entries = entries
        self.starts = [0]  # position of each entry, then the total
        for _, first, stop in entries:
            self.starts.append(self.starts[-1] + stop - first)

    @property
    def total(self) -> int:
        """Samples in the epoch."""
        return self.starts[-1]

    def pieces(self, segments: Iterable[Segment]) -> list[Piece]:
        """The pieces a list of segments reads, in order (spans cut at entry boundaries)."""
        out: list[Piece] = []
        for segment in segments:
            if isinstance(segment, Piece):
                if segment.count:
                    out.append(segment)
                continue
            lo, hi = segment.lo, segment.hi
            if not 0 <= lo <= hi <= self.total:
                raise ValueError(f"span {lo}..{hi} is outside the epoch's {self.total} samples")
            at = bisect.bisect_right(self.starts, lo) - 1
            while lo < hi:
                (shard, first, _), start = self.entries[at], self.starts[at]
                stop = min(hi, self.starts[at + 1])
                if stop > lo:
                    out.append(Piece(shard, first + lo - start, first + stop - start))
                lo = stop
                at += 1
        return out


def _cut_piece(piece: Piece, k: int) -> tuple[Piece, Piece]:
    """The piece's first ``k`` samples, and the rest (``0 < k < piece.count``)."""
    take = piece.take
    if k <= len(take):
        end = take[k - 1] + 1  # the head ends at its last sample: nothing read past it
        head = Piece(piece.shard, end, end, take[:k], piece.offset, piece.index0)
        tail = Piece(piece.shard, piece.first, piece.stop, take[k:], piece.offset, piece.index0)
    else:
        mid = piece.first + k - len(take)
        head = Piece(piece.shard, piece.first, mid, take, piece.offset, piece.index0)
        tail = Piece(piece.shard, mid, piece.stop, (), piece.offset, piece.index0)
    return head, tail


def cut(segments: Sequence[Segment], lo: int, hi: int) -> list[Segment]:
    """Samples ``lo <= i < hi`` of the segments' concatenation, as segments.

    ``hi`` may pass the end: the concatenation repeats from its start (the ``"pad"``
    policy), as often as needed.
    """
    total = sum(s.count for s in segments)
    out: list[Segment] = []
    if total == 0:
        return out
    while lo < hi:
        base = lo - lo % total
        out.extend(_cut_once(segments, lo - base, min(hi - base, total)))
        lo = min(hi, base + total)
    return out


def _cut_once(segments: Sequence[Segment], lo: int, hi: int) -> list[Segment]:
    out: list[Segment] = []
    position = 0
    for segment in segments:
        n = segment.count
        a, b = max(lo - position, 0), min(hi - position, n)
        position += n
        if a >= b:
            if position >= hi:
                break
            continue
        if isinstance(segment, Span):
            out.append(Span(segment.lo + a, segment.lo + b))
        else:
            part = segment
            if b < n:
                part = _cut_piece(part, b)[0]
            if a > 0:
                part = _cut_piece(part, a)[1]
            out.append(part)
        if position >= hi:
            break
    return out


def assign(
    segments: Sequence[Segment], topology: Topology, remainder: Remainder = "drop"
) -> tuple[list[Segment], int]:
    """This reader's share of an ordered list of segments.

    Args:
        segments: what is to be read, in order (a fresh epoch: ``[Span(0, total)]``).
        topology: rank, world size, worker, number of workers.
        remainder: ``"drop"`` or ``"pad"`` (see the module docstring).

    Returns:
        The reader's segments, and the number of samples this *rank* drops (``"drop"``,
        counted on the last rank) or repeats (``"pad"``).
    """
    if remainder not in ("drop", "pad"):
        raise ValueError(f"remainder must be 'drop' or 'pad', got {remainder!r}")
    total = sum(s.count for s in segments)
    world = topology.world_size
    if remainder == "drop":
        per_rank = total // world
        extra = total - per_rank * world if topology.rank == world - 1 else 0
    else:
        per_rank = -(-total // world)
        extra = max(0, (topology.rank + 1) * per_rank - total) - max(
            0, topology.rank * per_rank - total
        )
    base, bump = divmod(per_rank, topology.num_workers)
    w = topology.worker
    lo = topology.rank * per_rank + w * base + min(w, bump)
    hi = lo + base + (1 if w < bump else 0)
    return cut(segments, lo, hi), extra


def reader_samples(total: int, topology: Topology, remainder: Remainder = "drop") -> int:
    """Samples a reader (one worker of one rank; all of a rank when ``num_workers`` is 1)
    reads from ``total`` samples split by :func:`assign`."""
    world = topology.world_size
    per_rank = total // world if remainder == "drop" else -(-total // world)
    base, bump = divmod(per_rank, topology.num_workers)
    return base + (1 if topology.worker < bump else 0)


def epoch_plan(
    samples_per_shard: Sequence[int],
    *,
    seed: int,
    epoch: int,
    shuffle: bool,
    topology: Topology,
    remainder: Remainder = "drop",
) -> tuple[list[Piece], int]:
    """The pieces one reader reads in a fresh epoch, in order.

    Args:
        samples_per_shard: samples in each shard, in dataset order.
        seed: the run's seed.
        epoch: the epoch number.
        shuffle: permute the shards.
        topology: rank, world size, worker, number of workers.
        remainder: ``"drop"`` or ``"pad"`` (see the module docstring).

    Returns:
        The pieces, and the number of samples this *rank* drops (``"drop"``, counted on
        the last rank) or repeats (``"pad"``).
    """
    sequence = EpochSequence(
        samples_per_shard,
        shard_order(len(samples_per_shard), seed=seed, epoch=epoch, shuffle=shuffle),
    )
    segments, extra = assign([Span(0, sequence.total)], topology, remainder)
    return sequence.pieces(segments), extra
