"""The epoch plan: exactly once, balance across ranks and workers, the remainder policy."""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections import Counter
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncstream.order._plan import (
    EpochSequence,
    Piece,
    Segment,
    Span,
    Topology,
    assign,
    cut,
    epoch_plan,
    reader_samples,
    shard_order,
)

Remainder = Literal["drop", "pad"]

# Shard sizes: many small (zero included), a few large.
SIZES = st.lists(
    st.one_of(st.integers(0, 5), st.integers(0, 60), st.integers(200, 3000)),
    min_size=0,
    max_size=14,
)


def samples(pieces: list[Piece]) -> list[tuple[int, int]]:
    """The (shard, in-shard index) of every sample of ``pieces``, in order."""
    return [(p.shard, i) for p in pieces for i in (*p.take, *range(p.first, p.stop))]


def sequence(sizes: list[int], seed: int, epoch: int, shuffle: bool) -> list[tuple[int, int]]:
    """The epoch's global sample sequence: the permuted shards, concatenated."""
    order = shard_order(len(sizes), seed=seed, epoch=epoch, shuffle=shuffle)
    return [(s, i) for s in order for i in range(sizes[s])]


def plan_all(
    sizes: list[int],
    *,
    seed: int,
    epoch: int,
    world: int,
    workers: int,
    remainder: Remainder,
    shuffle: bool = True,
) -> dict[tuple[int, int], tuple[list[Piece], int]]:
    return {
        (rank, worker): epoch_plan(
            sizes,
            seed=seed,
            epoch=epoch,
            shuffle=shuffle,
            topology=Topology(rank, world, worker, workers),
            remainder=remainder,
        )
        for rank in range(world)
        for worker in range(workers)
    }


def check_pieces(pieces: list[Piece], sizes: list[int]) -> None:
    for p in pieces:
        assert 0 <= p.shard < len(sizes)
        assert 0 <= p.first < p.stop <= sizes[p.shard]  # never empty, within the shard
    for p in pieces[1:-1]:  # only the pieces at the ends of a range are partial
        assert (p.first, p.stop) == (0, sizes[p.shard])


@settings(max_examples=60, deadline=None)
@given(
    sizes=SIZES,
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 50),
    world=st.integers(1, 4),
    workers=st.integers(1, 3),
    shuffle=st.booleans(),
)
def test_drop_reads_every_sample_once_but_the_remainder(
    sizes: list[int], seed: int, epoch: int, world: int, workers: int, shuffle: bool
) -> None:
    plans = plan_all(
        sizes,
        seed=seed,
        epoch=epoch,
        world=world,
        workers=workers,
        remainder="drop",
        shuffle=shuffle,
    )
    total = sum(sizes)
    seq = sequence(sizes, seed, epoch, shuffle)
    read: list[tuple[int, int]] = []
    for rank in range(world):
        per_worker = []
        for worker in range(workers):
            pieces, extra = plans[rank, worker]
            check_pieces(pieces, sizes)
            per_worker.append(len(samples(pieces)))
            read += samples(pieces)
            assert extra == (total % world if rank == world - 1 else 0)
        assert sum(per_worker) == total // world
        assert max(per_worker) - min(per_worker) <= 1
    # ranks then workers, in order, tile the sequence; the last total % world are dropped
    assert read == seq[: total - total % world]
    assert len(set(read)) == len(read)


