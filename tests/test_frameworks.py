"""Training frameworks on the CPU: PyTorch Lightning, and plain DDP under torchrun (gloo).

Lightning calls ``set_epoch`` on samplers, never on an ``IterableDataset``: its epochs
differ because the stream advances its own. A ``LightningDataModule`` returns a
:class:`~asyncstream.ShardLoader` (a StatefulDataLoader), so Lightning's checkpoints hold
the loader's exact position. Skipped, with the reason, where ``lightning`` is not
installed (it is in the ``test`` extra).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from asyncstream import ShardLoader, ShardStream
from tests._foreign import ForeignShards, write_foreign_shards
from tests._torchrun import torchrun

STREAM: dict[str, Any] = {"window": 3, "inflight": 2, "chunk_bytes": 16 << 10, "seed": 3}

pytestmark = [
    # Lightning's advice for a 2-core machine, and its note on torch.load's default.
    pytest.mark.filterwarnings("ignore:.*does not have many workers:UserWarning"),
    pytest.mark.filterwarnings("ignore:.*weights_only.*:UserWarning"),
    # Resumed without the ModelCheckpoint that wrote the checkpoint: on purpose.
    pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`:UserWarning"),
    # Lightning's caution for any IterableDataset with __len__ and workers: ShardLoader's
    # len() is the batches made (checked below), which Lightning cannot know.
    pytest.mark.filterwarnings("ignore:Your `IterableDataset` has `__len__` defined:UserWarning"),
    # Lightning 2.6 on torch 2.13: its pytree calls use a name torch deprecates.
    pytest.mark.filterwarnings(
        "ignore:`isinstance.treespec, LeafSpec.` is deprecated:FutureWarning"
    ),
]


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> ForeignShards:
    return write_foreign_shards(tmp_path_factory.mktemp("frameworks"), 4, seed=2)


def collate(batch: list[dict[str, Any]]) -> dict[str, Any]:
    """A tensor for the model and the keys, to check the order."""
    x = torch.tensor([[float(len(s["jpg"]) % 7)] for s in batch])
    return {"x": x, "keys": [s["__key__"] for s in batch]}


# -- PyTorch Lightning ----------------------------------------------------------------------


def lightning_parts(data: ForeignShards, workers: int) -> tuple[Any, Any]:
    """A LightningDataModule over a ShardStream, and a model that records its batches."""
    L = pytest.importorskip(
        "lightning", reason="lightning is not installed (pip install lightning)"
    )

    class Data(L.LightningDataModule):
        def train_dataloader(self) -> ShardLoader:
            self.stream = ShardStream(str(data.folder), samples_per_shard=data.counts, **STREAM)
            return ShardLoader(self.stream, batch_size=4, num_workers=workers, collate_fn=collate)

        def teardown(self, stage: str) -> None:
            if hasattr(self, "stream"):
                self.stream.close()  # its engine process, at once

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.seen: list[tuple[int, list[str]]] = []

        def training_step(self, batch: dict[str, Any], index: int) -> torch.Tensor:
            self.seen.append((self.current_epoch, batch["keys"]))
            return self.layer(batch["x"]).pow(2).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return Data, Model


def trainer(**kwargs: Any) -> Any:
    import lightning as L

    return L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )


@pytest.fixture(scope="module", params=[0, 2], ids=["0-workers", "2-workers"])
def fitted(
    request: pytest.FixtureRequest, shards: ForeignShards, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """Three epochs under Lightning, a ModelCheckpoint every 5 steps."""
    workers = request.param
    Data, Model = lightning_parts(shards, workers)
    from lightning.pytorch.callbacks import ModelCheckpoint

    folder = tmp_path_factory.mktemp("checkpoints")
    every = ModelCheckpoint(dirpath=folder, every_n_train_steps=5, save_top_k=-1, filename="{step}")
    model = Model()
    fit = trainer(max_epochs=3, callbacks=[every])
    fit.fit(model, Data())
    return {
        "workers": workers,
        "seen": model.seen,
        "batches_per_epoch": fit.num_training_batches,
        "folder": folder,
    }


def test_lightning_epochs_each_read_the_dataset_in_a_new_order(
    shards: ForeignShards, fitted: dict[str, Any]
) -> None:
    epochs: dict[int, list[str]] = {}
    batches: dict[int, int] = {}
    for epoch, keys in fitted["seen"]:
        epochs.setdefault(epoch, []).extend(keys)
        batches[epoch] = batches.get(epoch, 0) + 1
    assert sorted(epochs) == [0, 1, 2]
    for keys in epochs.values():
        assert sorted(keys) == sorted(shards.keys)
    assert len({tuple(keys) for keys in epochs.values()}) == 3
    # len(loader), which Lightning trusts for the epoch's end, is the batches made.
    assert set(batches.values()) == {fitted["batches_per_epoch"]}


@pytest.mark.parametrize("step", [5, 30])  # mid-epoch 0, mid-epoch 1
def test_lightning_resumes_exactly_from_a_model_checkpoint(
    shards: ForeignShards, fitted: dict[str, Any], step: int
) -> None:
    Data, Model = lightning_parts(shards, fitted["workers"])
    model = Model()
    trainer(max_epochs=3, enable_checkpointing=False).fit(
        model, Data(), ckpt_path=str(fitted["folder"] / f"step={step}.ckpt")
    )
    assert model.seen == fitted["seen"][step:]  # epochs and batches, in order


def test_lightning_save_checkpoint_after_fit_returns_starts_the_next_epoch(
    shards: ForeignShards, fitted: dict[str, Any], tmp_path: Path
) -> None:
    """The documented limit: Lightning counts an epoch that ``max_steps`` stopped as
    completed and, resuming, starts a new one without restoring the loader; the loader's
    own state (ShardLoader keeps it when Lightning drops the iterator) stays exact."""
    Data, Model = lightning_parts(shards, fitted["workers"])
    data = Data()
    stopped = trainer(max_steps=7, enable_checkpointing=False)
    stopped.fit(Model(), data)
    stopped.save_checkpoint(tmp_path / "stopped.ckpt")
    loader_state = stopped.train_dataloader.state_dict()
    model = Model()
    trainer(max_epochs=2, enable_checkpointing=False).fit(
        model, Data(), ckpt_path=str(tmp_path / "stopped.ckpt")
    )
    first = [keys for epoch, keys in fitted["seen"] if epoch == 0]
    assert model.seen == [(1, keys) for keys in first]  # Lightning's epoch 1: a fresh pass
    with ShardStream(str(shards.folder), samples_per_shard=shards.counts, **STREAM) as stream:
        loader = ShardLoader(
            stream, batch_size=4, num_workers=fitted["workers"], collate_fn=collate
        )
        loader.load_state_dict(loader_state)
        assert [batch["keys"] for batch in loader] == first[7:]
        del loader


# -- plain DDP under torchrun ---------------------------------------------------------------

DDP = textwrap.dedent(
    """
    import json, sys
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from asyncstream import ShardLoader, ShardStream
    from tests.test_frameworks import STREAM, collate

    if __name__ == "__main__":
        spec, out = json.load(open(sys.argv[1])), sys.argv[2]
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        stream = ShardStream(spec["folder"], samples_per_shard=spec["counts"], **STREAM)
        loader = ShardLoader(stream, batch_size=4, num_workers=2, collate_fn=collate)
        model = DistributedDataParallel(torch.nn.Linear(1, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        seen, start = [], 0
        if spec["resume"]:
            checkpoint = torch.load(f"{out}/ckpt{rank}.pt")
            loader.load_state_dict(checkpoint["loader"])
            start = checkpoint["epoch"]
        for epoch in range(start, 2):  # the README's loop, with DDP
            stream.set_epoch(epoch)
            for step, batch in enumerate(loader):
                optimizer.zero_grad()
                model(batch["x"]).pow(2).mean().backward()  # gradients all-reduced
                optimizer.step()
                seen.append([epoch, batch["keys"]])
                if not spec["resume"] and epoch == 0 and step == 3:
                    state = {"epoch": epoch, "loader": loader.state_dict()}
                    torch.save(state, f"{out}/ckpt{rank}.pt")
        steps = [None] * dist.get_world_size()
        dist.all_gather_object(steps, len(seen))
        json.dump({"seen": seen, "steps": steps}, open(f"{out}/{spec['name']}{rank}.json", "w"))
        dist.destroy_process_group()
    """
)


@pytest.mark.slow
def test_ddp_under_torchrun_trains_two_epochs_and_resumes_exactly(
    shards: ForeignShards, tmp_path: Path
) -> None:
    script = tmp_path / "ddp.py"
    script.write_text(DDP)
    for name, resume in (("full", False), ("resumed", True)):
        spec = tmp_path / f"{name}.json"
        spec.write_text(
            json.dumps(
                {
                    "folder": str(shards.folder),
                    "counts": shards.counts,
                    "resume": resume,
                    "name": name,
                }
            )
        )
        result = torchrun(script, str(spec), str(tmp_path))
        assert result.returncode == 0, result.stderr[-3000:]
    full = [json.loads((tmp_path / f"full{r}.json").read_text()) for r in range(2)]
    resumed = [json.loads((tmp_path / f"resumed{r}.json").read_text()) for r in range(2)]
    for rank in range(2):
        assert resumed[rank]["seen"] == full[rank]["seen"][4:]  # after the 4th step
        assert full[rank]["steps"][0] == full[rank]["steps"][1]  # DDP: equal steps per rank
    for epoch in (0, 1):  # the ranks split each epoch exactly (an odd one out is dropped)
        keys = [k for r in full for e, batch in r["seen"] if e == epoch for k in batch]
        assert len(keys) == len(set(keys)) == shards.total - shards.total % 2
        assert set(keys) <= set(shards.keys)
