"""One process per device under torchrun: ranks partition the shards (world size 2, CPU)."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
from _torchrun import torchrun

from asyncstream import pack
from asyncstream.testing import generate_imagefolder
from tests._foreign import write_foreign_shards

# What a training script does under torchrun: the stream takes its rank and world size from
# torch.distributed, and every rank takes the same number of steps.
TRAIN = textwrap.dedent(
    """
    import json, sys
    import torch
    import torch.distributed as dist
    from asyncstream import ShardStream
    from dali_ops import DALIImageLoader, PipelineSettings

    if __name__ == "__main__":
        shards, out = sys.argv[1], sys.argv[2]
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        stream = ShardStream(shards, window=3, inflight=2, seed=1)
        settings = PipelineSettings(image_size=32, num_threads=1)
        keys, steps = [], 0
        with DALIImageLoader(stream, 8, settings=settings, device="cpu", drop_last=True) as loader:
            for images, labels in loader:
                keys.extend(key for _, key in loader.last_keys)
                steps += 1
        counts = torch.tensor([steps])
        everyone = [torch.zeros(1, dtype=torch.long) for _ in range(dist.get_world_size())]
        dist.all_gather(everyone, counts)
        with open(f"{out}/rank{rank}.json", "w") as f:
            json.dump({"keys": keys, "steps": [int(t) for t in everyone]}, f)
        dist.destroy_process_group()
    """
)


@pytest.mark.slow
def test_torchrun_world_size_2_partitions_the_shards(tmp_path: Path) -> None:
    generate_imagefolder(tmp_path / "images", 64, 4, seed=0, workers=1)
    pack(tmp_path / "images", str(tmp_path / "shards"), shard_samples=10, shard_bytes=None)
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    result = torchrun(script, str(tmp_path / "shards"), str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    keys = [set(r["keys"]) for r in ranks]
    assert keys[0].isdisjoint(keys[1])  # the ranks read different samples
    assert len(keys[0]) == len(keys[1]) == 32  # 64 samples, 32 per rank: 4 steps of 8
    assert keys[0] | keys[1] == {f"{i:06d}" for i in range(64)}
    assert ranks[0]["steps"] == ranks[1]["steps"] == [4, 4]


# A rank's job as users write it: a stream (no index: the ranks share the counting, a
# collective), 2 DataLoader workers, one epoch, then another stream made just before the
# script ends, and no destroy_process_group(). Before asyncstream ran that collective on a
# group of its own, a gloo worker thread could still be releasing its work (a Python
# object) while the interpreter finalized: pthread_exit through a C++ destructor, and
# "terminate called without an active exception" (SIGABRT) after all the work was done.
JOB = textwrap.dedent(
    """
    import json, sys
    import torch.distributed as dist
    from asyncstream import ShardLoader, ShardStream

    if __name__ == "__main__":
        shards, out = sys.argv[1], sys.argv[2]
        dist.init_process_group("gloo")
        stream = ShardStream(shards, window=3, inflight=2, seed=1)
        loader = ShardLoader(stream, batch_size=4, num_workers=2, collate_fn=lambda b: b)
        keys = [sample["__key__"] for batch in loader for sample in batch]
        with open(f"{out}/rank{dist.get_rank()}.json", "w") as f:
            json.dump({"keys": keys, "len": len(loader)}, f)
        ShardStream(shards, window=3, inflight=2, seed=2)  # the next stream, then the end
    """
)


# Before the fix, about 1 run in 4 aborted or hung (3 of 10 measured): 6 runs in a row in
# every test run (make check, CI) miss such a regression about 1 time in 6 (0.75 ** 6); the
# soak, 20 in a row (1 in 300), with ASYNCSTREAM_SOAK=1, after touching the exit path.
RUNS = 20 if os.environ.get("ASYNCSTREAM_SOAK", "") not in ("", "0") else 6


@pytest.mark.slow
def test_torchrun_2_ranks_2_workers_exits_cleanly_many_times_in_a_row(tmp_path: Path) -> None:
    data = write_foreign_shards(tmp_path / "shards", 0, counts=[5, 7, 6, 6], jpg_bytes=(50, 200))
    script = tmp_path / "job.py"
    script.write_text(JOB)
    for run in range(RUNS):
        result = torchrun(script, str(data.folder), str(tmp_path), timeout=120)
        assert result.returncode == 0, f"run {run}: {result.stderr[-3000:]}"
        ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
        keys = [set(r["keys"]) for r in ranks]
        assert keys[0].isdisjoint(keys[1])
        assert keys[0] | keys[1] == set(data.keys)
        assert [r["len"] for r in ranks] == [4, 4]  # 12 per rank: 6 + 6 per worker, 2 + 2
