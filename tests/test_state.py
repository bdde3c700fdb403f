"""The stream's state (``stream/_state.py``): states saved by an earlier asyncstream load
and resume exactly.

``tests/data/state_v3.json`` holds states saved by asyncstream at commit b5aeef1 (state
version 3), before the stages owned their state, with the keys that run emitted after each
save. The shards are written again here from the same seeds; only their folder differs, so
the state's dataset fingerprint is replaced by this folder's (nothing else is touched).
Today's ``state_dict()`` and ``state_snapshot()`` at those points are those states, byte
for byte in JSON.

The state taken before every batch (``state_snapshot()`` as the DALI loader's producer
takes it, and ``state_dict()``) is compared with the reference, the state made as before
(the run's ``ReaderState`` and its ``to_dict``): equal, the same JSON text and the same
pickle; each state handed out is unchanged once the stream has gone on and closed, and a
snapshot's state resumes exactly.
"""

from __future__ import annotations

import copy
import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from asyncstream import ShardStream, Source
from tests._foreign import ForeignShards, write_foreign_shards

FIXTURE = json.loads((Path(__file__).parent / "data" / "state_v3.json").read_text())
STREAM: dict[str, Any] = {"window": 3, "inflight": 2, "chunk_bytes": 16 << 10, "seed": 11}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ForeignShards]:
    root = tmp_path_factory.mktemp("v3")
    seeds = FIXTURE["seeds"]
    return {
        "plain": write_foreign_shards(root / "plain", 6, seed=seeds["plain"]),
        "a": write_foreign_shards(root / "a", 4, seed=seeds["a"], prefix="a"),
        "b": write_foreign_shards(root / "b", 3, seed=seeds["b"], prefix="b"),
    }


def make(kind: str, data: dict[str, ForeignShards], **options: Any) -> ShardStream:
    if kind == "plain":
        plain = data["plain"]
        return ShardStream(str(plain.folder), samples_per_shard=plain.counts, **STREAM, **options)
    sources = [
        Source(str(data["a"].folder), weight=2, name="a", samples_per_shard=data["a"].counts),
        Source(str(data["b"].folder), samples=40, name="b", samples_per_shard=data["b"].counts),
    ]
    return ShardStream(sources, **STREAM, **options)


def key(sample: dict[str, Any]) -> str:
    return f"{sample['__key__']}|{sample['__url__'].rsplit('/', 1)[-1]}"


@pytest.mark.parametrize("case", range(len(FIXTURE["cases"])))
def test_a_version_3_state_resumes_exactly(case: int, data: dict[str, ForeignShards]) -> None:
    saved = FIXTURE["cases"][case]
    assert saved["state"]["version"] == 3
    with make(saved["kind"], data) as stream:
        state = {**saved["state"], "dataset": stream.state_dict()["dataset"]}
        stream.load_state_dict(state)
        assert [key(s) for s in stream] == saved["rest"]
    with make(saved["kind"], data) as stream:  # and the uninterrupted run agrees
        stream.set_epoch(1)
        keys = [key(s) for s in stream]
        assert keys[saved["after"] :] == saved["rest"]


# -- the state taken per batch -------------------------------------------------------------


def reference(stream: ShardStream) -> dict[str, Any]:
    """The state the way it was made before snapshots: the run's :class:`ReaderState`
    (its lanes' samples copied into tuples) and its ``to_dict``."""
    run = stream._run
    return stream.state_dict() if run is None else run.state().to_dict()


def same(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Equal, with the same JSON text (keys in the same order) and the same pickle."""
    assert a == b
    assert json.dumps(a) == json.dumps(b)
    assert pickle.dumps(a) == pickle.dumps(b)


@pytest.mark.parametrize("case", range(len(FIXTURE["cases"])))
def test_today_s_state_is_the_one_saved_by_the_earlier_asyncstream(
    case: int, data: dict[str, ForeignShards]
) -> None:
    saved = FIXTURE["cases"][case]
    with make(saved["kind"], data) as stream:
        stream.set_epoch(saved["state"]["epoch"])
        samples = iter(stream)
        for _ in range(saved["after"]):
            next(samples)
        snapshot = stream.state_snapshot()
        state = stream.state_dict()
        expected = {
            **saved["state"],
            "dataset": state["dataset"],
            "dataset_shards": state["dataset_shards"],
        }
        assert json.dumps(state) == json.dumps(expected)
        assert json.dumps(snapshot.to_dict()) == json.dumps(expected)


@pytest.mark.parametrize(
    ("kind", "options", "batch"),
    [
        ("plain", {}, 5),
        ("plain", {"shuffle_mode": "samples"}, 17),
        ("plain", {"shuffle": False}, 7),
        ("mixed", {}, 6),
    ],
)
def test_the_state_taken_before_every_batch_is_the_reference(
    data: dict[str, ForeignShards], kind: str, options: dict[str, Any], batch: int
) -> None:
    def sink(_view: memoryview, url: str, record: tuple[Any, ...]) -> bool:
        got.append(f"{record[0]}|{url.rsplit('/', 1)[-1]}")
        return True

    got: list[str] = []
    kept = []  # (snapshot, state_dict, a copy of it, the reference), before every batch
    with make(kind, data, **options) as stream:
        stream.set_epoch(1)
        views = None
        while True:
            snapshot, state = stream.state_snapshot(), stream.state_dict()
            kept.append((snapshot, state, copy.deepcopy(state), reference(stream)))
            views = views or stream.iter_views()
            if not views.take(batch, sink):
                break
    assert len(kept) > 3
    for snapshot, state, copied, old in kept:  # the stream went on and closed since
        same(state, old)
        assert state == copied  # a state handed out never changes
        made = snapshot.to_dict()
        same(made, old)
        made["position"]["lanes"].clear()  # the caller's own: the snapshot's is apart
        same(snapshot.to_dict(), old)
    middle = kept[len(kept) // 2][0].to_dict()
    with make(kind, data, **options) as stream:  # a snapshot's state resumes exactly
        stream.load_state_dict(json.loads(json.dumps(middle)))
        assert [key(s) for s in stream] == got[middle["position"]["emitted"] :]


def test_a_snapshot_taken_before_a_loaded_state_is_read_is_that_state(
    data: dict[str, ForeignShards],
) -> None:
    with make("plain", data) as stream:
        stream.set_epoch(1)
        samples = iter(stream)
        for _ in range(30):
            next(samples)
        saved = stream.state_dict()
    with make("plain", data) as stream:
        stream.load_state_dict(saved)
        idle = stream.state_snapshot()  # no run yet
        views = stream.iter_views()
        pending = stream.state_snapshot()  # a run, not started
        same(idle.to_dict(), saved)
        same(pending.to_dict(), saved)
        same(stream.state_dict(), saved)
        assert views.take(3, lambda *_: True) == 3
        same(pending.to_dict(), saved)
