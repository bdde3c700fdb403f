"""The epoch plan: which samples of which shards one reader reads, in which order.

A pure function of (shard sample counts, seed, epoch, shuffle, rank, world size, worker,
number of workers):

1. The shards are permuted with a generator seeded by ``(seed, epoch)`` (or kept in order
   without shuffle). Concatenated, they give the epoch's global sample sequence.
2. Ranks get equal, contiguous ranges of that sequence, so every rank takes the same
   number of steps. When the total does not divide by the world size, the **remainder
   policy** decides: ``"drop"`` (default) leaves out the last ``total % world_size``
   samples of the sequence (different samples each epoch when shuffled), ``"pad"``
   repeats the first few samples of the sequence to fill the last ranks. Either way the
   count is reported in the stream's stats.
3. A rank's range is split into contiguous ranges for its DataLoader workers (sizes
   differ by at most one).
4. A range becomes **pieces**: ``(shard, first, stop)``, the samples ``first <= i < stop``
   of one shard. Only the pieces at the ends of a range are partial shards.

Exactly once: the ranges of all (rank, worker) pairs tile the sequence, so with
``"drop"`` every sample but the dropped remainder is read once, and with a total that
divides by the world size, every sample is read exactly once.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = ["Piece", "Topology", "epoch_plan", "shard_order"]


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


@dataclass(frozen=True)
class Piece:
    """Samples ``first <= i < stop`` (in-shard indices) of shard number ``shard``."""

    shard: int
    first: int
    stop: int


def shard_order(n_shards: int, *, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """The epoch's shard permutation (the identity without shuffle)."""
    order = list(range(n_shards))
    if shuffle:
        random.Random(f"asyncstream:{seed}:{epoch}").shuffle(order)
    return order


def epoch_plan(
    samples_per_shard: Sequence[int],
    *,
    seed: int,
    epoch: int,
    shuffle: bool,
    topology: Topology,
    remainder: Literal["drop", "pad"] = "drop",
) -> tuple[list[Piece], int]:
    """The pieces one reader reads this epoch, in order.

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
    if remainder not in ("drop", "pad"):
        raise ValueError(f"remainder must be 'drop' or 'pad', got {remainder!r}")
    if any(n < 0 for n in samples_per_shard):
        raise ValueError("sample counts must be >= 0")
    order = shard_order(len(samples_per_shard), seed=seed, epoch=epoch, shuffle=shuffle)
    total = sum(samples_per_shard)
    world = topology.world_size
    if remainder == "drop":
        per_rank = total // world
        extra = total - per_rank * world if topology.rank == world - 1 else 0
    else:
        per_rank = -(-total // world)
        extra = max(0, (topology.rank + 1) * per_rank - total) - max(
            0, topology.rank * per_rank - total
        )
    start = topology.rank * per_rank
    base, bump = divmod(per_rank, topology.num_workers)
    w = topology.worker
    lo = start + w * base + min(w, bump)
    hi = lo + base + (1 if w < bump else 0)
    return _pieces(order, samples_per_shard, lo, hi, total), extra


def _pieces(
    order: Sequence[int], counts: Sequence[int], lo: int, hi: int, total: int
) -> list[Piece]:
    """Pieces covering ``[lo, hi)`` of the global sequence, wrapping past ``total``."""
    pieces: list[Piece] = []
    if total == 0:
        return pieces
    while lo < hi:
        wrap_lo = lo % total
        span = min(hi - lo, total - wrap_lo)
        pieces.extend(_range(order, counts, wrap_lo, wrap_lo + span))
        lo += span
    return pieces


def _range(order: Sequence[int], counts: Sequence[int], lo: int, hi: int) -> list[Piece]:
    pieces = []
    position = 0
    for shard in order:
        n = counts[shard]
        first, stop = max(lo - position, 0), min(hi - position, n)
        if first < stop:
            pieces.append(Piece(shard, first, stop))
        position += n
        if position >= hi:
            break
    return pieces