@settings(max_examples=60, deadline=None)
@given(
    sizes=SIZES,
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 50),
    world=st.integers(1, 4),
    workers=st.integers(1, 3),
    shuffle=st.booleans(),
)
def test_pad_reads_every_sample_and_repeats_the_first(
    sizes: list[int], seed: int, epoch: int, world: int, workers: int, shuffle: bool
) -> None:
    plans = plan_all(
        sizes,
        seed=seed,
        epoch=epoch,
        world=world,
        workers=workers,
        remainder="pad",
        shuffle=shuffle,
    )
    total = sum(sizes)
    per_rank = -(-total // world)
    seq = sequence(sizes, seed, epoch, shuffle)
    read: list[tuple[int, int]] = []
    extras = 0
    for rank in range(world):
        per_worker = []
        rank_extra = {plans[rank, w][1] for w in range(workers)}
        assert len(rank_extra) == 1  # the rank's count, the same for each of its workers
        extras += rank_extra.pop()
        for worker in range(workers):
            pieces, _ = plans[rank, worker]
            check_pieces(pieces, sizes)
            per_worker.append(len(samples(pieces)))
            read += samples(pieces)
        assert sum(per_worker) == per_rank  # all ranks equal
        assert max(per_worker) - min(per_worker) <= 1
    duplicates = per_rank * world - total
    assert len(read) - len(set(read)) == duplicates
    assert extras == duplicates
    assert set(read) == set(seq)  # every sample at least once
    if total:
        # the sequence, then its first samples again (wrapping as often as needed)
        assert read == [seq[i % total] for i in range(per_rank * world)]
    else:
        assert read == []


@pytest.mark.parametrize("remainder", ["drop", "pad"])
def test_divisible_total_is_exactly_once(remainder: Remainder) -> None:
    sizes = [7, 0, 13, 4]  # 24 samples
    for world in (1, 2, 3, 4):
        plans = plan_all(sizes, seed=1, epoch=2, world=world, workers=3, remainder=remainder)
        read = [s for pieces, extra in plans.values() for s in samples(pieces)]
        assert sorted(read) == sorted(sequence(sizes, 1, 2, True))
        assert all(extra == 0 for _, extra in plans.values())


def test_worked_example() -> None:
    """10 samples, 3 ranks, 2 workers, in order: ranges [0,3) [3,6) [6,9), 1 dropped."""
    sizes = [4, 6]
    plans = plan_all(sizes, seed=0, epoch=0, world=3, workers=2, remainder="drop", shuffle=False)
    assert plans[0, 0] == ([Piece(0, 0, 2)], 0)
    assert plans[0, 1] == ([Piece(0, 2, 3)], 0)
    assert plans[1, 0] == ([Piece(0, 3, 4), Piece(1, 0, 1)], 0)
    assert plans[1, 1] == ([Piece(1, 1, 2)], 0)
    assert plans[2, 0] == ([Piece(1, 2, 4)], 1)
    assert plans[2, 1] == ([Piece(1, 4, 5)], 1)
    pads = plan_all(sizes, seed=0, epoch=0, world=3, workers=1, remainder="pad", shuffle=False)
    assert pads[2, 0] == ([Piece(1, 4, 6), Piece(0, 0, 2)], 2)  # [8, 12): 2 repeated
    assert [pads[r, 0][1] for r in range(3)] == [0, 0, 2]


def test_pad_wraps_more_than_once() -> None:
    plans = plan_all([1, 0, 1], seed=0, epoch=0, world=4, workers=1, remainder="pad", shuffle=False)
    assert [samples(plans[r, 0][0]) for r in range(4)] == [[(0, 0)], [(2, 0)], [(0, 0)], [(2, 0)]]
    assert [plans[r, 0][1] for r in range(4)] == [0, 0, 1, 1]


def test_epochs_and_seeds_permute_differently() -> None:
    n = 30
    orders = {tuple(shard_order(n, seed=5, epoch=e, shuffle=True)) for e in range(10)}
    assert len(orders) == 10
    assert tuple(range(n)) not in orders
    assert shard_order(n, seed=5, epoch=0, shuffle=True) != shard_order(
        n, seed=6, epoch=0, shuffle=True
    )
    sizes = [100] * n
    a = epoch_plan(sizes, seed=5, epoch=0, shuffle=True, topology=Topology(0, 2))
    b = epoch_plan(sizes, seed=5, epoch=1, shuffle=True, topology=Topology(0, 2))
    assert a != b
    assert len(samples(a[0])) == len(samples(b[0])) == 1500


def test_no_shuffle_keeps_dataset_order() -> None:
    sizes = [3, 0, 5, 2, 9]
    for epoch in range(4):
        assert shard_order(len(sizes), seed=epoch, epoch=epoch, shuffle=False) == [0, 1, 2, 3, 4]
        pieces, extra = epoch_plan(
            sizes, seed=epoch, epoch=epoch, shuffle=False, topology=Topology()
        )
        assert extra == 0
        assert pieces == [Piece(0, 0, 3), Piece(2, 0, 5), Piece(3, 0, 2), Piece(4, 0, 9)]


def test_deterministic_across_calls_and_processes() -> None:
    sizes = [17, 250, 0, 3, 99, 1000, 42]
    topology = Topology(rank=1, world_size=3, worker=1, num_workers=2)
    here = epoch_plan(sizes, seed=123, epoch=4, shuffle=True, topology=topology)
    assert here == epoch_plan(sizes, seed=123, epoch=4, shuffle=True, topology=topology)
    code = (
        "from asyncstream.order._plan import Topology, epoch_plan\n"
        f"print(repr(epoch_plan({sizes}, seed=123, epoch=4, shuffle=True, "
        "topology=Topology(1, 3, 1, 2))))"
    )
    for hash_seed in ("0", "4242"):
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": hash_seed},
        ).stdout
        assert out.strip() == repr(here)


@pytest.mark.parametrize(
    "args",
    [
        {"rank": 1, "world_size": 1},
        {"rank": -1, "world_size": 2},
        {"rank": 0, "world_size": 0},
        {"worker": 2, "num_workers": 2},
        {"worker": -1, "num_workers": 2},
        {"worker": 0, "num_workers": 0},
    ],
)
def test_topology_validation(args: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="need 0 <="):
        Topology(**args)


