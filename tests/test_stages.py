"""Every stage of an epoch saved at several midpoints and restored (tests/_stages.py).

The stages of ``stream/_run.py``: the plan source (``_plansource.py``), the chunk reader
and its lanes (``_lanes.py``), emit (``_emit.py``), the one owner of their state
(``_checkpoint.py``), and the whole stream. The window shuffle's and the blend's are in
``test_shuffle.py`` and ``test_mix.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

from asyncstream import ShardStream, Source, StateError
from asyncstream.engine._engine import Engine
from asyncstream.order._plan import Topology
from asyncstream.stream._checkpoint import Checkpoint, StageStates
from asyncstream.stream._emit import Emit
from asyncstream.stream._lanes import ChunkReader, LaneReader
from asyncstream.stream._plansource import PlanSource
from asyncstream.stream._settings import StreamSettings
from asyncstream.stream._state import fresh
from tests._foreign import ForeignShards, write_foreign_shards
from tests._stages import check_save_restore

STREAM: dict[str, Any] = {"window": 3, "inflight": 2, "chunk_bytes": 16 << 10, "seed": 11}


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> ForeignShards:
    return write_foreign_shards(tmp_path_factory.mktemp("stages"), 5, seed=3)


@pytest.fixture(scope="module")
def settings(shards: ForeignShards) -> StreamSettings:
    with ShardStream(str(shards.folder), samples_per_shard=shards.counts, **STREAM) as stream:
        return stream._settings


# -- the plan source ------------------------------------------------------------------------


@pytest.mark.parametrize("topology", [Topology(), Topology(1, 2), Topology(0, 2, 1, 2)])
def test_the_plan_source_saved_at_midpoints_continues_exactly(
    settings: StreamSettings, topology: Topology
) -> None:
    start = fresh(settings, 2, topology)
    pieces = check_save_restore(
        lambda: PlanSource(settings, start), PlanSource.next, midpoints=[0, 1, 2, 99]
    )
    assert [piece for _, piece in pieces] == PlanSource(settings, start).pieces
    assert [position for position, _ in pieces] == list(range(len(pieces)))


def test_a_plan_source_state_with_another_assignment_replaces_its_own(
    settings: StreamSettings,
) -> None:
    other = PlanSource(settings, fresh(settings, 3, Topology(1, 2)))
    other.next()
    plan = PlanSource(settings, fresh(settings, 0, Topology()))
    plan.reset(json.loads(json.dumps(other.state())))
    assert (plan.epoch, plan.pieces, plan.next()) == (3, other.pieces, other.next())


# -- the chunk reader -----------------------------------------------------------------------


class _Reading:
    """The chunk reader reading its pieces one after the other, a chunk per step; a step
    gives the chunk's samples and their keys (read from the ring)."""

    def __init__(self, settings: StreamSettings, engine: Engine) -> None:
        pieces = PlanSource(settings, fresh(settings, 1, Topology())).pieces
        self.engine = engine
        self.reader = ChunkReader(settings, pieces, lambda: engine)

    def step(self) -> tuple[int, int, list[int], list[str]]:
        reader = self.reader
        lane = next(iter(reader.open.values()), None)  # one open at a time
        if lane is None:
            lane = reader.lane(0)
        elif not lane.wants_more:
            if lane.position + 1 == len(reader.pieces):
                raise StopIteration  # the last lane stays open: its state says "the end"
            reader.close(lane)
            lane = reader.lane(lane.position + 1)
        items = reader.load(lane)
        keys = [record[0] for record in lane.records]
        return lane.position, lane.chunk, items, keys

    def state(self) -> dict[str, Any]:
        return self.reader.state()

    def reset(self, state: dict[str, Any]) -> None:
        self.reader.reset(state)


def test_the_chunk_reader_saved_at_midpoints_continues_exactly(settings: StreamSettings) -> None:
    engines: list[Engine] = []

    def make() -> _Reading:
        engines.append(
            Engine(
                settings.engine_config(0), n_slots=4, slot_bytes=settings.chunk_bytes, mode="thread"
            )
        )
        return _Reading(settings, engines[-1])

    try:
        chunks = check_save_restore(make, _Reading.step, midpoints=[1, 2, 3, 5, 8])
    finally:
        for engine in engines:
            engine.close()
    assert len(chunks) > 8
    per_piece: dict[int, list[int]] = {}
    for position, _, items, _ in chunks:
        per_piece.setdefault(position, []).extend(items)
    pieces = PlanSource(settings, fresh(settings, 1, Topology())).pieces
    assert {p: list(range(pieces[p].first, pieces[p].stop)) for p in per_piece} == per_piece
    assert len(per_piece) == len(pieces)


# -- emit -----------------------------------------------------------------------------------


def _lane(records: list[tuple[Any, ...]], data: bytes) -> LaneReader:
    """A lane with a resident chunk of ``data`` and its records, as emit reads them."""
    shard = SimpleNamespace(url="mem://shard-0.tar")
    lane = SimpleNamespace(records=records, first=0, view=memoryview(data), shard=shard)
    return cast(LaneReader, lane)


