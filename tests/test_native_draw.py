"""The native window draw (``asyncstream/order/_drawc.c``) against its Python reference.

:meth:`WindowShuffle.draw` in Python is the specification. Two shuffles are driven side by
side over the same pieces and chunks, one drawing with ``draw_many`` natively, the other
with the reference (``_shuffle.NATIVE`` off: a loop of ``draw``): every run of draws must
give the same lanes and samples, and the two states (``state()``, what ``need()`` asks
for next, the resident count) must be equal after every step; a tail of a run put back
with ``undraw`` must leave the state the reference reaches by drawing only the head. Seeds,
windows, modes, shuffle on and off, piece sizes, chunk sizes and run lengths are drawn by
hypothesis (``ASYNCSTREAM_FUZZ_EXAMPLES``, 150 by default, derandomized).

Whole streams over local shards (``tarfile`` and ``webdataset.TarWriter``) read with
``take`` (which draws in runs) give exactly the samples of plain ``iter`` with the
reference draw, for every mode, ranks x workers, mixed sources, a sink that stops early,
and after resumes from states saved mid-epoch either way. ``tests/data/state_pre_native.json``
holds states saved by asyncstream at fd7389c, before the native draw, with the samples that
run read after each; they must resume exactly.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asyncstream import ShardStream, Source
from asyncstream.order import _shuffle
from asyncstream.order._mix import Blend
from asyncstream.order._plan import Topology
from asyncstream.order._shuffle import WindowShuffle, _below
from asyncstream.stream import _stream
from tests._foreign import ForeignShards, write_foreign_shards
from tests._fuzz import FUZZ

pytestmark = pytest.mark.timeout(600)

U64 = st.integers(0, (1 << 64) - 1)


@contextmanager
def native(on: bool) -> Iterator[None]:
    saved = _shuffle.NATIVE
    _shuffle.NATIVE = on
    try:
        yield
    finally:
        _shuffle.NATIVE = saved


def test_the_extension_is_built() -> None:
    """Every install builds it: a source tree without it would test the reference twice."""
    assert _shuffle._NATIVE_DRAW is not None
    assert _shuffle.NATIVE  # ASYNCSTREAM_NATIVE is not set to 0 in the tests


# -- the random numbers --------------------------------------------------------------------


@FUZZ
@given(key=U64, n=U64, bound=U64)
def test_the_native_random_numbers_are_the_python_ones(key: int, n: int, bound: int) -> None:
    from asyncstream.order import _drawc

    assert _drawc.below(key, n, bound) == _below(key, n, bound)


def test_malformed_arguments_are_exceptions() -> None:
    from asyncstream.order import _drawc

    with pytest.raises(ValueError, match="empty"):
        _drawc.draw([[1], []], 1, 0, 5, False)
    with pytest.raises(TypeError, match="list"):
        _drawc.draw([[1], (2,)], 1, 0, 5, False)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="no lane"):
        _drawc.draw([], 1, 0, 5, True)
    with pytest.raises(ValueError, match="key"):
        _drawc.draw([[1]], -1, 0, 5, True)
    with pytest.raises(ValueError, match="draws"):
        _drawc.draw([[1]], 1, 1 << 64, 5, True)
    with pytest.raises(ValueError, match="n must"):
        _drawc.draw([[1]], 1, 0, -1, True)
    shared = [1, 2, 3, 4]
    with pytest.raises(ValueError, match="another lane"):  # never a read past its end
        _drawc.draw([shared, shared], 1, 0, 8, False)
    lanes: list[Any] = [[1, 2, 3]]
    lanes.append(lanes)
    with pytest.raises(ValueError, match="list of lanes"):
        _drawc.draw(lanes, 1, 0, 8, False)
    assert _drawc.draw([], 1, 0, 0, True) == ([], [])
    lists = [[7]]
    assert _drawc.draw(lists, 1, 0, 10, False) == ([0], [7])
    assert lists == [[]]


# -- two shuffles side by side ---------------------------------------------------------------


class Driven:
    """A shuffle driven as ``simulate_window_order`` drives it: pieces of ``sizes[p]``
    samples (numbered apart per piece), in chunks of ``chunk`` samples. With ``groups``
    (each piece's source), a blend over ``totals`` from the state ``blended`` (a saved
    ``Blend.state()``, or ``None``)."""

    def __init__(
        self,
        sizes: list[int],
        chunk: int,
        *,
        window: int,
        key: int,
        mode: str,
        shuffle: bool,
        groups: list[int] | None = None,
        totals: list[int] | None = None,
        blended: dict[str, list[int]] | None = None,
    ) -> None:
        self.sizes, self.chunk = sizes, chunk
        self.blend = None
        if groups is not None:
            self.blend = Blend(totals or [0] * (max(groups, default=0) + 1))
            self.blend.reset(blended)
        self.shuffle: WindowShuffle[int] = WindowShuffle(
            len(sizes),
            window=window,
            key=key,
            mode=mode,  # type: ignore[arg-type]
            shuffle=shuffle,
            groups=groups,
            blend=self.blend,
        )
        self.next_start: dict[int, int] = {}

    def _chunk(self, piece: int, start: int) -> list[int]:
        stop = min(start + self.chunk, self.sizes[piece])
        self.next_start[piece] = start + self.chunk
        return [piece * 10_000 + i for i in range(start, stop)]

    def serve(self) -> bool:
        """Serve what the shuffle needs until it can draw; False at the end."""
        s = self.shuffle
        while True:
            need = s.need()
            if need.kind == "draw":
                return True
            if need.kind == "done":
                return False
            if need.kind == "open":
                s.open(self._chunk(need.piece, 0))
            else:
                piece = s.lanes[need.lane].piece
                if self.next_start[piece] < self.sizes[piece]:
                    s.refill(need.lane, self._chunk(piece, self.next_start[piece]))
                else:
                    s.close(need.lane)

    def snapshot(self) -> Any:
        s = self.shuffle
        blend = self.blend.state() if self.blend is not None else None
        return (s.state(), s.need(), s.resident(), s._items, s.draws, blend)


@FUZZ
@given(
    data=st.data(),
    key=U64,
    window=st.integers(1, 9),
    mode=st.sampled_from(["samples", "shards"]),
    shuffle=st.booleans(),
    sizes=st.lists(st.integers(0, 40), min_size=0, max_size=12),
    chunk=st.integers(1, 50),
)
def test_native_runs_of_draws_are_the_reference_s(
    data: st.DataObject,
    key: int,
    window: int,
    mode: str,
    shuffle: bool,
    sizes: list[int],
    chunk: int,
) -> None:
    made = dict(window=window, key=key, mode=mode, shuffle=shuffle)
    fast, slow = Driven(sizes, chunk, **made), Driven(sizes, chunk, **made)  # type: ignore[arg-type]
    emitted: list[int] = []
    while True:
        going = fast.serve()
        assert slow.serve() == going
        assert fast.snapshot() == slow.snapshot()
        if not going:
            break
        n = data.draw(st.integers(0, 60), label="n")
        with native(True):
            indices, samples = fast.shuffle.draw_many(n)
        if data.draw(st.booleans(), label="put back a tail"):
            keep = data.draw(st.integers(0, len(indices)), label="keep")
            fast.shuffle.undraw(indices[keep:], samples[keep:])
            indices, samples = indices[:keep], samples[:keep]
            n = keep
        with native(False):
            assert slow.shuffle.draw_many(n) == (indices, samples)
        assert fast.snapshot() == slow.snapshot()
        emitted += samples
    everything = [p * 10_000 + i for p, size in enumerate(sizes) for i in range(size)]
    assert sorted(emitted) == everything  # each sample once


@FUZZ
@given(
    key=U64,
    window=st.integers(1, 9),
    mode=st.sampled_from(["samples", "shards"]),
    shuffle=st.booleans(),
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=12),
    chunk=st.integers(1, 50),
)
def test_runs_of_draws_are_single_draws_of_the_reference(
    key: int, window: int, mode: str, shuffle: bool, sizes: list[int], chunk: int
) -> None:
    """The native runs, as long as they go, against ``draw`` one at a time."""
    made = dict(window=window, key=key, mode=mode, shuffle=shuffle)
    fast, slow = Driven(sizes, chunk, **made), Driven(sizes, chunk, **made)  # type: ignore[arg-type]
    runs: list[tuple[int, int]] = []
    while fast.serve():
        with native(True):
            runs += zip(*fast.shuffle.draw_many(1 << 30), strict=True)
    singles = []
    while slow.serve():
        singles.append(slow.shuffle.draw())
    assert runs == singles


# -- blended: a mixed stream's draws ---------------------------------------------------------

BIG = st.sampled_from([(1 << 63) - 2, -(1 << 63) + 1, (1 << 63) + 5, -(1 << 70)])


@st.composite
def mixes(draw: st.DrawFn) -> dict[str, Any]:
    """A mixed window: pieces with their source, the blend's totals (the pieces' own, as
    the stream plans them, or any: quotas above, below or past what the pieces hold) and
    its starting state (none, a resumed one, or one whose numbers leave 64 bits now or
    within a few draws: the native run then hands those draws to Python)."""
    sources = draw(st.integers(1, 4), label="sources")
    pieces = draw(
        st.lists(st.tuples(st.integers(0, 40), st.integers(0, sources - 1)), max_size=12),
        label="pieces",
    )
    own = [sum(size for size, g in pieces if g == i) for i in range(sources)]
    count = st.lists(st.integers(-5, 200), min_size=sources, max_size=sources)
    totals = draw(st.one_of(st.just(own), count), label="totals")
    numbers = st.lists(
        st.one_of(st.integers(-100, 100), BIG) if draw(st.booleans()) else st.integers(-100, 100),
        min_size=sources,
        max_size=sources,
    )
    blended = draw(
        st.one_of(st.none(), st.fixed_dictionaries({"drawn": numbers, "credit": numbers})),
        label="blend state",
    )
    return {
        "sizes": [size for size, _ in pieces],
        "groups": [g for _, g in pieces],
        "totals": totals,
        "blended": blended,
    }


WINDOWS = {
    "window": st.integers(1, 9),
    "mode": st.sampled_from(["samples", "shards"]),
    "shuffle": st.booleans(),
    "chunk": st.integers(1, 50),
}


def driven_pair(
    mix: dict[str, Any], key: int, window: int, mode: str, shuffle: bool, chunk: int
) -> tuple[Driven, Driven]:
    made: dict[str, Any] = dict(
        window=window,
        key=key,
        mode=mode,
        shuffle=shuffle,
        groups=mix["groups"],
        totals=mix["totals"],
    )
    return (
        Driven(mix["sizes"], chunk, blended=mix["blended"], **made),
        Driven(mix["sizes"], chunk, blended=mix["blended"], **made),
    )


@FUZZ
@given(data=st.data(), mix=mixes(), key=U64, **WINDOWS)
def test_native_blended_runs_are_the_reference_s(
    data: st.DataObject,
    mix: dict[str, Any],
    key: int,
    window: int,
    mode: str,
    shuffle: bool,
    chunk: int,
) -> None:
    """Every run of a blended draw, natively, gives the reference's lanes and samples and
    leaves its state, the blend's included; any tail of a run put back leaves exactly the
    state of the reference that drew only the head."""
    fast, slow = driven_pair(mix, key, window, mode, shuffle, chunk)
    emitted: list[int] = []
    while True:
        going = fast.serve()
        assert slow.serve() == going
        assert fast.snapshot() == slow.snapshot()
        if not going:
            break
        n = data.draw(st.integers(0, 60), label="n")
        with native(True):
            indices, samples = fast.shuffle.draw_many(n)
        if data.draw(st.booleans(), label="put back a tail"):
            keep = data.draw(st.integers(0, len(indices)), label="keep")
            fast.shuffle.undraw(indices[keep:], samples[keep:])
            indices, samples = indices[:keep], samples[:keep]
            n = keep
        with native(False):
            assert slow.shuffle.draw_many(n) == (indices, samples)
        assert fast.snapshot() == slow.snapshot()
        emitted += samples
    everything = [p * 10_000 + i for p, size in enumerate(mix["sizes"]) for i in range(size)]
    assert sorted(emitted) == everything  # each sample once


@FUZZ
@given(mix=mixes(), key=U64, **WINDOWS)
def test_blended_runs_are_single_draws_of_the_reference(
    mix: dict[str, Any], key: int, window: int, mode: str, shuffle: bool, chunk: int
) -> None:
    """The native blended runs, as long as they go, against ``draw`` one at a time."""
    fast, slow = driven_pair(mix, key, window, mode, shuffle, chunk)
    runs: list[tuple[int, int]] = []
    while fast.serve():
        with native(True):
            runs += zip(*fast.shuffle.draw_many(1 << 30), strict=True)
    singles = []
    while slow.serve():
        singles.append(slow.shuffle.draw())
    assert runs == singles
    assert fast.snapshot() == slow.snapshot()


@FUZZ
@given(data=st.data(), mix=mixes(), key=U64, **WINDOWS)
def test_any_k_of_a_blended_run_put_back_is_the_state_before_them(
    data: st.DataObject,
    mix: dict[str, Any],
    key: int,
    window: int,
    mode: str,
    shuffle: bool,
    chunk: int,
) -> None:
    """After some runs, one long run: for every k, its draws after the first k put back
    give the shuffle's and the blend's ``state()`` of a reference that drew only k."""
    fast, _ = driven_pair(mix, key, window, mode, shuffle, chunk)
    for _ in range(data.draw(st.integers(0, 6), label="runs before")):
        if not fast.serve():
            return
        with native(True):
            fast.shuffle.draw_many(data.draw(st.integers(1, 30), label="n"))
    if not fast.serve():
        return
    before = json.dumps(fast.snapshot()[0]), fast.blend.state() if fast.blend else None
    with native(True):
        indices, samples = fast.shuffle.draw_many(1 << 30)
    assert indices
    for k in range(len(indices) + 1):
        again, _ = driven_pair(mix, key, window, mode, shuffle, chunk)
        again.shuffle.reset(json.loads(before[0]))
        assert again.blend is not None
        again.blend.reset(before[1])
        with native(False):
            assert again.shuffle.draw_many(k) == (indices[:k], samples[:k])
        with native(True):
            tried, _ = driven_pair(mix, key, window, mode, shuffle, chunk)
            tried.shuffle.reset(json.loads(before[0]))
            assert tried.blend is not None
            tried.blend.reset(before[1])
            drawn = tried.shuffle.draw_many(1 << 30)
            assert drawn == (indices, samples)
            tried.shuffle.undraw(drawn[0][k:], drawn[1][k:])
        assert tried.shuffle.state() == again.shuffle.state()
        assert tried.blend.state() == again.blend.state()


def test_malformed_blended_arguments_are_exceptions() -> None:
    from asyncstream.order import _drawc

    def draw_blend(**changes: Any) -> Any:
        args: dict[str, Any] = dict(
            lists=[[1, 2], [3]],
            groups=[0, 1],
            totals=[5, 5],
            drawn=[0, 0],
            credit=[0, 0],
            key=1,
            draws=0,
            n=5,
            shards=False,
        )
        args.update(changes)
        return _drawc.draw_blend(*args.values())

    with pytest.raises(ValueError, match="one entry per lane"):
        draw_blend(groups=[0])
    with pytest.raises(ValueError, match="one entry per source"):
        draw_blend(drawn=[0])
    with pytest.raises(ValueError, match="one entry per source"):
        draw_blend(credit=[0, 0, 0])
    with pytest.raises(ValueError, match="not a source"):
        draw_blend(groups=[0, 2])
    with pytest.raises(ValueError, match="not a source"):
        draw_blend(groups=[-1, 0])
    with pytest.raises(ValueError, match="not a source"):
        draw_blend(groups=[0, 1 << 70])
    with pytest.raises(ValueError, match="not a source"):
        draw_blend(groups=[0, "1"])
    with pytest.raises(TypeError, match="ints"):
        draw_blend(totals=[5, 5.0])
    with pytest.raises(TypeError):
        draw_blend(drawn=(0, 0))
    with pytest.raises(OverflowError, match="64 bits"):
        draw_blend(credit=[1 << 64, 0])
    with pytest.raises(OverflowError, match="nothing drawn"):
        draw_blend(credit=[(1 << 63) - 1, 0], drawn=[-10, 0])
    with pytest.raises(ValueError, match="empty"):
        draw_blend(lists=[[1], []])
    with pytest.raises(ValueError, match="no lane"):
        draw_blend(lists=[], groups=[])
    with pytest.raises(ValueError, match="n must"):
        draw_blend(n=-1)
    with pytest.raises(ValueError, match="draws"):
        draw_blend(draws=-1)
    shared = [1, 2, 3, 4]
    with pytest.raises(ValueError, match="another lane"):
        draw_blend(lists=[shared, shared], groups=[0, 0], n=8)
    lanes: list[Any] = [[1, 2, 3], [4]]
    lanes.append(lanes)
    with pytest.raises(ValueError, match="list of lanes"):
        draw_blend(lists=lanes, groups=[0, 1, 1], n=8)
    assert draw_blend(lists=[], groups=[], n=0) == ([], [])
    lists, drawn, credit = [[7], [8, 9]], [0, 0], [0, 0]
    indices, samples = draw_blend(lists=lists, drawn=drawn, credit=credit, n=10)
    assert len(indices) == len(samples) > 0
    assert set(samples) <= {7, 8, 9}
    assert sum(drawn) == len(samples)
    assert sum(credit) == 0  # both sources weigh every time: the credits net to zero
    assert sum(map(len, lists)) == 3 - len(samples)
    shuffle: WindowShuffle[int] = WindowShuffle(1, window=1, key=1, groups=[0], blend=Blend([1]))
    shuffle.open([1, 2])
    got = shuffle.draw_many(1)
    with pytest.raises(ValueError, match="one sample per"):
        shuffle.undraw(got[0], [])


# -- whole streams ---------------------------------------------------------------------------

STREAM: dict[str, Any] = {"window": 4, "inflight": 2, "chunk_bytes": 16 << 10, "seed": 13}
Kind = Literal["samples", "shards", "off", "mixed", "mixed-shards", "mixed-off"]
KINDS = ["samples", "shards", "off", "mixed", "mixed-shards", "mixed-off"]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ForeignShards]:
    """The fixture's shards (``state_pre_native.json``'s seeds), written again."""
    root = tmp_path_factory.mktemp("native-draw")
    seeds = FIXTURE["seeds"]
    return {
        "plain": write_foreign_shards(root / "plain", 7, seed=seeds["plain"]),
        "a": write_foreign_shards(root / "a", 4, seed=seeds["a"], prefix="a"),
        "b": write_foreign_shards(root / "b", 3, seed=seeds["b"], prefix="b"),
    }


FIXTURE = json.loads((Path(__file__).parent / "data" / "state_pre_native.json").read_text())


def make(data: dict[str, ForeignShards], kind: str, **options: Any) -> ShardStream:
    if kind.startswith("mixed"):
        sources = [
            Source(str(data["a"].folder), weight=2, name="a", samples_per_shard=data["a"].counts),
            Source(str(data["b"].folder), samples=40, name="b", samples_per_shard=data["b"].counts),
        ]
        return ShardStream(sources, **STREAM, **options)
    plain = data["plain"]
    return ShardStream(str(plain.folder), samples_per_shard=plain.counts, **STREAM, **options)


def options(kind: Kind) -> dict[str, Any]:
    if kind.endswith("off"):
        return {"shuffle": False}
    return {"shuffle_mode": "shards" if kind.endswith("shards") else "samples"}


def key(sample: dict[str, Any]) -> str:
    return f"{sample['__key__']}|{sample['__url__'].rsplit('/', 1)[-1]}"


def record_key(_view: memoryview, url: str, record: tuple[Any, ...]) -> str:
    return f"{record[0]}|{url.rsplit('/', 1)[-1]}"


def taken(stream: ShardStream, rng: random.Random, limit: int | None = None) -> list[str]:
    """The stream read with ``take`` in runs of random lengths, its sink stopping at random
    now and then; up to ``limit`` samples."""
    got: list[str] = []
    views = stream.iter_views()
    while limit is None or len(got) < limit:
        n = rng.randint(1, 40) if limit is None else min(rng.randint(1, 40), limit - len(got))
        stop = rng.randint(1, n) if rng.random() < 0.3 else None
        stop_at = len(got) + stop if stop is not None else -1

        def sink(view: memoryview, url: str, record: tuple[Any, ...], at: int = stop_at) -> bool:
            got.append(record_key(view, url, record))
            return len(got) != at

        count = views.take(n, sink)
        if count == 0:
            break
        assert count <= (stop or n)  # fewer only where the sink stopped or the epoch ended
    return got


@contextmanager
def topology(rank: int, world: int, worker: int, workers: int) -> Iterator[None]:
    """The stream's reader as DataLoader worker ``worker`` of ``workers`` (0 of 1: none)."""
    real = _stream.worker_topology
    _stream.worker_topology = lambda r, w: Topology(r, w, worker, workers)  # type: ignore[assignment]
    try:
        yield
    finally:
        _stream.worker_topology = real


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("where", [(0, 1, 0, 1), (1, 2, 0, 1), (0, 2, 1, 3), (2, 3, 1, 2)])
def test_a_stream_taken_natively_is_iter_s_order(
    data: dict[str, ForeignShards], kind: Kind, where: tuple[int, int, int, int]
) -> None:
    rank, world = where[:2]
    with (
        topology(*where),
        native(False),
        make(data, kind, rank=rank, world_size=world, **options(kind)) as s,
    ):
        s.set_epoch(2)
        expected = [key(sample) for sample in s]
    assert expected
    for on in (True, False):
        with (
            topology(*where),
            native(on),
            make(data, kind, rank=rank, world_size=world, **options(kind)) as s,
        ):
            s.set_epoch(2)
            assert taken(s, random.Random(f"{kind}{where}{on}")) == expected, on


