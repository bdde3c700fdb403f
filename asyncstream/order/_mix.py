"""Weighted mixing of several sources in one epoch: pure functions and one small state.

Three pieces, each a function of its inputs (seed, epoch, sizes), so that a mixed epoch is
as deterministic and as resumable as a plain one:

**Quotas** (:func:`quotas`). Each source takes a fixed number of samples per epoch: an
absolute count (``Source(samples=n)``), or a share of what the absolute counts leave of
the epoch, by relative weight (``Source(weight=w)``). The epoch's size is ``epoch_size``
when given; otherwise the weighted sources together take as many samples as they hold.
Shares are rounded by largest remainder, so the quotas add up to the epoch exactly.

**A source's samples in an epoch** (:func:`source_entries`). Each source is an endless
sequence of *cycles*; cycle ``c`` is every sample of the source once, its shards in an
order permuted by ``(seed, source, c)``. Epoch ``e`` takes the quota's worth of samples
at positions ``[e * quota, (e + 1) * quota)`` of that sequence, as pieces of shards
``(shard, first, stop)``. So a source's samples are drawn **each once before any twice**,
exactly, at sample granularity, counted by epochs: after any epoch, the number of times
any two samples of a source have been planned differ by at most one (upsampling, quota
above the source's size, repeats samples; downsampling, quota below it, takes a
different slice each epoch and reaches every sample before repeating one). Within one
epoch the window shuffle may emit a sample's second copy before another's first.

**The interleaved plan** (:func:`mixed_entries`). The sources' pieces are merged into one
sequence in proportion: each piece is placed at the fraction of its source's quota at
which it starts, which is when, drawing every source at its share, the reader first
needs it (earliest deadline first: placing pieces at their middle instead left a source
with large shards and no open lane for hundreds of draws in small windows). So the
shards of every source are spread evenly over the epoch, each opened before its source
runs dry. That sequence plays the role of a plain epoch's shard permutation: ranks and
workers get contiguous shares of it (:func:`._plan.assign`), and it is what the window
opens, in order.

**The blend of draws** (:class:`Blend`). Which source each draw takes: a smooth weighted
round robin (the one nginx uses for upstreams; Megatron-LM blends datasets with the same
greedy rule) over the sources that have an open lane, each weighted by the samples it
still has to give this reader. Deterministic, so a window of consecutive draws holds each
source within a sample or two of its share, where a random choice per draw (webdataset's
``RandomMix``) wanders by the square root of the window; a source that briefly has no open
lane catches up gently over the rest of the reader's epoch, not in a burst.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

__all__ = ["Blend", "SourcePlan", "mixed_entries", "quotas", "source_entries"]

Entry = tuple[int, int, int]  # (shard, first, stop): samples first <= i < stop of a shard


@dataclass(frozen=True)
class SourcePlan:
    """One source of a mixed stream, as the plan sees it.

    Attributes:
        name: the source's name (``__source__`` of its samples).
        first: its first shard, in the stream's list of all shards.
        stop: one past its last shard.
        quota: its samples per epoch.
        endpoint: the name of the options that reach its shards' store (``""``: the
            stream's own; else one of ``StreamSettings.endpoints``).
    """

    name: str
    first: int
    stop: int
    quota: int
    endpoint: str = ""


def quotas(
    names: Sequence[str],
    sizes: Sequence[int],
    weights: Sequence[float | None],
    samples: Sequence[int | None],
    epoch_size: int | None,
) -> list[int]:
    """Each source's samples per epoch (module docstring).

    Args:
        names: the sources' names (for messages).
        sizes: samples in each source.
        weights: each source's relative weight, or ``None`` where it has an absolute count.
        samples: each source's absolute count, or ``None`` where it has a weight.
        epoch_size: the epoch's samples, all sources together; ``None``: the absolute
            counts plus the samples the weighted sources hold.

    Raises:
        ValueError: weights that total zero where samples are left to share, an
            ``epoch_size`` that the absolute counts do not fit, or an epoch of no sample.
    """
    fixed = sum(n for n in samples if n is not None)
    weighted = [i for i, w in enumerate(weights) if w is not None]
    if epoch_size is None:
        epoch_size = fixed + sum(sizes[i] for i in weighted)
    elif epoch_size < fixed or (not weighted and epoch_size != fixed):
        absolute = ", ".join(f"{names[i]!r}: {n}" for i, n in enumerate(samples) if n is not None)
        raise ValueError(
            f"epoch_size={epoch_size} conflicts with the sources' absolute sample counts "
            f"({absolute}; {fixed} in all): "
            + (
                "give weights to some sources, or leave epoch_size out"
                if not weighted
                else "it must be at least their sum"
            )
        )
    rest = epoch_size - fixed
    total = sum((Fraction(weights[i] or 0) for i in weighted), Fraction(0))
    if weighted and total == 0 and rest > 0:
        raise ValueError(
            "the weights of sources "
            + ", ".join(repr(names[i]) for i in weighted)
            + " are zero in total: no share of the epoch can be set"
        )
    out = [n if n is not None else 0 for n in samples]
    if weighted and rest > 0:
        exact = {i: rest * Fraction(weights[i] or 0) / total for i in weighted}
        for i in weighted:
            out[i] = math.floor(exact[i])
        left = rest - sum(out[i] for i in weighted)
        # Largest remainder first; ties to the earlier source.
        for i in sorted(weighted, key=lambda i: (-(exact[i] - out[i]), i))[:left]:
            out[i] += 1
    if sum(out) == 0:
        raise ValueError("the sources' quotas give an epoch of no sample")
    return out


def _cycle_order(n_shards: int, *, seed: int, source: int, cycle: int, shuffle: bool) -> list[int]:
    order = list(range(n_shards))
    if shuffle:
        random.Random(f"asyncstream:{seed}:source:{source}:cycle:{cycle}").shuffle(order)
    return order


def source_entries(
    counts: Sequence[int], quota: int, *, seed: int, source: int, epoch: int, shuffle: bool
) -> list[Entry]:
    """One source's samples in epoch ``epoch``, as ``(shard, first, stop)`` pieces of its
    own shards (numbered from 0), in the order of its endless sequence of cycles."""
    size = sum(counts)
    if quota <= 0 or size <= 0:
        return []
    start, end = epoch * quota, (epoch + 1) * quota
    out: list[Entry] = []
    cycle, position = divmod(start, size)
    position = start - position  # where the cycle begins in the endless sequence
    while position < end:
        for shard in _cycle_order(
            len(counts), seed=seed, source=source, cycle=cycle, shuffle=shuffle
        ):
            n = counts[shard]
            lo, hi = max(start, position), min(end, position + n)
            if lo < hi:
                out.append((shard, lo - position, hi - position))
            position += n
            if position >= end:
                break
        cycle += 1
    return out


def mixed_entries(
    counts: Sequence[int], sources: Sequence[SourcePlan], *, seed: int, epoch: int, shuffle: bool
) -> list[Entry]:
    """The epoch's interleaved sequence of pieces over every source (module docstring),
    with shards numbered in the stream's list of all shards."""
    keyed: list[tuple[float, int, int, Entry]] = []
    for index, source in enumerate(sources):
        entries = source_entries(
            counts[source.first : source.stop],
            source.quota,
            seed=seed,
            source=index,
            epoch=epoch,
            shuffle=shuffle,
        )
        done = 0
        for k, (shard, first, stop) in enumerate(entries):
            n = stop - first
            keyed.append((done / source.quota, index, k, (source.first + shard, first, stop)))
            done += n
    keyed.sort()
    return [entry for _, _, _, entry in keyed]


