"""The pure half of mixing (``asyncstream.order._mix``): quotas, each source's samples per epoch,
the interleaved plan, the blend of draws, and the window shares it gives, simulated."""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncstream import MixingQuality, mixing_quality
from asyncstream.order._mix import Blend, SourcePlan, mixed_entries, quotas, source_entries
from asyncstream.order._plan import EpochSequence, Span, Topology, assign
from asyncstream.order._shuffle import WindowShuffle, mix_key
from tests._stages import check_save_restore

# -- quotas -----------------------------------------------------------------------------


def test_weights_share_the_epoch_exactly_by_largest_remainder() -> None:
    got = quotas(["a", "b", "c"], [100, 100, 100], [1, 1, 1], [None] * 3, 100)
    assert got == [34, 33, 33]  # ties go to the earlier source
    assert quotas(["a", "b"], [50, 400], [3, 1], [None, None], 10_000) == [7_500, 2_500]


def test_without_epoch_size_weighted_sources_take_as_many_samples_as_they_hold() -> None:
    # 1,000 + 3,000 held; shared 3 : 1.
    assert quotas(["a", "b"], [1_000, 3_000], [3, 1], [None, None], None) == [3_000, 1_000]
    # An absolute count comes on top.
    assert quotas(["a", "b"], [1_000, 3_000], [1, None], [None, 500], None) == [1_000, 500]


def test_absolute_counts_and_weights_together() -> None:
    assert quotas(["a", "b", "c"], [10, 10, 10], [1, 3, None], [None, None, 200], 1_000) == [
        200,
        600,
        200,
    ]