# Each kind saved after its first sample or inside a later run, by turns (all twelve
# pairs cost CI a minute and found nothing the six did not).
@pytest.mark.parametrize(("kind", "after"), [(k, (1, 33)[i % 2]) for i, k in enumerate(KINDS)])
def test_a_state_saved_while_taking_resumes_exactly_either_way(
    data: dict[str, ForeignShards], kind: Kind, after: int
) -> None:
    with native(False), make(data, kind, **options(kind)) as s:
        s.set_epoch(1)
        expected = [key(sample) for sample in s]
    for first, then in ((True, False), (False, True)):
        with native(first), make(data, kind, **options(kind)) as s:
            s.set_epoch(1)
            head = taken(s, random.Random(after), limit=after)
            state = json.loads(json.dumps(s.state_dict()))
        assert head == expected[:after]
        with native(then), make(data, kind, **options(kind)) as s:
            s.load_state_dict(state)
            assert taken(s, random.Random(after + 1)) == expected[after:], (first, then)
        with native(then), make(data, kind, **options(kind)) as s:
            s.load_state_dict(state)
            assert [key(sample) for sample in s] == expected[after:], (first, then)


@pytest.mark.parametrize("case", range(len(FIXTURE["cases"])))
@pytest.mark.parametrize("reading", ["take", "iter"])
def test_a_state_saved_before_the_native_draw_resumes_exactly(
    data: dict[str, ForeignShards], case: int, reading: str
) -> None:
    saved = FIXTURE["cases"][case]
    with native(True), make(data, saved["kind"], **saved["options"]) as s:
        s.load_state_dict({**saved["state"], "dataset": s.state_dict()["dataset"]})
        got = taken(s, random.Random(case)) if reading == "take" else list(map(key, s))
    assert got == saved["rest"]
