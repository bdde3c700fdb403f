"""DALIImageLoader's feed: producer thread and DataLoader workers, exact resume, errors, stall.

The loaders here decode on the CPU with real DALI; the pipeline is checked against Pillow
and numpy in ``test_dali_reference.py``.
"""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import tarfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asyncstream import DecodeError, ShardStream, pack
from asyncstream.testing import generate_imagefolder
from dali_ops import DALIImageLoader, PipelineSettings, _batch, build_pipeline
from dali_ops._stages import stage_limit

# This machine may have fewer cores than a test's workers: torch's advice, not an error.
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

HERE = Path(__file__).parent
SETTINGS = PipelineSettings(image_size=32, num_threads=2, seed=7, train=False)
N_IMAGES = 120  # 6 shards of 20
BATCH = 16

Keys = list[tuple[str, str]]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dali-feed")
    generate_imagefolder(root / "images", N_IMAGES, 4, seed=1, workers=1)
    pack(root / "images", str(root / "shards"), shard_samples=20, shard_bytes=None, workers=1)
    return root / "shards"


def make(folder: Path, workers: int = 0, batch_size: int = BATCH, **kwargs: Any) -> DALIImageLoader:
    stream = ShardStream(str(folder), window=4, inflight=2, seed=0, **kwargs.pop("stream", {}))
    kwargs.setdefault("settings", SETTINGS)
    return DALIImageLoader(stream, batch_size, device="cpu", workers=workers, **kwargs)


def read_pass(loader: DALIImageLoader, n: int | None = None) -> list[Keys]:
    """Each batch's ``(shard URL, key)`` pairs, for up to ``n`` batches."""
    out = []
    for images, labels in loader:
        assert images.shape[0] == labels.shape[0] == len(loader.last_keys)
        out.append(loader.last_keys)
        if n is not None and len(out) == n:
            break
    return out


def flat(batches: list[Keys]) -> list[tuple[str, str]]:
    return [pair for batch in batches for pair in batch]


@pytest.fixture(scope="module")
def all_keys(folder: Path) -> Counter[tuple[str, str]]:
    with ShardStream(str(folder), shuffle=False) as stream:
        return Counter((s["__url__"], s["__key__"]) for s in stream)


# -- every sample once, on every path --------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2, 4])
def test_every_sample_once_per_epoch_and_len_is_the_truth(
    folder: Path, all_keys: Counter[tuple[str, str]], workers: int
) -> None:
    with make(folder, workers) as loader:
        epochs = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            epochs.append(read_pass(loader))
            assert len(loader) == len(epochs[-1])
        stats = loader.stats()
    for batches in epochs:
        assert Counter(flat(batches)) == all_keys
    assert flat(epochs[0]) != flat(epochs[1])  # a new epoch, a new order
    assert stats["images"] == 2 * N_IMAGES
    assert stats["builds"] == 1  # one pipeline for both epochs
    assert stats["workers"] == workers
    # the producer thread's own CPU: counted where it runs in this process, and only there
    assert (stats["feed_cpu_seconds"] > 0) == (workers == 0)
    if workers:
        assert sorted(stats["stream"]["workers"]) == list(range(workers))


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("workers", [0, 3])
def test_short_batches_and_len(folder: Path, workers: int, drop_last: bool) -> None:
    with make(folder, workers, batch_size=25, drop_last=drop_last) as loader:
        sizes = [len(b) for b in read_pass(loader)]
        dropped = loader.stats()["dropped_last"]
        assert len(loader) == len(sizes)
    readers = max(1, workers)
    per_reader = N_IMAGES // readers  # 120 over 1 or 3 readers: 120 or 40 each
    whole, rest = divmod(per_reader, 25)
    per_reader_sizes = [25] * whole + ([] if drop_last or not rest else [rest])
    assert sorted(sizes) == sorted(per_reader_sizes * readers)
    assert dropped == (rest * readers if drop_last else 0)


