"""dali_ops on the CPU, with real DALI: reference equality, exact resume, bad images, API."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from asyncstream import DecodeError, ShardStream, StateError, pack
from asyncstream.testing import generate_imagefolder
from dali_ops import DALIImageLoader, PipelineSettings, build_pipeline
from dali_ops._checks import IMAGE_KEYS, check_image

SETTINGS = PipelineSettings(image_size=64, num_threads=2, seed=7)
N_IMAGES = 96  # 5 shards of 20, 20, 20, 20, 16 samples


@dataclass
class Dataset:
    folder: Path
    members: dict[str, tuple[str, bytes, int]]  # key -> (shard URL, jpg, label)


def read_shards(folder: Path) -> dict[str, tuple[str, bytes, int]]:
    members: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.glob("*.tar")):
        with tarfile.open(path) as tar:
            for info in tar.getmembers():
                key, _, ext = info.name.partition(".")
                data = tar.extractfile(info).read()  # type: ignore[union-attr]
                members.setdefault(key, {"url": path.resolve().as_uri()})[ext] = data
    return {k: (m["url"], m["jpg"], int(m["cls"])) for k, m in members.items()}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    root = tmp_path_factory.mktemp("dali")
    generate_imagefolder(root / "images", N_IMAGES, 4, seed=0, workers=1)
    pack(root / "images", str(root / "shards"), shard_samples=20, shard_bytes=None, workers=1)
    return Dataset(root / "shards", read_shards(root / "shards"))


def make_stream(folder: Path, **kwargs: Any) -> ShardStream:
    return ShardStream(str(folder), window=4, inflight=2, seed=0, **kwargs)


def make_loader(folder: Path, batch_size: int = 20, **kwargs: Any) -> DALIImageLoader:
    kwargs.setdefault("settings", SETTINGS)
    stream_args = kwargs.pop("stream_args", {})
    return DALIImageLoader(make_stream(folder, **stream_args), batch_size, device="cpu", **kwargs)


def take(loader: DALIImageLoader, n: int | None = None) -> list[tuple[Any, ...]]:
    """``(keys, labels, images)`` of up to ``n`` batches."""
    out = []
    for images, labels in loader:
        keys = [key for _, key in loader.last_keys]
        out.append((keys, labels.tolist(), images.clone()))
        if n is not None and len(out) == n:
            break
    return out


def reference(
    settings: PipelineSettings, batches: list[list[bytes]], batch_size: int
) -> Iterator[np.ndarray]:
    """DALI's own output for these encoded images, batch by batch."""
    queue = list(batches)

    def source() -> tuple[list[np.ndarray], np.ndarray]:
        if not queue:
            raise StopIteration
        images = queue.pop(0)
        return [np.frombuffer(b, np.uint8) for b in images], np.zeros(len(images), np.int64)

    pipe = build_pipeline(settings, source, batch_size=batch_size, device="cpu")
    while True:
        try:
            images, _ = pipe.run()
        except StopIteration:
            return
        yield np.array(images.as_tensor())


# -- decode equals DALI's own ------------------------------------------------------------


@pytest.mark.parametrize(
    ("train", "dtype"), [(False, "float32"), (True, "float32"), (True, "float16")]
)
def test_batches_equal_dali_reference(dataset: Dataset, train: bool, dtype: Any) -> None:
    settings = PipelineSettings(image_size=64, num_threads=2, seed=11, train=train, dtype=dtype)
    with make_loader(dataset.folder, settings=settings) as loader:
        got = take(loader)
    assert [len(keys) for keys, _, _ in got] == [20, 20, 20, 20, 16]
    assert sorted(k for keys, _, _ in got for k in keys) == sorted(dataset.members)
    encoded = [[dataset.members[k][1] for k in keys] for keys, _, _ in got]
    expected = list(reference(settings, encoded, 20))
    assert len(expected) == len(got)
    for (keys, labels, images), ref in zip(got, expected, strict=True):
        assert labels == [dataset.members[k][2] for k in keys]  # labels are the cls members
        assert images.dtype == getattr(torch, dtype)
        assert images.shape == (len(keys), 3, 64, 64)
        assert torch.equal(images, torch.from_numpy(ref))