@pytest.mark.parametrize(
    ("weights", "samples", "epoch_size", "message"),
    [
        ([0, 0], [None, None], 100, r"weights of sources 'a', 'b' are zero in total"),
        ([0.0, None], [None, 50], 100, r"weights of sources 'a' are zero in total"),
        ([None, None], [40, 50], 100, r"epoch_size=100 conflicts .*'a': 40, 'b': 50"),
        ([1, None], [None, 50], 20, r"epoch_size=20 conflicts .*at least their sum"),
    ],
)
def test_conflicting_or_empty_shares_are_a_value_error_naming_the_sources(
    weights: list[float | None], samples: list[int | None], epoch_size: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        quotas(["a", "b"], [10, 10], weights, samples, epoch_size)


# -- a source's samples over epochs -------------------------------------------------------


def planned(counts: Sequence[int], quota: int, epoch: int, seed: int = 0) -> list[tuple[int, int]]:
    """The (shard, sample) pairs of one source's epoch."""
    entries = source_entries(counts, quota, seed=seed, source=0, epoch=epoch, shuffle=True)
    return [(shard, i) for shard, first, stop in entries for i in range(first, stop)]


@pytest.mark.parametrize("quota", [37, 100, 250, 999, 1_000, 1_001, 2_600])
def test_each_sample_once_before_any_twice_counted_by_epochs(quota: int) -> None:
    counts = [100, 37, 0, 250, 13, 600]  # 1,000 samples, uneven shards, an empty one
    seen: collections.Counter[tuple[int, int]] = collections.Counter()
    for epoch in range(3 * 1_000 // quota + 3):
        got = planned(counts, quota, epoch)
        assert len(got) == quota
        seen.update(got)
        # After every epoch: any two samples planned a number of times within one.
        everything = [seen[(s, i)] for s, n in enumerate(counts) for i in range(n)]
        assert max(everything) - min(everything) <= 1, f"epoch {epoch}"


def test_a_downsampled_source_reads_a_different_part_each_epoch() -> None:
    counts = [100] * 10
    parts = [set(planned(counts, 300, epoch)) for epoch in range(3)]
    assert not parts[0] & parts[1]
    assert not parts[1] & parts[2]
    assert not parts[0] & parts[2]
    assert len(parts[0] | parts[1] | parts[2]) == 900
    # The fourth epoch finishes the first cycle, then starts the second.
    fourth = planned(counts, 300, 3)
    assert len(set(fourth) - parts[0] - parts[1] - parts[2]) == 100


def test_cycles_are_shuffled_differently_and_seeded() -> None:
    counts = [10] * 20
    first = source_entries(counts, 200, seed=0, source=0, epoch=0, shuffle=True)
    second = source_entries(counts, 200, seed=0, source=0, epoch=1, shuffle=True)
    assert [e[0] for e in first] != [e[0] for e in second]
    assert first == source_entries(counts, 200, seed=0, source=0, epoch=0, shuffle=True)
    assert first != source_entries(counts, 200, seed=1, source=0, epoch=0, shuffle=True)
    assert first != source_entries(counts, 200, seed=0, source=1, epoch=0, shuffle=True)
    unshuffled = source_entries(counts, 200, seed=0, source=0, epoch=0, shuffle=False)
    assert [e[0] for e in unshuffled] == list(range(20))


# -- the interleaved plan ---------------------------------------------------------------


def two_sources(a: int = 40, b: int = 30, shard: int = 100) -> tuple[list[int], list[SourcePlan]]:
    counts = [shard] * (a + b)
    return counts, [SourcePlan("a", 0, a, 7_500), SourcePlan("b", a, a + b, 2_500)]


def test_the_plan_interleaves_the_sources_pieces_in_proportion() -> None:
    counts, sources = two_sources()
    entries = mixed_entries(counts, sources, seed=0, epoch=0, shuffle=True)
    sequence = EpochSequence(counts, entries=entries)
    assert sequence.total == 10_000
    of = ["a" if shard < 40 else "b" for shard, _, _ in entries]
    assert collections.Counter(of) == {"a": 75, "b": 25}  # whole shards: 7,500 and 2,500
    cut = EpochSequence(
        counts, entries=mixed_entries(counts, sources, seed=0, epoch=1, shuffle=True)
    )
    assert cut.total == 10_000
    # Every run of 8 pieces holds both sources, in about their proportion.
    for k in range(len(of) - 8):
        assert 4 <= of[k : k + 8].count("a") <= 7


def test_ranks_get_contiguous_equal_shares_of_each_source_in_proportion() -> None:
    counts, sources = two_sources()
    sequence = EpochSequence(
        counts, entries=mixed_entries(counts, sources, seed=3, epoch=1, shuffle=True)
    )
    seen: collections.Counter[tuple[int, int]] = collections.Counter()
    for rank in range(4):
        segments, _ = assign([Span(0, sequence.total)], Topology(rank, 4))
        pieces = sequence.pieces(segments)
        a = sum(p.count for p in pieces if p.shard < 40)
        assert sum(p.count for p in pieces) == 2_500
        assert abs(a - 1_875) <= 100  # 3 : 1, to a piece of 100
        seen.update((p.shard, i) for p in pieces for i in range(p.first, p.stop))
    assert sum(seen.values()) == 10_000
    assert sum(n for (shard, _), n in seen.items() if shard >= 40) == 2_500


# -- the blend --------------------------------------------------------------------------


def test_the_blend_follows_the_remaining_counts_smoothly() -> None:
    blend = Blend([75, 25])
    picks = [blend.choose([0, 1]) for _ in range(100)]
    assert picks.count(0) == 75
    for k in range(0, 100, 4):  # every 4 draws: 3 of a, 1 of b
        assert picks[k : k + 4].count(1) == 1
    assert blend.state()["drawn"] == [75, 25]


def test_a_source_without_an_open_lane_catches_up_gently() -> None:
    blend = Blend([500, 500])
    first = [blend.choose([0]) for _ in range(100)]  # source 1 has no lane for a while
    assert first == [0] * 100
    rest = [blend.choose([0, 1]) for _ in range(200)]
    assert 0.5 < rest.count(1) / 200 < 0.6  # 500 : 400 left: about 5 of 9, no burst
    assert max(len(run) for run in "".join(map(str, rest)).split("0")) <= 2


def test_a_blend_restored_from_its_state_continues_exactly() -> None:
    blend = Blend([30, 20, 50])
    for _ in range(37):
        blend.choose([0, 1, 2])
    again = Blend([30, 20, 50])
    again.reset(blend.state())
    assert [blend.choose([0, 2]) for _ in range(20)] == [again.choose([0, 2]) for _ in range(20)]


# -- window shares, simulated -------------------------------------------------------------


def simulate(
    counts: list[int],
    sources: list[SourcePlan],
    *,
    window: int,
    chunk: int,
    seed: int,
    mode: str = "shards",
) -> list[int]:
    """The sources of one reader's emitted samples: the stream's stages, chunks in samples."""
    entries = mixed_entries(counts, sources, seed=seed, epoch=0, shuffle=True)
    starts = [s.first for s in sources]
    groups = [sum(1 for f in starts if f <= shard) - 1 for shard, _, _ in entries]
    totals = [0] * len(sources)
    for (_, first, stop), group in zip(entries, groups, strict=True):
        totals[group] += stop - first
    shuffle: WindowShuffle[int] = WindowShuffle(
        len(entries),
        window=window,
        key=mix_key(seed, 0),
        mode=mode,  # type: ignore[arg-type]
        groups=groups,
        blend=Blend(totals),
    )
    next_start: dict[int, int] = {}
    out: list[int] = []

    def chunk_of(piece: int, start: int) -> list[int]:
        stop = min(entries[piece][2], start + chunk)
        next_start[piece] = stop
        return [piece] * (stop - start)

    while True:
        need = shuffle.need()
        if need.kind == "draw":
            out.append(groups[shuffle.draw()[1]])
        elif need.kind == "refill":
            piece = shuffle.lanes[need.lane].piece
            if next_start[piece] < entries[piece][2]:
                shuffle.refill(need.lane, chunk_of(piece, next_start[piece]))
            else:
                shuffle.close(need.lane)
        elif need.kind == "open":
            shuffle.open(chunk_of(need.piece, entries[need.piece][1]))
        else:
            return out


@pytest.mark.parametrize(
    ("sizes", "weights", "window", "chunk"),
    [
        ((100, 100), (3, 1), 16, 25),
        ((100, 100), (9, 1), 8, 100),
        ((100, 100), (99, 1), 2, 25),  # a window of one shard per source
        ((100, 1_000), (1, 1), 32, 50),
        ((100, 300, 50), (5, 3, 2), 12, 25),
        ((100, 300, 50), (5, 3, 2), 3, 25),
    ],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_window_of_640_holds_each_source_within_5_points(
    sizes: tuple[int, ...], weights: tuple[int, ...], window: int, chunk: int, seed: int
) -> None:
    counts: list[int] = []
    sources = []
    held = [60 * 100 // size + 1 for size in sizes]  # about 6,000 samples each
    shares = quotas(
        [f"s{i}" for i in range(len(sizes))],
        [0] * len(sizes),
        list(weights),
        [None] * len(sizes),
        10_000,
    )
    for i, (size, n) in enumerate(zip(sizes, held, strict=True)):
        sources.append(SourcePlan(f"s{i}", len(counts), len(counts) + n, shares[i]))
        counts += [size] * n
    order = simulate(counts, sources, window=window, chunk=chunk, seed=seed)
    assert len(order) == 10_000
    quality = mixing_quality(order, dict(enumerate(shares)), window=640)
    assert quality.worst_window <= 0.05
    assert [order.count(i) for i in range(len(sizes))] == shares


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=12),
    sources=st.integers(1, 3),
    epoch_size=st.integers(1, 600),
    window=st.integers(3, 8),
    seed=st.integers(0, 5),
)
def test_the_mixed_plan_reads_exactly_its_quotas(
    sizes: list[int], sources: int, epoch_size: int, window: int, seed: int
) -> None:
    counts = sizes * sources
    plans = [SourcePlan(f"s{i}", i * len(sizes), (i + 1) * len(sizes), 0) for i in range(sources)]
    given_quotas = quotas(
        [p.name for p in plans],
        [sum(sizes)] * sources,
        [1] * sources,
        [None] * sources,
        epoch_size,
    )
    plans = [
        SourcePlan(p.name, p.first, p.stop, q) for p, q in zip(plans, given_quotas, strict=True)
    ]
    order = simulate(counts, plans, window=window, chunk=7, seed=seed)
    assert [order.count(i) for i in range(sources)] == given_quotas


def test_mixing_quality_measures_batches_and_windows() -> None:
    weights = {"a": 3.0, "b": 1.0}
    exact = mixing_quality(list("aaab" * 32), weights, window=64)
    assert exact == MixingQuality({"a": 0.75, "b": 0.25}, 0.0, 0.0, 64, 64)
    skewed = ["a"] * 64 + list("aabb" * 16)  # a batch of a alone, then one half and half
    got = mixing_quality(skewed, weights, window=64)
    assert got.batch_deviation == (0.25 + 0.25) / 2
    assert got.worst_window == 0.25
    assert got.shares == {"a": 0.75, "b": 0.25}
    short = mixing_quality(list("aaab"), weights, window=64)
    assert math.isnan(short.batch_deviation)
    assert math.isnan(short.worst_window)
    # Counts instead of weights: only the proportions count.
    assert mixing_quality(skewed, {"a": 300, "b": 100}, window=64) == got


@pytest.mark.parametrize(
    ("weights", "kwargs", "message"),
    [
        ({"a": -1.0, "b": 1.0}, {}, "'a' must be finite and >= 0"),
        ({"a": math.nan}, {}, "'a' must be finite"),
        ({"a": 0.0, "b": 0.0}, {}, "add up to 0.0"),
        ({"a": 1.0}, {}, "sources without a weight: \\[\"'b'\"\\]"),
        ({"a": 1.0, "b": 1.0}, {"batch_size": 0}, "batch_size must be an integer >= 1"),
        ({"a": 1.0, "b": 1.0}, {"window": True}, "window must be an integer >= 1"),
    ],
)
def test_mixing_quality_refuses_bad_input(
    weights: dict[str, float], kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        mixing_quality(list("aabb"), weights, **kwargs)


def _blend_step(blend: Blend) -> int:
    """One draw, among the sources that a lane pattern leaves open at this draw."""
    n = sum(blend.drawn)
    if n == 120:
        raise StopIteration
    return blend.choose([g for g in range(3) if (n + g) % 5])


def test_the_blend_saved_at_midpoints_continues_exactly() -> None:
    picks = check_save_restore(
        lambda: Blend([50, 30, 40]), _blend_step, midpoints=[0, 1, 7, 33, 119, 120]
    )
    assert len(picks) == 120
    fresh = Blend([50, 30, 40])
    fresh.reset(None)
    assert fresh.state() == {"drawn": [0, 0, 0], "credit": [0, 0, 0]}
    with pytest.raises(ValueError, match="one entry per source"):
        fresh.reset({"drawn": [1], "credit": [0]})


@settings(max_examples=200, derandomize=True, database=None, deadline=None)
@given(
    totals=st.lists(st.integers(-5, 60), min_size=1, max_size=5),
    data=st.data(),
)
def test_unchoose_undoes_choose_exactly(totals: list[int], data: st.DataObject) -> None:
    """Choices undone from the last back leave each earlier state exactly (what a run of
    draws put back needs), over counts past the totals (all weights spent) too."""
    n = len(totals)
    blend = Blend(totals)
    states, choices = [blend.state()], []
    for _ in range(data.draw(st.integers(0, 80), label="draws")):
        available = sorted(data.draw(st.sets(st.integers(0, n - 1), min_size=1), label="available"))
        choices.append((blend.choose(available), available))
        states.append(blend.state())
    while choices:
        pick, available = choices.pop()
        states.pop()
        blend.unchoose(pick, available)
        assert blend.state() == states[-1]
    assert blend.state() == {"drawn": [0] * n, "credit": [0] * n}
