"""dali_ops with GPU decode (device="mixed"): the core checks of test_dali.py on CUDA."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from asyncstream import DecodeError, ShardStream, pack
from asyncstream.testing import generate_imagefolder
from dali_ops import DALIImageLoader, PipelineSettings, build_pipeline

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA and a GPU"),
]

SETTINGS = PipelineSettings(image_size=64, num_threads=2, seed=7)
Members = dict[str, tuple[bytes, int]]  # key -> (jpg, label)


def read_shards(folder: Path) -> Members:
    members: dict[str, dict[str, bytes]] = {}
    for path in sorted(folder.glob("*.tar")):
        with tarfile.open(path) as tar:
            for info in tar.getmembers():
                key, _, ext = info.name.partition(".")
                members.setdefault(key, {})[ext] = tar.extractfile(info).read()  # type: ignore[union-attr]
    return {k: (m["jpg"], int(m["cls"])) for k, m in members.items()}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Members]:
    root = tmp_path_factory.mktemp("dali-gpu")
    generate_imagefolder(root / "images", 96, 4, seed=0, workers=1)
    pack(root / "images", str(root / "shards"), shard_samples=20, shard_bytes=None, workers=1)
    return root / "shards", read_shards(root / "shards")


def make_loader(folder: Path, batch_size: int = 20, **kwargs: Any) -> DALIImageLoader:
    kwargs.setdefault("settings", SETTINGS)
    stream = ShardStream(str(folder), window=4, inflight=2, seed=0, **kwargs.pop("stream", {}))
    return DALIImageLoader(stream, batch_size, device="mixed", **kwargs)


def take(loader: DALIImageLoader, n: int | None = None) -> list[tuple[Any, ...]]:
    out = []
    for images, labels in loader:
        assert images.is_cuda
        assert labels.is_cuda
        assert labels.dtype == torch.int64
        out.append(([k for _, k in loader.last_keys], labels.tolist(), images.cpu()))
        if n is not None and len(out) == n:
            break
    return out


def reference(settings: PipelineSettings, batches: list[list[bytes]]) -> Iterator[np.ndarray]:
    queue = list(batches)

    def source() -> tuple[list[np.ndarray], np.ndarray]:
        if not queue:
            raise StopIteration
        images = queue.pop(0)
        return [np.frombuffer(b, np.uint8) for b in images], np.zeros(len(images), np.int64)

    device_id = torch.cuda.current_device()
    pipe = build_pipeline(settings, source, batch_size=20, device="mixed", device_id=device_id)
    while True:
        try:
            images, _ = pipe.run()
        except StopIteration:
            return
        yield np.array(images.as_cpu().as_tensor())


@pytest.mark.parametrize(("train", "dtype"), [(False, "float32"), (True, "float16")])
def test_gpu_batches_equal_dali_reference(
    dataset: tuple[Path, Members], train: bool, dtype: Any
) -> None:
    folder, members = dataset
    settings = PipelineSettings(image_size=64, num_threads=2, seed=11, train=train, dtype=dtype)
    with make_loader(folder, settings=settings) as loader:
        assert loader.device == "mixed"
        assert len(loader) == 5
        got = take(loader)
    assert [len(keys) for keys, _, _ in got] == [20, 20, 20, 20, 16]  # last partial batch
    expected = list(reference(settings, [[members[k][0] for k in keys] for keys, _, _ in got]))
    for (keys, labels, images), ref in zip(got, expected, strict=True):
        assert labels == [members[k][1] for k in keys]
        assert images.dtype == getattr(torch, dtype)
        assert torch.equal(images, torch.from_numpy(ref))


@pytest.mark.parametrize("after", [1, 3])
def test_gpu_resume_is_exact(dataset: tuple[Path, Members], after: int) -> None:
    folder, _ = dataset
    with make_loader(folder, 16, train=False) as loader:
        full = take(loader)
    with make_loader(folder, 16, train=False) as first:
        head = take(first, after)
        state = json.loads(json.dumps(first.state_dict()))
    with make_loader(folder, 16, train=False) as second:
        second.load_state_dict(state)
        rest = take(second)
    assert [b[:2] for b in head + rest] == [b[:2] for b in full]


@pytest.fixture(scope="module")
def bad_folder(
    dataset: tuple[Path, Members], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, str]:
    """One shard of 12 samples, the 6th of them garbage: (folder, its key)."""
    folder = tmp_path_factory.mktemp("dali-gpu-bad")
    items = sorted(dataset[1].items())[:12]
    with tarfile.open(folder / "shard-0.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
        for i, (key, (jpg, label)) in enumerate(items):
            data = b"not a jpeg" * 40 if i == 5 else jpg
            for ext, blob in (("jpg", data), ("cls", str(label).encode())):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(blob)
                tar.addfile(info, io.BytesIO(blob))
    return folder, items[5][0]


@pytest.mark.parametrize("precheck", ["header", "none"])
def test_gpu_undecodable(bad_folder: tuple[Path, str], precheck: str) -> None:
    folder, key = bad_folder
    stream = {"shuffle": False, "samples_per_shard": 12}
    with make_loader(folder, 4, precheck=precheck, stream=stream) as loader:
        with pytest.raises(DecodeError, match=r"shard-0\.tar") as caught:
            take(loader)
        assert repr(key) in str(caught.value)
    with make_loader(folder, 4, precheck=precheck, stream=stream, on_error="skip") as loader:
        keys = [k for batch, _, _ in take(loader) for k in batch]
        stats = loader.stats()
    assert len(keys) == 11
    assert key not in keys
    assert stats["skipped"] == 1
    assert stats["rebuilds"] == (1 if precheck == "none" else 0)


def test_gpu_workers_read_every_sample_once_and_resume(dataset: tuple[Path, Members]) -> None:
    folder, members = dataset
    settings = PipelineSettings(image_size=64, num_threads=2, seed=3, train=False)
    with make_loader(folder, 16, settings=settings, workers=2) as loader:
        full = take(loader)
        loader.set_epoch(1)
        head = take(loader, 2)
        state = json.loads(json.dumps(loader.state_dict()))
        builds = loader.stats()["builds"]
    assert sorted(k for keys, _, _ in full for k in keys) == sorted(members)
    assert builds == 1  # one pipeline across epochs
    with make_loader(folder, 16, settings=settings, workers=2) as loader:
        loader.set_epoch(1)
        whole = take(loader)
    with make_loader(folder, 16, settings=settings, workers=2) as second:
        second.load_state_dict(state)
        rest = take(second)
    assert [b[:2] for b in head + rest] == [b[:2] for b in whole]
    for (_, _, got), (_, _, want) in zip(rest, whole[2:], strict=True):
        assert torch.equal(got, want)  # eval mode: the same images


def test_gpu_eval_matches_pillow(dataset: tuple[Path, Members]) -> None:
    """nvJPEG and the GPU resize against Pillow: as close as the CPU pipeline, and every
    mistake far off (see test_dali_reference.py)."""
    from tests.test_dali_reference import MISTAKE, MISTAKES, difference, eval_reference, normalise

    _, members = dataset
    settings = PipelineSettings(image_size=64, num_threads=2, train=False)
    blobs = [jpg for jpg, _ in list(members.values())[:6]]
    for blob, got in zip(blobs, reference(settings, [blobs]).__next__(), strict=True):
        ref = eval_reference(blob)
        assert difference(got.astype(np.float64), normalise(ref)) < 0.03
        for name, wrong in MISTAKES.items():
            assert difference(got.astype(np.float64), wrong(ref)) > MISTAKE, name
