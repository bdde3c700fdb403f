"""EpochLog, the plain helper: a loop over a real ShardStream and ShardLoader (moto),
its figures written to a TensorBoard SummaryWriter and read back."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from asyncstream import EpochFigures, EpochLog, LocalS3, ShardLoader, ShardStream
from asyncstream.metrics._epochlog import batch_size
from tests._foreign import ForeignShards, write_foreign_shards


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> ForeignShards:
    return write_foreign_shards(tmp_path_factory.mktemp("epochlog"), 3, seed=7)


@pytest.fixture
def stream(s3_server: LocalS3, bucket: str, s3_client: Any, shards: ForeignShards) -> Any:
    for path in sorted(shards.folder.iterdir()):
        s3_client.put_object(Bucket=bucket, Key=f"ds/{path.name}", Body=path.read_bytes())
    with ShardStream(
        f"s3://{bucket}/ds/",
        endpoint_url=s3_server.endpoint_url,
        samples_per_shard=shards.counts,
        window=2,
        inflight=2,
        chunk_bytes=16 << 10,
    ) as opened:
        yield opened


def collate(batch: list[dict[str, Any]]) -> dict[str, Any]:
    return {"x": torch.zeros(len(batch), 3), "keys": [s["__key__"] for s in batch]}


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # tensorboard on numpy 2, protobuf
def test_epoch_log_writes_each_epoch_to_a_summary_writer(
    tmp_path: Path, stream: ShardStream, shards: ForeignShards
) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path))
    log = EpochLog(stream, write=writer.add_scalar, unit="images")
    loader = ShardLoader(stream, batch_size=5, collate_fn=collate)
    for _ in range(2):
        for batch in log.iterate(loader):
            batch["x"].sum()
    writer.close()

    total = sum(shards.counts)
    assert [f.epoch for f in log.epochs] == [0, 1]
    assert [f.samples for f in log.epochs] == [total, total]
    assert [f.batches for f in log.epochs] == [len(loader)] * 2
    reader = EventAccumulator(str(tmp_path))
    reader.Reload()
    tags = set(reader.Tags()["scalars"])
    assert {
        "asyncstream/images_per_s",
        "asyncstream/stall_share",
        "asyncstream/images",
        "asyncstream/loader_stall_share",
    } <= tags
    assert [(e.step, e.value) for e in reader.Scalars("asyncstream/images")] == [
        (0, float(total)),
        (1, float(total)),
    ]
    for event in reader.Scalars("asyncstream/stall_share"):
        assert 0.0 <= event.value <= 1.0
    for event in reader.Scalars("asyncstream/loader_stall_share"):
        assert 0.0 <= event.value <= 1.0
    for event in reader.Scalars("asyncstream/images_per_s"):
        assert event.value > 0
        assert math.isfinite(event.value)


def test_epoch_log_over_the_stream_itself_and_a_loop_that_leaves_early(
    stream: ShardStream, shards: ForeignShards
) -> None:
    log = EpochLog(count=lambda sample: 1)
    taken = [sample["__key__"] for sample in log.iterate(stream)]
    assert len(taken) == sum(shards.counts) == log.epochs[0].samples
    for i, _ in enumerate(log.iterate(stream)):
        if i == 9:
            break  # the epoch ends with what the loop took
    assert len(log.epochs) == 2
    assert log.epochs[1].samples == 9  # the tenth was taken, its step never ended
    assert log.epochs[1].batches == 9
    figures = log.epochs[0]
    assert figures.seconds == figures.waited_s + figures.worked_s > 0
    assert figures.samples_per_s == figures.samples / figures.seconds
    assert 0.0 <= figures.stall_share <= 1.0
    assert figures.loader_stall_share is None  # no source given


def test_a_loop_of_ones_own_pauses_and_writes_at_the_step_given() -> None:
    written: list[tuple[str, float, int]] = []
    log = EpochLog(write=lambda name, value, step: written.append((name, value, step)))
    log.start_epoch(4)
    log.pause()  # e.g. validation: until the next batch, nothing is waited for
    log.batch_start()
    log.batch_end(8)
    log.batch_start()
    log.batch_end(3)
    figures = log.end_epoch(step=120)
    assert figures.epoch == 4
    assert figures.samples == 11
    assert figures.batches == 2
    assert figures.waited_s >= 0
    assert figures.worked_s >= 0
    names = {name for name, _, _ in written}
    assert names == {
        "asyncstream/samples_per_s",
        "asyncstream/stall_share",
        "asyncstream/samples",
        "asyncstream/batches",
        "asyncstream/waited_s",
        "asyncstream/epoch",
    }
    assert {step for _, _, step in written} == {120}
    assert ("asyncstream/samples", 11.0, 120) in written
    log.start_epoch()
    assert log.end_epoch() == EpochFigures(5, 0, 0, 0.0, 0.0)  # numbered after the last
    assert log.epochs[-1].stall_share == 0.0
    assert log.epochs[-1].samples_per_s == 0.0


def test_paused_before_the_first_batch_waits_nothing() -> None:
    log = EpochLog()
    log.start_epoch()
    log.pause()
    log.batch_start()
    log.batch_end(1)
    assert log.end_epoch().waited_s == 0.0


def test_batch_size_reads_common_batch_shapes() -> None:
    assert batch_size(torch.zeros(7, 3)) == 7
    assert batch_size(np.zeros((5, 2))) == 5
    assert batch_size(torch.tensor(1.0)) == 1
    assert batch_size((torch.zeros(6, 3, 8, 8), torch.zeros(6))) == 6
    assert batch_size({"image": torch.zeros(4, 3), "label": [0, 1, 2, 3]}) == 4
    assert batch_size([{"image": torch.zeros(2)}, 1]) == 2
    assert batch_size([b"a", b"b", b"c"]) == 3
    assert batch_size({}) == 0
    assert batch_size(object()) == 1


def test_a_source_needs_stats_and_a_unit_a_name() -> None:
    with pytest.raises(TypeError, match="stats"):
        EpochLog(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unit"):
        EpochLog(unit="")
    assert repr(EpochLog()) == "EpochLog(unit='samples', prefix='asyncstream/', epochs=0)"
