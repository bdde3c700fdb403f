"""ShardLoader's len() and the map stage: CPU decode in DataLoader workers, resumed exactly.

``len(loader)`` is checked against the batches that come out, for several worker counts,
batch sizes and ``drop_last``; the map stage's resume runs in a fresh process
(``tests/_decode_child.py``), against a user's own wrapper that torchdata can only
fast-forward.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

from asyncstream import DecodeError, ShardLoader, ShardStream, decode_image
from asyncstream.testing import generate_imagefolder
from dali_ops import DALIImageLoader, PipelineSettings
from tests._foreign import ForeignShards, write_foreign_shards
from tests._resume_child import keys

# Three DataLoader workers on a 2-core machine: torch warns, the test means it.
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
HERE = Path(__file__).parent
STREAM: dict[str, Any] = {"window": 3, "inflight": 2, "chunk_bytes": 16 << 10, "seed": 7}


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> ForeignShards:
    return write_foreign_shards(tmp_path_factory.mktemp("len"), 0, counts=[23, 31, 17, 29])


def open_stream(data: ForeignShards, **kwargs: Any) -> ShardStream:
    return ShardStream(str(data.folder), samples_per_shard=data.counts, **{**STREAM, **kwargs})


@pytest.mark.parametrize(
    ("workers", "batch_size", "drop_last"),
    [(0, 16, False), (1, 7, True), (2, 16, False), (2, 16, True), (3, 7, False), (3, 25, True)],
)
def test_len_of_a_shard_loader_is_the_batches_that_come_out(
    shards: ForeignShards, workers: int, batch_size: int, drop_last: bool
) -> None:
    assert shards.total == 100
    with open_stream(shards) as stream:
        loader = ShardLoader(
            stream, batch_size=batch_size, num_workers=workers, drop_last=drop_last, collate_fn=keys
        )
        batches = list(loader)
        assert len(loader) == len(batches)
        assert stream.batches(batch_size, num_workers=workers, drop_last=drop_last) == len(batches)
        # A plain StatefulDataLoader divides len(stream) by the batch size: true with at
        # most one worker, not with more (each worker makes its own short batch).
        plain = StatefulDataLoader(stream, batch_size=batch_size, drop_last=drop_last)
        rounded = (math.floor if drop_last else math.ceil)(100 / batch_size)
        assert len(plain) == rounded
        if workers <= 1:
            assert rounded == len(batches)
        del loader, plain
    sizes = [len(b) for b in batches]
    assert sum(sizes) == 100 or drop_last


def test_len_with_ranks_and_a_map_stage(shards: ForeignShards) -> None:
    with open_stream(shards, rank=1, world_size=3) as stream:  # 33 samples for this rank
        staged = stream.map(lambda sample: sample["__key__"])
        loader = ShardLoader(staged, batch_size=4, num_workers=2)
        batches = list(loader)
        assert len(loader) == len(batches) == 9  # 17 -> 5 batches (one short), 16 -> 4
        del loader


@pytest.mark.parametrize(("batch_size", "drop_last"), [(8, False), (8, True), (50, False)])
def test_dali_loader_len_is_the_batches_that_come_out(
    tmp_path_factory: pytest.TempPathFactory, batch_size: int, drop_last: bool
) -> None:
    root = tmp_path_factory.mktemp("dali-len")
    paths = generate_imagefolder(root / "images", 12, 2, seed=0, workers=1)
    data = write_foreign_shards(
        root / "shards", 0, counts=[9, 13, 11], jpgs=[p.read_bytes() for p in paths]
    )
    settings = PipelineSettings(image_size=32, num_threads=1)
    stream = open_stream(data)
    with DALIImageLoader(
        stream, batch_size, device="cpu", settings=settings, drop_last=drop_last
    ) as loader:
        assert len(loader) == sum(1 for _ in loader)


# -- the map stage --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def jpeg_shards(tmp_path_factory: pytest.TempPathFactory) -> ForeignShards:
    root = tmp_path_factory.mktemp("decode")
    paths = generate_imagefolder(root / "images", 16, 2, seed=0, workers=1)
    jpgs = [path.read_bytes() for path in paths]
    return write_foreign_shards(root / "shards", 0, counts=[12, 10, 14, 12], jpgs=jpgs)


def run_child(tmp_path: Path, spec: dict[str, Any]) -> Any:
    spec_path, out_path = tmp_path / "spec.json", tmp_path / "out.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    result = subprocess.run(
        [sys.executable, str(HERE / "_decode_child.py"), str(spec_path), str(out_path)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out_path.read_text())


@pytest.mark.parametrize("workers", [0, 2])
def test_cpu_decode_stage_resumes_exactly_in_a_fresh_process_without_fast_forward(
    jpeg_shards: ForeignShards, tmp_path: Path, workers: int
) -> None:
    base = {
        "folder": str(jpeg_shards.folder),
        "stream": {**STREAM, "samples_per_shard": jpeg_shards.counts},
        "workers": workers,
        "batch_size": 5,
    }
    full = run_child(tmp_path, {**base, "stage": "map", "state": None})
    assert sorted(k for b in full["batches"] for k in b[0]) == sorted(jpeg_shards.keys)
    assert full["decoded"] == 48  # each sample decoded once
    save = 4  # after 4 batches: mid-epoch on every worker
    state = full["states"][save - 1]
    resumed = run_child(tmp_path, {**base, "stage": "map", "state": state})
    assert resumed["batches"] == full["batches"][save:]  # keys, labels and pixels
    left = sum(len(b[0]) for b in full["batches"][save:])
    assert resumed["decoded"] == left  # nothing before the checkpoint read again
    assert "fast-forward" not in resumed["log"]
    # A wrapper that does not forward the state resumes too, by decoding it all again.
    unwrapped = run_child(tmp_path, {**base, "stage": "wrapper", "state": None})
    assert unwrapped["batches"] == full["batches"]
    state = unwrapped["states"][save - 1]
    wrapped = run_child(tmp_path, {**base, "stage": "wrapper", "state": state})
    assert wrapped["batches"] == full["batches"][save:]
    assert wrapped["decoded"] == 48
    assert "fast-forwarding" in wrapped["log"]


def test_decode_image_names_the_sample_when_it_cannot(jpeg_shards: ForeignShards) -> None:
    with open_stream(jpeg_shards) as stream:
        sample = next(iter(stream))
    assert decode_image(sample).mode == "RGB"
    assert decode_image(sample).size == (decode_image(sample, mode=None)).size
    broken = {**sample, "jpg": sample["jpg"][:40]}
    with pytest.raises(DecodeError, match=r"'jpg' does not decode") as caught:
        decode_image(broken)
    assert sample["__key__"] in str(caught.value)
    with pytest.raises(DecodeError, match=r"no image member among .* \(it has \['cls'\]\)"):
        decode_image({"__key__": "k", "cls": b"1"})
