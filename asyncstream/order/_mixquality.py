"""How closely a mixed stream's order of sources follows their weights.

:func:`mixing_quality` measures any emitted sequence of source names (asyncstream's
``__source__``, or a peer's) against target weights: each batch's share of each source,
and the worst share over every window of consecutive samples. The benchmark compares
asyncstream's blend with webdataset's ``RandomMix`` and LitData's
``CombinedStreamingDataset`` with it, and the tests hold the stream to it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["MixingQuality", "mixing_quality"]

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class MixingQuality:
    """Measures of how closely an order of sources follows its weights (0 is exact).

    Attributes:
        shares: each weighted source's share of the whole order.
        batch_deviation: ``|share of the batch - weight share|``, averaged over every full
            batch of ``batch_size`` and every source; ``nan`` without a full batch.
        worst_window: the largest ``|share - weight share|`` of any source over every
            ``window`` consecutive samples; ``nan`` when the order is shorter.
        batch_size: the batch size used.
        window: the window used.
    """

    shares: dict[Any, float]
    batch_deviation: float
    worst_window: float
    batch_size: int
    window: int


def mixing_quality(
    sources: Sequence[K],
    weights: Mapping[K, float],
    *,
    batch_size: int = 64,
    window: int = 640,
) -> MixingQuality:
    """Measure an emitted order of sources against their weights.

    Args:
        sources: the source of each emitted sample, in emitted order (for a
            :class:`~asyncstream.ShardStream` of :class:`~asyncstream.Source`, each
            sample's ``"__source__"``).
        weights: each source's relative weight (or its samples per epoch: only the
            proportions count).
        batch_size: the batch of the per-batch deviation (a last partial batch is ignored).
        window: the width of the sliding window.

    Raises:
        ValueError: a negative or non-finite weight, weights zero in total, a source in
            ``sources`` without a weight, or a ``batch_size`` or ``window`` below 1.
    """
    for what, value in (("batch_size", batch_size), ("window", window)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{what} must be an integer >= 1, got {value!r}")
    for name, weight in weights.items():
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"the weight of {name!r} must be finite and >= 0, got {weight!r}")
    total = sum(weights.values())
    if total <= 0:
        raise ValueError(f"the weights add up to {total!r}: give at least one a positive weight")
    target = {name: weight / total for name, weight in weights.items()}
    unknown = set(sources) - set(target)
    if unknown:
        raise ValueError(f"sources without a weight: {sorted(map(repr, unknown))}")
    n = len(sources)
    seen = Counter(sources)
    shares = {name: seen[name] / n if n else math.nan for name in target}

    batches = n // batch_size
    deviation = math.nan
    if batches:
        off = 0.0
        for b in range(batches):
            part = Counter(sources[b * batch_size : (b + 1) * batch_size])
            off += sum(abs(part[name] / batch_size - s) for name, s in target.items())
        deviation = off / (batches * len(target))

    worst = math.nan
    if n >= window:
        counts: Counter[K] = Counter()
        worst = 0.0
        for k, name in enumerate(sources):
            counts[name] += 1
            if k >= window:
                counts[sources[k - window]] -= 1
            if k >= window - 1:
                worst = max(worst, *(abs(counts[m] / window - s) for m, s in target.items()))
    return MixingQuality(shares, deviation, worst, batch_size, window)