def test_workers_spread_the_reading_over_processes(folder: Path) -> None:
    with make(folder, 2) as loader:
        read_pass(loader)
        stats = loader.stats()
    workers = stats["stream"]["workers"]
    # Each worker read its own half through its own engine.
    assert [workers[w]["samples"] for w in (0, 1)] == [N_IMAGES // 2] * 2
    assert stats["node_ring_bytes"] == 2 * stats["ring_bytes"]
    assert stats["batch_buffers_bytes"] > 0  # the workers' batch buffers, mapped here
    with make(folder) as loader:
        read_pass(loader, 1)
        # the feed thread's own buffers, reused: a few batches' worth, in whole MiB
        kept = loader.stats()["batch_buffers_bytes"]
        assert kept > 0
        assert kept % (1 << 20) == 0


# -- exact resume --------------------------------------------------------------------------


def resume_in_child(folder: Path, tmp_path: Path, workers: int, state: Any, epoch: int) -> Any:
    spec = {
        "folder": str(folder),
        "workers": workers,
        "batch_size": BATCH,
        "epoch": epoch,
        "epochs": 2,
        "state": state,
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    subprocess.run(
        [
            sys.executable,
            str(HERE / "_dali_resume_child.py"),
            str(tmp_path / "spec.json"),
            str(tmp_path / "out.json"),
        ],
        check=True,
        timeout=240,
    )
    out = json.loads((tmp_path / "out.json").read_text())
    epochs = [[[tuple(pair) for pair in batch] for batch in e] for e in out["epochs"]]
    return epochs, out["builds"]


@pytest.mark.parametrize(
    ("before", "after", "at"),
    [(0, 0, 2), (2, 2, 3), (4, 4, 1), (2, 4, 3), (4, 0, 2), (0, 2, 4)],
)
def test_resume_in_a_fresh_process_is_exact(
    folder: Path, tmp_path: Path, before: int, after: int, at: int
) -> None:
    with make(folder, before) as loader:
        epoch0 = read_pass(loader, at)
        state = json.loads(json.dumps(loader.state_dict()))
        epoch0 += read_pass_rest(loader)
        loader.set_epoch(1)
        epoch1 = read_pass(loader)
    assert state["batches"] == at
    (rest0, rest1), builds = resume_in_child(folder, tmp_path, after, state, 0)
    assert builds == 1  # the resumed loader builds one pipeline for both epochs
    if before == after:  # the same readers: exactly the batches that would have come
        assert rest0 == epoch0[at:]
        assert rest1 == epoch1
    else:  # other readers: what was left, each sample once, split over the new readers
        assert Counter(flat(epoch0[:at]) + flat(rest0)) == Counter(flat(epoch0))
        assert Counter(flat(rest1)) == Counter(flat(epoch1))


def read_pass_rest(loader: DALIImageLoader) -> list[Keys]:
    """The rest of a pass already begun (``iter`` again would start a new pass)."""
    out = []
    while True:
        try:
            next(loader)
        except StopIteration:
            return out
        out.append(loader.last_keys)


def test_resume_in_process_keeps_the_pipeline(folder: Path) -> None:
    with make(folder, 2) as loader:
        head = read_pass(loader, 2)
        state = loader.state_dict()
        loader.load_state_dict(state)
        rest = read_pass(loader)
        builds = loader.stats()["builds"]
    with make(folder, 2) as fresh:
        whole = read_pass(fresh)
    assert head + rest == whole
    assert builds == 1


# -- errors on every path -----------------------------------------------------------------


@pytest.fixture(scope="module")
def bad_folder(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """4 shards of 10 samples (from ``folder``'s); one image is garbage. Returns its key."""
    out = tmp_path_factory.mktemp("dali-feed-bad")
    with ShardStream(str(folder), shuffle=False) as stream:
        samples = [s for _, s in zip(range(40), stream, strict=False)]
    bad_key = samples[23]["__key__"]
    for shard in range(4):
        with tarfile.open(out / f"shard-{shard}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
            for sample in samples[shard * 10 : shard * 10 + 10]:
                jpg = b"not an image" * 40 if sample["__key__"] == bad_key else sample["jpg"]
                for ext, data in (("jpg", jpg), ("cls", sample["cls"])):
                    info = tarfile.TarInfo(f"{sample['__key__']}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return out, bad_key


@pytest.fixture(params=[True, False], ids=["native", "python"])
def native(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """The batch builder's native sink, or the Python one it is compared with (in this
    process, in forked workers, and through the environment in spawned ones)."""
    assert _batch._NATIVE is not None, "run `make install` (or setup.py build_ext)"
    monkeypatch.setattr(_batch, "NATIVE", request.param)
    monkeypatch.setenv("ASYNCSTREAM_NATIVE", "1" if request.param else "0")
    return bool(request.param)


@pytest.mark.parametrize("precheck", ["markers", "none"])
@pytest.mark.parametrize("workers", [0, 2])
def test_skip_on_every_path(
    bad_folder: tuple[Path, str], workers: int, precheck: str, native: bool
) -> None:
    folder, bad = bad_folder
    with make(
        folder,
        workers,
        batch_size=4,
        on_error="skip",
        precheck=precheck,
        stream={"samples_per_shard": 10},
    ) as loader:
        keys = [k for _, k in flat(read_pass(loader))]
        stats = loader.stats()
    assert len(keys) == len(set(keys)) == 39
    assert bad not in keys
    assert stats["skipped"] == 1
    assert stats["skipped_samples"][0][1] == bad
    assert stats["rebuilds"] == (1 if precheck == "none" else 0)


@pytest.mark.parametrize("precheck", ["markers", "none"])
@pytest.mark.parametrize("workers", [0, 2])
def test_raise_on_every_path_loses_nothing(
    bad_folder: tuple[Path, str], workers: int, precheck: str, native: bool
) -> None:
    folder, bad = bad_folder
    options = {"batch_size": 4, "precheck": precheck, "stream": {"samples_per_shard": 10}}
    delivered: list[str] = []

    def read_all(loader: DALIImageLoader) -> None:
        for _ in loader:
            delivered.extend(k for _, k in loader.last_keys)

    with make(folder, workers, **options) as loader:
        with pytest.raises(DecodeError) as caught:
            read_all(loader)
        state = loader.state_dict()
    assert repr(bad) in str(caught.value)
    assert "shard-" in str(caught.value)
    # A readable reason either way: the pre-check's, or (DALI's own failure) Pillow's.
    reason = "unknown signature" if precheck == "markers" else "cannot identify image file"
    assert reason in str(caught.value)
    # The state points at the failed batch: resuming with "skip" reads the rest, once.
    with make(folder, workers, on_error="skip", **options) as loader:
        loader.load_state_dict(state)
        rest = [k for _, k in flat(read_pass(loader))]
    assert bad not in delivered + rest
    assert len(delivered + rest) == len(set(delivered + rest)) == 39


def test_workers_and_ring_memory_checked_up_front(folder: Path) -> None:
    stream = ShardStream(str(folder), window=4, inflight=2, seed=0)
    with stream:
        assert stream.node_ring_bytes(3, check=False) == 3 * stream.ring_bytes
        refused = r"this node's rings \(.* x 100000 reader.*MiB of memory needed"
        with pytest.raises(ValueError, match=refused):
            DALIImageLoader(stream, 4, device="cpu", workers=100_000)
        with pytest.raises(ValueError, match="workers must be"):
            DALIImageLoader(stream, 4, device="cpu", workers=-1)


# -- is the loop waiting? -------------------------------------------------------------------


def test_loader_stall_meter_and_warning(folder: Path, caplog: pytest.LogCaptureFixture) -> None:
    with make(folder, 0, batch_size=2, stall_warning=0.01) as loader:
        with caplog.at_level(logging.WARNING, logger="dali_ops"):
            busy = 0
            for _ in loader:
                time.sleep(0.02)  # the model's step
                busy += 1
        stall = loader.stats()["stall"]
    epoch = stall["epoch"]
    assert epoch["calls"] == busy + 1  # the last call ends the pass
    assert epoch["worked_s"] / (busy * 0.02) == pytest.approx(1.0, abs=0.35)
    assert 0 < epoch["waited_share"] < 1
    # Below any loop's waiting: the warning is logged, naming a stage.
    assert any("the likely limit is" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("decode", "feed", "starved", "limit"),
    [(3.0, 1.0, 0.0, "decode"), (0.5, 2.0, 0.1, "feed"), (0.5, 2.0, 1.8, "fetch")],
)
def test_stage_limit_names_the_slow_stage(
    decode: float, feed: float, starved: float, limit: str
) -> None:
    assert stage_limit(decode, feed, starved) == limit


@pytest.mark.parametrize("workers", [0, 2])
def test_after_a_resumed_pass_the_next_pass_is_the_next_epoch(
    folder: Path, all_keys: Counter[tuple[str, str]], workers: int
) -> None:
    """A loaded state is spent by the pass that resumes it: the pass after reads the next
    epoch whole, with or without set_epoch, never the loaded state again."""
    with make(folder, workers) as loader:
        head = read_pass(loader, 2)
        state = json.loads(json.dumps(loader.state_dict()))
    with make(folder, workers) as loader:
        whole = read_pass(loader)
        following = read_pass(loader)  # epoch 1, by itself
    with make(folder, workers) as loader:
        loader.load_state_dict(state)
        rest = read_pass(loader)
        after = read_pass(loader)  # no set_epoch: the next epoch
    assert head + rest == whole
    assert Counter(flat(after)) == all_keys
    assert after == following


@pytest.fixture(scope="module")
def uniform(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Shards of 32 x 32 JPEGs of about one size (900 to 1,100 bytes): the feed pads them
    to one length in one array (see ``_feeds.prepare``)."""
    from PIL import Image

    root = tmp_path_factory.mktemp("dali-uniform")
    rng = np.random.default_rng(0)
    for i in range(N_IMAGES):
        (root / "images" / f"c{i % 4}").mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(64, 192, (32, 32, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / "images" / f"c{i % 4}" / f"{i:04d}.jpg", quality=60)
    pack(root / "images", str(root / "shards"), shard_samples=20, shard_bytes=None, workers=1)
    return root / "shards"


def test_the_feed_pads_images_of_one_size_and_views_the_others(folder: Path, uniform: Path) -> None:
    """``prepare`` gives DALI one dense array of the images padded with zeros where that
    costs little memory, and a view of each where sizes are far apart."""
    from dali_ops._feeds import prepare

    kinds = {}
    for name, shards in (("photographs", folder), ("tiny", uniform)):
        with ShardStream(str(shards), shuffle=False) as stream:
            builder = _batch.BatchBuilder(
                BATCH, on_error="raise", precheck="markers", image_keys=("jpg",), label_key="cls"
            )
            batch = next(_batch.read_batches(stream, builder, drop_last=False))
            prepare(batch)
            sizes = [len(image) for image in batch.images]
            if batch.held is not None:
                rows = batch.held
                assert rows.shape == (len(sizes), max(sizes))
                for row, image, size in zip(rows, batch.images, sizes, strict=True):
                    assert bytes(row[:size]) == bytes(image)
                    assert not row[size:].any()
            kinds[name] = "padded" if batch.held is not None else "views"
            assert len(batch.inputs) == len(sizes)
    assert kinds == {"photographs": "views", "tiny": "padded"}


@pytest.mark.parametrize("data", ["folder", "uniform"])
@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_s_images_are_dali_s_own_over_the_same_bytes(
    request: pytest.FixtureRequest, data: str, workers: int, native: bool
) -> None:
    """Each batch the loader hands out (its images given to DALI as one tensor list: views
    into the batch's memory, or, for images of about one size, one array of them padded
    with zeros; in a thread or from workers' shared buffers) is what the same pipeline
    makes of the same encoded bytes given as a plain list, pixel for pixel, in the
    loader's order."""
    folder: Path = request.getfixturevalue(data)
    with ShardStream(str(folder), shuffle=False) as stream:
        encoded = {(s["__url__"], s["__key__"]): (s["jpg"], int(s["cls"])) for s in stream}
    got = []
    with make(folder, workers) as loader:
        for images, labels in loader:
            got.append((images.numpy().copy(), labels.tolist(), loader.last_keys))
    assert len(got) == N_IMAGES // BATCH + 1
    feed = [
        (
            [np.frombuffer(encoded[k][0], dtype=np.uint8) for k in keys],
            np.array([encoded[k][1] for k in keys], dtype=np.int64),
        )
        for _, _, keys in got
    ]

    def source() -> tuple[list[np.ndarray], np.ndarray]:
        if not feed:
            raise StopIteration
        return feed.pop(0)

    reference = build_pipeline(SETTINGS, source, batch_size=BATCH, device="cpu")
    for images, labels, _ in got:
        want_images, want_labels = reference.run()
        assert np.array_equal(images, np.asarray(want_images.as_tensor()))
        assert labels == np.asarray(want_labels.as_tensor()).tolist()
