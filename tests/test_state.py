"""The stream's state (``stream/_state.py``): states saved by an earlier asyncstream load
and resume exactly.

``tests/data/state_v3.json`` holds states saved by asyncstream at commit b5aeef1 (state
version 3), before the stages owned their state, with the keys that run emitted after each
save. The shards are written again here from the same seeds; only their folder differs, so
the state's dataset fingerprint is replaced by this folder's (nothing else is touched).
"""

from __future__ import annotations

import json
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


def make(kind: str, data: dict[str, ForeignShards]) -> ShardStream:
    if kind == "plain":
        plain = data["plain"]
        return ShardStream(str(plain.folder), samples_per_shard=plain.counts, **STREAM)
    sources = [
        Source(str(data["a"].folder), weight=2, name="a", samples_per_shard=data["a"].counts),
        Source(str(data["b"].folder), samples=40, name="b", samples_per_shard=data["b"].counts),
    ]
    return ShardStream(sources, **STREAM)


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