def test_train_and_eval_differ_and_are_normalised(dataset: Dataset) -> None:
    with make_loader(dataset.folder, 32, train=False) as loader:
        images, labels = next(iter(loader))
    assert labels.dtype == torch.int64
    assert labels.shape == (32,)
    assert -3.0 < float(images.mean()) < 3.0  # normalised, not 0-255
    assert float(images.std()) > 0.1


# -- exact resume --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def uninterrupted(dataset: Dataset) -> dict[int, list[tuple[Any, ...]]]:
    runs = {}
    with make_loader(dataset.folder, 16, train=False) as loader:
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            runs[epoch] = take(loader)
    assert runs[0]
    assert [b[0] for b in runs[0]] != [b[0] for b in runs[1]]
    return runs


@pytest.mark.parametrize(("epoch", "after"), [(0, 1), (0, 3), (1, 5)])
def test_resume_is_exact(
    dataset: Dataset, uninterrupted: dict[int, list[tuple[Any, ...]]], epoch: int, after: int
) -> None:
    with make_loader(dataset.folder, 16, train=False) as first:
        first.set_epoch(epoch)
        head = take(first, after)  # DALI has prefetched further than this
        state = json.loads(json.dumps(first.state_dict()))
    assert state["batches"] == after
    with make_loader(dataset.folder, 16, train=False) as second:
        second.load_state_dict(state)
        assert second.state_dict()["stream"] == state["stream"]
        rest = take(second)
    full = uninterrupted[epoch]
    assert len(full) == 6  # 96 images in batches of 16
    assert [b[:2] for b in head + rest] == [b[:2] for b in full]  # keys and labels
    for (_, _, got), (_, _, want) in zip(rest, full[after:], strict=True):
        assert torch.equal(got, want)  # eval mode: the images too


def test_state_before_first_batch_and_after_epoch(dataset: Dataset) -> None:
    with make_loader(dataset.folder) as loader:
        start = loader.state_dict()
        assert start["batches"] == 0
        take(loader)
        end = loader.state_dict()
    with make_loader(dataset.folder) as loader:
        loader.load_state_dict(end)
        assert take(loader) == []
        loader.load_state_dict(start)
        assert len(take(loader)) == 5


# -- batches ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("drop_last", "sizes"), [(False, [20] * 4 + [16]), (True, [20] * 4)])
def test_last_partial_batch(dataset: Dataset, drop_last: bool, sizes: list[int]) -> None:
    with make_loader(dataset.folder, drop_last=drop_last) as loader:
        assert len(loader) == len(sizes)
        got = take(loader)
        assert [len(keys) for keys, _, _ in got] == sizes
        stats = loader.stats()
    assert stats["batches"] == len(sizes)
    assert stats["images"] == sum(sizes)
    assert stats["dropped_last"] == N_IMAGES - sum(sizes)
    assert stats["skipped"] == 0
    assert stats["device"] == "cpu"


def test_set_epoch_forwards_to_stream(dataset: Dataset) -> None:
    stream = make_stream(dataset.folder)
    with DALIImageLoader(stream, 48, 32, device="cpu", settings=SETTINGS) as loader:
        loader.set_epoch(3)
        assert stream.epoch == 3
        assert loader.state_dict()["stream"]["epoch"] == 3


# -- undecodable images ---------------------------------------------------------------------

BAD_POSITION = 13  # shard 1, sample 3; batches of 4 -> batch 3 holds it