def test_plan_validation() -> None:
    with pytest.raises(ValueError, match="remainder"):
        epoch_plan([1], seed=0, epoch=0, shuffle=True, topology=Topology(), remainder="x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=">= 0"):
        epoch_plan([1, -1], seed=0, epoch=0, shuffle=True, topology=Topology())


def test_empty_dataset() -> None:
    for remainder in ("drop", "pad"):
        for world in (1, 3):
            plans = plan_all([], seed=0, epoch=0, world=world, workers=2, remainder=remainder)
            assert all(plan == ([], 0) for plan in plans.values())
    plans = plan_all([0, 0], seed=0, epoch=0, world=2, workers=1, remainder="pad")
    assert all(plan == ([], 0) for plan in plans.values())


def test_fewer_samples_than_ranks() -> None:
    sizes = [0, 2]
    drop = plan_all(sizes, seed=0, epoch=0, world=3, workers=2, remainder="drop")
    assert all(pieces == [] for pieces, _ in drop.values())
    assert [drop[r, 0][1] for r in range(3)] == [0, 0, 2]
    pad = plan_all(sizes, seed=0, epoch=0, world=3, workers=2, remainder="pad")
    counts = Counter(s for pieces, _ in pad.values() for s in samples(pieces))
    assert sorted(counts.values()) == [1, 2]


# -- segments: what is left of several readers, split again -------------------------------


@st.composite
def segment_lists(draw: st.DrawFn) -> tuple[EpochSequence, list[Segment]]:
    """An epoch and a list of disjoint segments of it: spans and partial pieces (a piece
    that takes a few samples, then a range, as a saved lane leaves)."""
    sizes = draw(st.lists(st.integers(0, 40), min_size=1, max_size=8))
    sequence = EpochSequence(sizes, shard_order(len(sizes), seed=1, epoch=0, shuffle=True))
    segments: list[Segment] = []
    position = 0
    while position < sequence.total:
        n = draw(st.integers(1, sequence.total - position))
        if draw(st.booleans()):
            segments.append(Span(position, position + n))
        else:
            for piece in sequence.pieces([Span(position, position + n)]):
                wanted = list(range(piece.first, piece.stop))
                split = draw(st.integers(0, len(wanted)))
                take = tuple(
                    sorted(draw(st.sets(st.sampled_from(wanted[:split]))) if split else ())
                )
                segments.append(Piece(piece.shard, piece.first + split, piece.stop, take))
        position += n
    return sequence, segments


def segment_samples(sequence: EpochSequence, segments: list[Segment]) -> list[tuple[int, int]]:
    return samples(sequence.pieces(segments))


@settings(max_examples=150, deadline=None)
@given(data=segment_lists(), world=st.integers(1, 5), workers=st.integers(1, 4))
def test_assign_tiles_any_segments_exactly(
    data: tuple[EpochSequence, list[Segment]], world: int, workers: int
) -> None:
    sequence, segments = data
    whole = segment_samples(sequence, segments)
    shares = []
    for rank in range(world):
        rank_samples: list[tuple[int, int]] = []
        for worker in range(workers):
            topology = Topology(rank, world, worker, workers)
            mine, _ = assign(segments, topology, "drop")
            got = segment_samples(sequence, mine)
            assert len(got) == reader_samples(len(whole), topology, "drop")
            rank_samples.extend(got)
        shares.append(rank_samples)
    assert len({len(share) for share in shares}) == 1  # equal steps per rank
    assert [x for share in shares for x in share] == whole[: len(whole) - len(whole) % world]


@settings(max_examples=100, deadline=None)
@given(data=segment_lists(), world=st.integers(1, 5))
def test_assign_pads_by_repeating_from_the_start(
    data: tuple[EpochSequence, list[Segment]], world: int
) -> None:
    sequence, segments = data
    whole = segment_samples(sequence, segments)
    got = []
    for rank in range(world):
        mine, _ = assign(segments, Topology(rank, world), "pad")
        got.append(segment_samples(sequence, mine))
    assert len({len(g) for g in got}) == 1
    flat = [x for g in got for x in g]
    repeats = -(-len(flat) // len(whole)) if whole else 0
    assert flat == (whole * repeats)[: len(flat)]  # the list, then again from its start


@settings(max_examples=150, deadline=None)
@given(data=segment_lists(), cuts=st.lists(st.integers(0, 400), max_size=4))
def test_cut_keeps_every_sample_in_order(
    data: tuple[EpochSequence, list[Segment]], cuts: list[int]
) -> None:
    sequence, segments = data
    whole = segment_samples(sequence, segments)
    bounds = sorted({0, len(whole), *(c % (len(whole) + 1) for c in cuts)})
    parts = [segment_samples(sequence, cut(segments, a, b)) for a, b in itertools.pairwise(bounds)]
    assert [x for part in parts for x in part] == whole


def test_a_cut_piece_reads_no_further_than_its_last_sample() -> None:
    piece = Piece(3, 10, 20, take=(2, 5, 7), offset=1024, index0=2)
    head = cut([piece], 0, 2)
    assert head == [Piece(3, 6, 6, (2, 5), 1024, 2)]  # ends after sample 5
    assert cut([piece], 2, 5) == [Piece(3, 10, 12, (7,), 1024, 2)]
    assert cut([piece], 5, 13) == [Piece(3, 12, 20, (), 1024, 2)]
