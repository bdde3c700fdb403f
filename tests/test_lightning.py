"""StallLogger: a real Lightning Trainer fed by a ShardLoader over S3 (moto), its
figures read back from TensorBoard's event files."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from asyncstream import LocalS3, ShardLoader, ShardStream
from tests._foreign import ForeignShards, write_foreign_shards

L = pytest.importorskip("lightning", reason="lightning is not installed (pip install lightning)")
event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator",
    reason="tensorboard is not installed",
)

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*does not have many workers:UserWarning"),
    pytest.mark.filterwarnings("ignore:Your `IterableDataset` has `__len__` defined:UserWarning"),
    pytest.mark.filterwarnings(
        "ignore:`isinstance.treespec, LeafSpec.` is deprecated:FutureWarning"
    ),
    # tensorboard's event reader on numpy 2 and protobuf: their deprecations, not ours.
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

BATCH = 4


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> ForeignShards:
    return write_foreign_shards(tmp_path_factory.mktemp("stall"), 3, seed=5)


@pytest.fixture
def dataset_url(s3_server: LocalS3, bucket: str, s3_client: Any, shards: ForeignShards) -> str:
    for path in sorted(shards.folder.iterdir()):
        s3_client.put_object(Bucket=bucket, Key=f"ds/{path.name}", Body=path.read_bytes())
    return f"s3://{bucket}/ds/"


def collate(batch: list[dict[str, Any]]) -> dict[str, Any]:
    x = torch.tensor([[float(len(s["jpg"]) % 7)] for s in batch])
    return {"x": x, "keys": [s["__key__"] for s in batch]}


class Model(L.LightningModule):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)

    def training_step(self, batch: dict[str, Any], index: int) -> torch.Tensor:
        return self.layer(batch["x"]).pow(2).mean()  # type: ignore[no-any-return]

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the event files under ``folder``: name -> [(step, value)]."""
    (events,) = {p.parent for p in folder.rglob("events.out.tfevents.*")}
    reader = event_accumulator.EventAccumulator(str(events))
    reader.Reload()
    return {
        tag: [(e.step, e.value) for e in reader.Scalars(tag)] for tag in reader.Tags()["scalars"]
    }


def trainer_for(tmp_path: Path, callback: Any, *, epochs: int, max_steps: int = -1) -> Any:
    """A CPU trainer logging to TensorBoard under ``tmp_path``, with ``callback`` only."""
    from lightning.pytorch.loggers import TensorBoardLogger

    return L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=epochs,
        max_steps=max_steps,
        logger=TensorBoardLogger(tmp_path, name="run"),
        callbacks=[callback],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        log_every_n_steps=1,
    )


@pytest.mark.parametrize("workers", [0, 2], ids=["0-workers", "2-workers"])
def test_stall_logger_writes_throughput_and_stall_share_per_epoch(
    tmp_path: Path, s3_server: LocalS3, dataset_url: str, shards: ForeignShards, workers: int
) -> None:
    from asyncstream import StallLogger

    stream = ShardStream(
        dataset_url,
        endpoint_url=s3_server.endpoint_url,
        samples_per_shard=shards.counts,
        window=2,
        inflight=2,
        chunk_bytes=16 << 10,
    )
    callback = StallLogger()
    trainer = trainer_for(tmp_path, callback, epochs=2)
    loader = ShardLoader(stream, batch_size=BATCH, num_workers=workers, collate_fn=collate)
    with stream:
        trainer.fit(Model(), loader)
        batches = len(loader)

    logged = scalars(tmp_path)
    total = sum(shards.counts)
    for name in (
        "samples_per_s",
        "stall_share",
        "samples",
        "batches",
        "waited_s",
        "epoch",
    ):
        assert len(logged[f"asyncstream/{name}"]) == 2, name  # one per epoch
    assert [v for _, v in logged["asyncstream/epoch"]] == [0.0, 1.0]
    assert [v for _, v in logged["asyncstream/samples"]] == [float(total)] * 2
    assert [v for _, v in logged["asyncstream/batches"]] == [float(batches)] * 2
    # At the trainer's global step, beside the loss curves.
    assert [s for s, _ in logged["asyncstream/samples"]] == [batches, 2 * batches]
    for _, share in logged["asyncstream/stall_share"]:
        assert 0.0 <= share <= 1.0
    for _, rate in logged["asyncstream/samples_per_s"]:
        assert rate > 0
        assert math.isfinite(rate)
    for _, waited in logged["asyncstream/waited_s"]:
        assert waited > 0  # the first batch, at least, is waited for
    # Without workers the stream's own meter counts the loader's next() calls in this
    # process; with workers, each worker's stream is elsewhere: no loader share.
    if workers == 0:
        shares = [v for _, v in logged["asyncstream/loader_stall_share"]]
        assert len(shares) == 2
        assert all(0.0 <= s <= 1.0 for s in shares)
    else:
        assert "asyncstream/loader_stall_share" not in logged
    assert [f.samples for f in callback.epochs] == [total, total]
    # TensorBoard keeps a scalar as a float32: the callback's value, so stored, exactly
    # (rounding both to 6 places failed where the float32 fell across a rounding edge).
    assert [float(np.float32(f.stall_share)) for f in callback.epochs] == [
        v for _, v in logged["asyncstream/stall_share"]
    ]


def test_stall_logger_names_the_unit_and_prefix(
    tmp_path: Path, s3_server: LocalS3, dataset_url: str, shards: ForeignShards
) -> None:
    from asyncstream import StallLogger

    stream = ShardStream(
        dataset_url, endpoint_url=s3_server.endpoint_url, samples_per_shard=shards.counts
    )
    callback = StallLogger(unit="images", prefix="data/")
    assert repr(callback) == "StallLogger(unit='images', prefix='data/')"
    trainer = trainer_for(tmp_path, callback, epochs=1)
    with stream:
        trainer.fit(Model(), ShardLoader(stream, batch_size=BATCH, collate_fn=collate))
    logged = scalars(tmp_path)
    assert [v for _, v in logged["data/images"]] == [float(sum(shards.counts))]
    assert len(logged["data/images_per_s"]) == 1
    assert not any(name.startswith("asyncstream/") for name in logged)


def test_an_epoch_cut_short_by_max_steps_is_logged_with_the_batches_it_had(
    tmp_path: Path, s3_server: LocalS3, dataset_url: str, shards: ForeignShards
) -> None:
    from asyncstream import StallLogger

    stream = ShardStream(
        dataset_url, endpoint_url=s3_server.endpoint_url, samples_per_shard=shards.counts
    )
    loader = ShardLoader(stream, batch_size=BATCH, collate_fn=collate)
    batches = len(loader)
    callback = StallLogger()
    trainer = trainer_for(tmp_path, callback, epochs=3, max_steps=batches + 2)
    with stream:
        trainer.fit(Model(), loader)
    assert [(f.epoch, f.batches) for f in callback.epochs] == [(0, batches), (1, 2)]
    logged = scalars(tmp_path)
    assert [v for _, v in logged["asyncstream/batches"]] == [float(batches), 2.0]
    assert [s for s, _ in logged["asyncstream/batches"]] == [batches, batches + 2]