class Blend:
    """Which source each draw of one reader takes (module docstring).

    Args:
        totals: samples this reader reads from each source in its epoch.
        drawn: samples drawn from each so far (a saved state), default none.
        credit: the round robin's credit of each source (a saved state), default 0.
    """

    def __init__(
        self,
        totals: Sequence[int],
        drawn: Sequence[int] | None = None,
        credit: Sequence[int] | None = None,
    ) -> None:
        self.totals = list(totals)
        self.drawn = list(drawn) if drawn is not None else [0] * len(totals)
        self.credit = list(credit) if credit is not None else [0] * len(totals)
        if not len(self.drawn) == len(self.credit) == len(self.totals):
            raise ValueError("a blend's drawn and credit need one entry per source")

    def choose(self, available: Sequence[int]) -> int:
        """The source of the next draw, among ``available`` (those with an open lane, in
        ascending order)."""
        totals, drawn, credit = self.totals, self.drawn, self.credit
        weights = [(i, totals[i] - drawn[i]) for i in available]
        if all(w <= 0 for _, w in weights):  # more samples than counted: draw them all alike
            weights = [(i, 1) for i in available]
        total = 0
        pick, best = -1, 0
        for i, w in weights:
            if w <= 0:
                continue
            total += w
            credit[i] += w
            if pick < 0 or credit[i] > best:
                pick, best = i, credit[i]
        credit[pick] -= total
        drawn[pick] += 1
        return pick

    def unchoose(self, pick: int, available: Sequence[int]) -> None:
        """Undo the last :meth:`choose`, which returned ``pick`` among ``available``: the
        state is then exactly as before it."""
        totals, drawn, credit = self.totals, self.drawn, self.credit
        drawn[pick] -= 1
        weights = [(i, totals[i] - drawn[i]) for i in available]  # as choose() saw them
        if all(w <= 0 for _, w in weights):
            weights = [(i, 1) for i in available]
        total = 0
        for i, w in weights:
            if w > 0:
                total += w
                credit[i] -= w
        credit[pick] += total

    def state(self) -> dict[str, list[int]]:
        """The blend's state as plain data: ``drawn`` and ``credit``, per source."""
        return {"drawn": list(self.drawn), "credit": list(self.credit)}

    def reset(self, state: Mapping[str, Sequence[int]] | None = None) -> None:
        """Start over (``None``: before the first draw) or continue exactly from a saved
        :meth:`state`.

        Raises:
            ValueError: a state without one ``drawn`` and one ``credit`` per source.
        """
        if state is None:
            state = {"drawn": [0] * len(self.totals), "credit": [0] * len(self.totals)}
        drawn, credit = state["drawn"], state["credit"]
        if not len(drawn) == len(credit) == len(self.totals):
            raise ValueError("a blend's drawn and credit need one entry per source")
        self.drawn, self.credit = list(drawn), list(credit)