def test_emit_saved_at_midpoints_continues_exactly() -> None:
    data = b"abcdefghij"
    records = [(f"k{i}", 0, ("txt", i, i + 1, None), ("cls", 0, 0, b"%d" % i)) for i in range(10)]
    lane = _lane(records, data)

    def step(emit: Emit) -> dict[str, Any]:
        if emit.emitted == 10:
            raise StopIteration
        return {**emit.next(lane, (3 * emit.emitted) % 10, emit.emitted % 2), "n": emit.emitted}

    out = check_save_restore(lambda: Emit(["a", "b"]), step, midpoints=[0, 1, 6, 10])
    assert [o["txt"] for o in out] == [data[i : i + 1] for i in (0, 3, 6, 9, 2, 5, 8, 1, 4, 7)]
    assert [o["__source__"] for o in out[:3]] == ["a", "b", "a"]
    assert all(isinstance(o["txt"], bytes) for o in out)


# -- the whole stream: its state built by one checkpoint -------------------------------------


class _Streaming:
    """A stream iterated a sample per step, saved with ``state_dict()``."""

    def __init__(self, make: Any) -> None:
        self.stream: ShardStream = make()
        self.stream.set_epoch(1)
        self.it: Iterator[dict[str, Any]] | None = None

    def step(self) -> tuple[str, str, bytes]:
        if self.it is None:
            self.it = iter(self.stream)
        sample = next(self.it)
        return sample["__key__"], sample["__url__"], sample["jpg"]

    def save(self) -> dict[str, Any]:
        return self.stream.state_dict()

    def load(self, state: dict[str, Any]) -> None:
        self.stream.load_state_dict(state)


@pytest.mark.parametrize("kind", ["plain", "samples", "mixed"])
def test_the_stream_saved_at_midpoints_continues_exactly(
    shards: ForeignShards, tmp_path: Path, kind: str
) -> None:
    def make() -> ShardStream:
        if kind == "mixed":
            other = write_foreign_shards(tmp_path / "other", 3, seed=4, prefix="o")
            return ShardStream(
                [
                    Source(str(shards.folder), weight=2, name="a", samples_per_shard=shards.counts),
                    Source(str(other.folder), samples=30, name="b", samples_per_shard=other.counts),
                ],
                **STREAM,
            )
        mode = "samples" if kind == "samples" else "shards"
        return ShardStream(
            str(shards.folder), samples_per_shard=shards.counts, shuffle_mode=mode, **STREAM
        )

    keys = check_save_restore(
        lambda: _Streaming(make),
        _Streaming.step,
        midpoints=[0, 1, 17, 40],
        save=_Streaming.save,
        load=_Streaming.load,
        close=lambda reading: reading.stream.close(),
    )
    assert len(keys) == len(set(keys))


def test_the_checkpoint_splits_a_position_into_the_stages_and_builds_it_back(
    settings: StreamSettings,
) -> None:
    with ShardStream(settings.shards[0].url.rsplit("/", 1)[0], **STREAM) as stream:
        it = iter(stream)
        for _ in range(23):
            next(it)
        run = stream._run
        assert run is not None
        state = run.state()
    checkpoint = Checkpoint(run.settings, run.topology)
    stages = Checkpoint.split(run.start, state.position)
    assert checkpoint.build(stages) == state
    assert checkpoint.load(checkpoint.save(stages)) == state
    assert Checkpoint.version == state.to_dict()["version"] == 3


class _Loading:
    """A StatefulDataLoader over a stream, with one worker, a batch per step: the
    workers' stages are saved in the loader's state."""

    def __init__(self, shards: ForeignShards) -> None:
        folder = str(shards.folder)
        self.stream = ShardStream(folder, samples_per_shard=shards.counts, **STREAM)
        self.loader = StatefulDataLoader(self.stream, batch_size=4, num_workers=1, collate_fn=_keys)
        self.it: Iterator[list[str]] | None = None

    def step(self) -> list[str]:
        if self.it is None:
            self.it = iter(self.loader)
        return next(self.it)

    def save(self) -> dict[str, Any]:
        state: dict[str, Any] = self.loader.state_dict()
        return state

    def load(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)


def _keys(samples: list[dict[str, Any]]) -> list[str]:
    return [f"{s['__key__']}|{s['__url__'].rsplit('/', 1)[-1]}" for s in samples]


def test_the_stream_in_a_stateful_dataloader_saved_at_midpoints_continues_exactly(
    shards: ForeignShards,
) -> None:
    batches = check_save_restore(
        lambda: _Loading(shards),
        _Loading.step,
        midpoints=[3, 11],
        save=_Loading.save,
        load=_Loading.load,
        close=lambda loading: loading.stream.close(),
    )
    keys = [key for batch in batches for key in batch]
    assert len(keys) == len(set(keys)) == sum(shards.counts)


def test_the_checkpoint_refuses_stages_that_disagree() -> None:
    plan = {"epoch": 0, "lineage": "base", "assignment": [], "next_piece": 2}
    shuffle = {"draws": 3, "next_piece": 2, "lanes": [{"piece": 1, "remaining": [4]}]}
    reader = {"lanes": [{"piece": 0, "chunk": 0, "reader_start": 0, "returned_before": 0}]}
    with pytest.raises(StateError, match="holds no lane of piece 1"):
        Checkpoint.position(StageStates(plan, reader, shuffle, None, {"emitted": 3}))
    with pytest.raises(StateError, match="disagree on the pieces opened"):
        Checkpoint.position(
            StageStates({**plan, "next_piece": 1}, reader, shuffle, None, {"emitted": 3})
        )