def corrupt(kind: str, good: bytes) -> bytes:
    if kind == "garbage":
        return b"this is not an image" * 50
    if kind == "truncated":
        return good[: len(good) // 2]
    raise AssertionError(kind)


@pytest.fixture(scope="module", params=["garbage", "truncated"])
def bad_dataset(
    request: pytest.FixtureRequest, dataset: Dataset, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, str, str]:
    """2 shards of 10 samples; sample 13 is corrupt. Returns (folder, bad URL, bad key)."""
    folder = tmp_path_factory.mktemp(f"bad-{request.param}")
    items = sorted(dataset.members.items())[:20]
    for shard in range(2):
        with tarfile.open(folder / f"shard-{shard}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
            for i, (key, (_, jpg, label)) in enumerate(items[shard * 10 : shard * 10 + 10]):
                if shard * 10 + i == BAD_POSITION:
                    jpg = corrupt(request.param, jpg)
                for ext, data in (("jpg", jpg), ("cls", str(label).encode())):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return folder, (folder / "shard-1.tar").resolve().as_uri(), items[BAD_POSITION][0]


def bad_loader(folder: Path, **kwargs: Any) -> DALIImageLoader:
    stream_args = {"shuffle": False, "samples_per_shard": 10}
    return make_loader(folder, 4, train=False, stream_args=stream_args, **kwargs)


@pytest.mark.parametrize("precheck", ["header", "none"])
def test_undecodable_raises_naming_shard_and_key(
    bad_dataset: tuple[Path, str, str], precheck: str
) -> None:
    folder, url, key = bad_dataset
    with bad_loader(folder, precheck=precheck) as loader:
        delivered = []
        batches = iter(loader)
        for _ in range(BAD_POSITION // 4):  # every earlier batch comes first
            next(batches)
            delivered.append(loader.last_keys)
        with pytest.raises(DecodeError) as caught:
            next(batches)
        assert url in str(caught.value)
        assert repr(key) in str(caught.value)
        assert [len(keys) for keys in delivered] == [4] * (BAD_POSITION // 4)
        state = loader.state_dict()
        assert next(iter(loader))[0].shape[0] == 4  # a new pass works
    # The state points at the failed batch: resuming with "skip" loses nothing else.
    with bad_loader(folder, precheck=precheck, on_error="skip") as loader:
        loader.load_state_dict(state)
        rest = [k for keys, _, _ in take(loader) for k in keys]
    assert len(rest) == 20 - 12 - 1
    assert key not in rest


@pytest.mark.parametrize("precheck", ["header", "markers", "none"])
def test_undecodable_skipped_and_counted(bad_dataset: tuple[Path, str, str], precheck: str) -> None:
    folder, url, key = bad_dataset
    with bad_loader(folder, precheck=precheck, on_error="skip") as loader:
        got = take(loader)
        stats = loader.stats()
    keys = [k for batch_keys, _, _ in got for k in batch_keys]
    assert len(keys) == 19
    assert len(set(keys)) == 19
    assert key not in keys
    assert stats["skipped"] == 1
    assert stats["images"] == 19
    assert stats["skipped_samples"][0][:2] == (url, key)
    assert stats["rebuilds"] == (1 if precheck == "none" else 0)  # DALI failed, then recovered


@pytest.mark.parametrize(
    ("data", "level", "problem"),
    [
        (b"", "markers", "empty"),
        (b"GIF89a" + bytes(100), "markers", "signature"),
        (b"\xff\xd8\xff\xe0" + bytes(100), "markers", "truncated"),
        (b"\xff\xd8\xff\xe0" + bytes(100) + b"\xff\xd9", "markers", None),
        (b"\xff\xd8\xff\xe0" + bytes(100) + b"\xff\xd9", "header", "header"),
        (b"garbage", "none", None),
    ],
)
def test_check_image(data: bytes, level: Any, problem: str | None) -> None:
    found = check_image(data, level)
    assert (found is None) if problem is None else (problem in str(found))


def test_check_image_accepts_real_images(dataset: Dataset) -> None:
    for _, jpg, _ in list(dataset.members.values())[:5]:
        assert check_image(jpg, "header") is None
    png = io.BytesIO()
    Image.new("RGB", (8, 8)).save(png, "PNG")
    assert check_image(png.getvalue(), "header") is None


# -- what pack writes, the loader reads --------------------------------------------------

# One flat colour per image, so that any resize or crop leaves it as it is; with mean 0 and
# std 1 the loader's output is the colour itself.
RAW = PipelineSettings(
    image_size=8, num_threads=2, seed=0, train=False, mean=(0, 0, 0), std=(1, 1, 1)
)
FORMATS: dict[str, dict[str, Any]] = {
    "png": {},
    "webp": {"lossless": True},
    "bmp": {},
    "gif": {},
    "tif": {},
    "jpg": {"quality": 95},
}


def colour(index: int) -> tuple[int, int, int]:
    return (20 + 37 * index % 200, 200 - 23 * index % 180, 60 + 51 * index % 150)


@pytest.fixture(scope="module")
def format_tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """Two classes, two flat-colour images per format in each; {source: (colour, label)}."""
    root = tmp_path_factory.mktemp("formats") / "images"
    expected: dict[str, Any] = {}
    index = 0
    for label, name in enumerate(("cat", "dog")):
        (root / name).mkdir(parents=True)
        for ext, options in FORMATS.items():
            for copy in range(2):
                rel = f"{name}/img_{copy}.{ext}"
                Image.new("RGB", (24, 20), colour(index)).save(root / rel, **options)
                if ext == "jpg" and copy == 1:  # a trailer after the end marker, as phones add
                    with (root / rel).open("ab") as f:
                        f.write(b"\xff\xd9 appended video " * 20)
                expected[rel] = (colour(index), label)
                index += 1
    return root, expected


def sources_by_key(folder: Path) -> dict[str, str]:
    found: dict[str, str] = {}
    for path in folder.glob("*.tar"):
        with tarfile.open(path) as tar:
            for info in tar:
                if info.name.endswith(".json"):
                    meta = json.loads(tar.extractfile(info).read())  # type: ignore[union-attr]
                    found[info.name.partition(".")[0]] = meta["source"]
    return found


@pytest.mark.parametrize("to_jpeg", [False, True])
def test_every_format_pack_writes_decodes_in_the_default_loader(
    format_tree: tuple[Path, dict[str, Any]], tmp_path: Path, to_jpeg: bool
) -> None:
    root, expected = format_tree
    pack(root, str(tmp_path / "shards"), shard_samples=5, shard_bytes=None, to_jpeg=to_jpeg)
    sources = sources_by_key(tmp_path / "shards")
    seen = []
    with make_loader(tmp_path / "shards", 7, settings=RAW) as loader:
        for images, labels in loader:
            for (_, key), image, label in zip(loader.last_keys, images, labels, strict=True):
                want, want_label = expected[sources[key]]
                assert int(label) == want_label
                pixels = image.reshape(3, -1)
                # lossless formats exactly; JPEG within a few levels
                tolerance = 3 if to_jpeg or sources[key].endswith(".jpg") else 0
                assert (pixels - torch.tensor(want)[:, None]).abs().max() <= tolerance, sources[key]
                seen.append(sources[key])
        assert loader.stats()["skipped"] == 0
    assert sorted(seen) == sorted(expected)


def write_tar(path: Path, entries: list[tuple[str, bytes]]) -> str:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in entries:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path.resolve().as_uri()


def meta(source: str) -> bytes:
    return json.dumps({"source": source, "class": "cat", "label": 0}).encode()


@pytest.fixture(scope="module")
def sourced_shards(dataset: Dataset, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Shards of 4 samples with json sources: 000002 does not decode (garbage, or corrupt
    data only DALI finds); in the third, 000002 has no image member at all."""
    folder = tmp_path_factory.mktemp("sourced")
    good = [jpg for _, jpg, _ in sorted(dataset.members.values())[:4]]
    # header and end marker intact, the data not: passes the pre-check, DALI fails on it
    corrupt = good[2][:200] + bytes(range(256)) * 2 + good[2][-300:]
    shards = {}
    for name, bad in (("garbage", b"plain text, not an image" * 20), ("corrupt", corrupt)):
        entries = []
        for i, jpg in enumerate(good):
            key = f"{i:06d}"
            image = bad if i == 2 else jpg
            entries += [
                (f"{key}.jpg", image),
                (f"{key}.cls", b"0"),
                (f"{key}.json", meta(f"cat/{i}.png")),
            ]
        (folder / name).mkdir()
        shards[name] = write_tar(folder / name / "shard.tar", entries)
    (folder / "missing").mkdir()
    entries = []
    for i, jpg in enumerate(good):
        key = f"{i:06d}"
        if i != 2:
            entries.append((f"{key}.jpg", jpg))
        entries += [(f"{key}.cls", b"0"), (f"{key}.json", meta(f"cat/{i}.png"))]
        if i == 2:
            entries.append((f"{key}.txt", b"a caption"))
    shards["missing"] = write_tar(folder / "missing" / "shard.tar", entries)
    return {"folder": folder, **shards}


def sourced_loader(folder: Path, **kwargs: Any) -> DALIImageLoader:
    stream_args = {"shuffle": False, "samples_per_shard": 4}
    return make_loader(folder, 2, train=False, stream_args=stream_args, **kwargs)


@pytest.mark.parametrize(
    ("shard", "precheck", "why"),
    [
        ("garbage", "markers", "unknown signature"),
        ("garbage", "none", "DALI cannot decode it"),
        ("corrupt", "markers", "DALI cannot decode it"),
    ],
)
def test_decode_error_names_the_source_file(
    sourced_shards: dict[str, Any], shard: str, precheck: str, why: str
) -> None:
    url = sourced_shards[shard]
    with (
        sourced_loader(sourced_shards["folder"] / shard, precheck=precheck) as loader,
        pytest.raises(DecodeError) as caught,
    ):
        list(loader)
    assert f"{url}: sample '000002' (source 'cat/2.png'): " in str(caught.value)
    assert why in str(caught.value)
    with sourced_loader(
        sourced_shards["folder"] / shard, precheck=precheck, on_error="skip"
    ) as loader:
        keys = [k for batch_keys, _, _ in take(loader) for k in batch_keys]
        (skipped,) = loader.stats()["skipped_samples"]
    assert keys == ["000000", "000001", "000003"]
    assert skipped[:2] == (url, "000002")
    assert skipped[3] == "cat/2.png"


def test_a_sample_without_an_image_member_is_named_with_its_members(
    sourced_shards: dict[str, Any],
) -> None:
    url = sourced_shards["missing"]
    with (
        sourced_loader(sourced_shards["folder"] / "missing") as loader,
        pytest.raises(DecodeError) as caught,
    ):
        list(loader)
    message = str(caught.value)
    assert f"{url}: sample '000002' (source 'cat/2.png'): no image member" in message
    assert "it has 'cls', 'json', 'txt'" in message
    assert ", ".join(repr(k) for k in IMAGE_KEYS) in message
    with (
        sourced_loader(sourced_shards["folder"] / "garbage", image_keys=("png", "webp")) as loader,
        pytest.raises(DecodeError, match=r"'000000'.*it has 'cls', 'jpg', 'json'.*'png', 'webp'"),
    ):
        list(loader)


def test_imagenet_style_upper_case_jpeg_members_decode(dataset: Dataset, tmp_path: Path) -> None:
    """A shard made with plain tar from ImageNet's folders: n01440764_10026.JPEG beside its
    label. The reader lower-cases the extension, as webdataset does, so the loader's
    default image keys (``jpeg`` among them) find the image."""
    folder = tmp_path / "imagenet"
    folder.mkdir()
    originals = sorted(dataset.members.items())[:12]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for i, (_, (_, jpg, label)) in enumerate(originals):
            for name, data in (
                (f"n01440764_{i:05d}.JPEG", jpg),
                (f"n01440764_{i:05d}.CLS", b"%d" % label),
            ):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    (folder / "train-0000.tar").write_bytes(buf.getvalue())
    assert "jpeg" in IMAGE_KEYS
    with make_loader(folder, batch_size=4, train=False) as loader:
        batches = take(loader)
    assert sum(len(keys) for keys, _, _ in batches) == 12
    expected = {f"n01440764_{i:05d}": label for i, (_, (_, _, label)) in enumerate(originals)}
    got = {
        key: label for keys, labels, _ in batches for key, label in zip(keys, labels, strict=True)
    }
    assert got == expected
    for keys, _, images in batches:
        assert images.shape == (len(keys), 3, 64, 64)
        assert images.abs().sum() > 0


# -- lifetime and arguments -----------------------------------------------------------------


def test_close_and_context_manager(dataset: Dataset) -> None:
    stream = make_stream(dataset.folder)
    with DALIImageLoader(stream, 8, 32, device="cpu", settings=SETTINGS) as loader:
        next(iter(loader))  # closed mid-pass, with batches in flight
    with pytest.raises(RuntimeError, match="closed"):
        iter(loader)
    with pytest.raises(RuntimeError, match="closed"):
        loader.state_dict()
    with pytest.raises(RuntimeError, match="closed"):
        stream.state_dict()  # the loader owns its stream
    loader.close()  # idempotent
    assert next(loader, None) is None


@pytest.fixture(scope="module")
def idle_stream(dataset: Dataset) -> Iterator[ShardStream]:
    with make_stream(dataset.folder) as stream:
        yield stream


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": 2.5}, "batch_size"),
        ({"image_size": 0}, "image_size"),
        ({"device": "tpu"}, "device"),
        ({"drop_last": "yes"}, "drop_last"),
        ({"on_error": "ignore"}, "on_error"),
        ({"precheck": "full"}, "precheck"),
        ({"settings": {"image_size": 8}}, "settings"),
        ({"image_keys": ()}, "image_keys"),
        ({"image_keys": "jpg"}, "image_keys"),
        ({"image_keys": ("jpg", "")}, "image_keys"),
        ({"label_key": None}, "label_key"),
    ],
)
def test_bad_loader_arguments(idle_stream: ShardStream, kwargs: dict[str, Any], name: str) -> None:
    args: dict[str, Any] = {"batch_size": 4, "device": "cpu", **kwargs}
    with pytest.raises(ValueError, match=name):
        DALIImageLoader(idle_stream, **args)


def test_bad_stream_and_state(idle_stream: ShardStream) -> None:
    with pytest.raises(ValueError, match="stream"):
        DALIImageLoader([b"not a stream"], 4, device="cpu")  # type: ignore[arg-type]
    loader = DALIImageLoader(idle_stream, 4, device="cpu")
    for state in ({}, {"version": 1, "batches": -1, "stream": {}}, {"version": 1, "batches": 0}):
        with pytest.raises(StateError):
            loader.load_state_dict(state)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_mixed_without_cuda_is_refused(idle_stream: ShardStream) -> None:
    with pytest.raises(ValueError, match="device"):
        DALIImageLoader(idle_stream, 4, device="mixed")


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"image_size": 0}, "image_size"),
        ({"dtype": "int8"}, "dtype"),
        ({"mean": (1.0, 2.0)}, "mean"),
        ({"std": (1.0, 0.0, 1.0)}, "std"),
        ({"num_threads": 0}, "num_threads"),
        ({"prefetch_queue_depth": 0}, "prefetch_queue_depth"),
        ({"hw_decoder_load": 1.5}, "hw_decoder_load"),
        ({"crop_ratio": 0.0}, "crop_ratio"),
        ({"random_area": (0.5, 0.1)}, "random_area"),
        ({"random_aspect_ratio": (0.0, 1.0)}, "random_aspect_ratio"),
        ({"seed": -1}, "seed"),
        ({"train": "yes"}, "train"),
    ],
)
def test_bad_settings(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        PipelineSettings(**kwargs)


def test_settings_repr_is_readable() -> None:
    text = repr(PipelineSettings(image_size=64))
    assert text.startswith("PipelineSettings(image_size=64, train=True")
    assert "dtype='float32'" in text
