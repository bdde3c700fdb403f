"""The batch builder reads samples two ways: records handed over in bulk by the stream
(``iter_views().take``, the loader's way) and sample dicts one at a time (any iterator).
Both must build the same batches: images, labels, keys, source files, and the same skips
and errors, on a tar written by ``tarfile`` (not ``pack``) with every kind of bad sample.
The records go to the native sink (``_batchc``) or the Python one (``NATIVE = False``),
into the feed thread's own buffer or a worker's shared one: all four build the same."""

from __future__ import annotations

import io
import json
import re
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from asyncstream import DataError, DecodeError, ShardStream
from dali_ops import _batch
from dali_ops._batch import BatchBuilder, EncodedBatch
from dali_ops._shm import BatchBuffer, BufferPool

# How the records path is taken: native sink or Python, feed thread or worker buffer.
WAYS = [(True, False), (False, False), (True, True), (False, True)]


def jpeg(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (12, 12, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG")
    return out.getvalue()


def png(seed: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((5, 5), seed, dtype=np.uint8)).save(out, format="PNG")
    return out.getvalue()


# key -> members; every 5th sample is one kind of trouble, the others are good. A label
# that is missing or no integer is a data error that ends the epoch even when skipping:
# those two are in a folder of their own.
LABEL_TROUBLE = (15, 20)


def members(i: int, labels: bool) -> dict[str, bytes]:
    source = json.dumps({"source": f"{i}.jpg"}).encode()
    good = {"jpg": jpeg(i), "cls": b"%d" % (i % 7), "json": source}
    trouble = {
        5: {"jpg": b"garbage" * 30, "cls": b"1"},  # unknown signature
        10: {"jpg": jpeg(10)[:-40], "cls": b"2"},  # truncated: no end-of-image marker
        15: {"jpg": jpeg(15)},  # no label
        20: {"jpg": jpeg(20), "cls": b"cat"},  # a label that is no integer
        25: {"txt": b"hello", "cls": b"3"},  # no image member
        30: {"JPEG": jpeg(30), "cls": b"4"},  # upper case, as ImageNet's files
        35: {"png": png(35), "cls": b" 5\n"},  # a PNG, a label int() reads with blanks
        40: {"jpg": b"", "cls": b"6"},  # empty image
    }
    if (i in LABEL_TROUBLE) != labels:
        return good
    return trouble.get(i, good)


def write(out: Path, labels: bool) -> Path:
    for shard in range(3):
        with tarfile.open(out / f"part-{shard}.tar", "w", format=tarfile.GNU_FORMAT) as tar:
            for i in range(shard * 16, shard * 16 + 16):
                for ext, data in members(i, labels).items():
                    info = tarfile.TarInfo(f"s{i:03d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return out


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write(tmp_path_factory.mktemp("dali-batch"), labels=False)


@pytest.fixture(scope="module")
def label_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write(tmp_path_factory.mktemp("dali-batch-labels"), labels=True)


def unaddressed(text: str) -> str:
    """A message without the object addresses Pillow's name (``<_io.BytesIO object at
    0x7f...>``), which differ from one call to the next."""
    return re.sub(r" at 0x[0-9a-f]+>", " at 0x...>", text)


def one_at_a_time(samples: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The stream's samples as a plain iterator (no ``take``): the builder's dict path."""
    yield from samples


def batches(
    folder: Path,
    bulk: bool,
    on_error: Any,
    native: bool = True,
    shared: bool = False,
    precheck: Any = "markers",
) -> list[dict[str, Any]]:
    assert _batch._NATIVE is not None, "run `make install` (or setup.py build_ext)"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_batch, "NATIVE", native)
        return _batches(folder, bulk, on_error, shared, precheck)


def _batches(
    folder: Path, bulk: bool, on_error: Any, shared: bool, precheck: Any
) -> list[dict[str, Any]]:
    builder = BatchBuilder(
        8,
        on_error=on_error,
        precheck=precheck,
        image_keys=("jpg", "jpeg", "png"),
        label_key="cls",
    )
    out = []
    pool = BufferPool(shared=shared)  # a worker's shared buffers, or the feed thread's
    with ShardStream(str(folder), window=2, inflight=2, chunk_bytes=4 << 10, seed=3) as stream:
        samples = stream.iter_views() if bulk else one_at_a_time(iter(stream))
        while True:
            buffer = BatchBuffer(pool)
            batch = EncodedBatch(state=None, placed=buffer)
            ended = builder.build(samples, batch)
            error = batch.error
            batch.keep()  # as read_batches hands a feed thread's batch over
            images = [bytes(image) for image in batch.images]
            assert len(images) == len(batch.keys)
            if not shared:
                assert batch.placed is None
                assert (batch.owner is not None) == bool(images)
            batch.owner = None
            buffer.free()
            out.append(
                {
                    "keys": batch.keys,
                    "urls": batch.urls,
                    "labels": batch.labels,
                    "images": images,
                    "metas": batch.metas,
                    "skipped": [(u, k, unaddressed(w), s) for u, k, w, s in batch.skipped],
                    "error": None if error is None else (type(error), unaddressed(str(error))),
                }
            )
            if ended:
                return out


@pytest.mark.parametrize(("native", "shared"), WAYS)
def test_records_and_dicts_build_the_same_batches_skipping(
    folder: Path, native: bool, shared: bool
) -> None:
    bulk = batches(folder, True, "skip", native, shared)
    dicts = batches(folder, False, "skip")
    assert bulk == dicts
    kept = [k for b in bulk for k in b["keys"]]
    skipped = {s[1]: s[2] for b in bulk for s in b["skipped"]}
    assert sorted(skipped) == ["s005", "s010", "s025", "s040"]
    assert "unknown signature" in skipped["s005"]
    assert "truncated JPEG" in skipped["s010"]
    assert "no image member: it has 'cls', 'txt'" in skipped["s025"]
    assert skipped["s040"] == "empty image"
    assert len(kept) == 44
    assert "s030" in kept
    assert "s035" in kept
    labels = {k: label for b in bulk for k, label in zip(b["keys"], b["labels"], strict=True)}
    assert labels["s035"] == 5
    assert labels["s001"] == 1
    metas = {k: m for b in bulk for k, m in zip(b["keys"], b["metas"], strict=True)}
    assert json.loads(metas["s001"] or b"") == {"source": "1.jpg"}
    assert metas["s030"] is None
    assert all(b["error"] is None for b in bulk)


@pytest.mark.parametrize(("native", "shared"), WAYS)
def test_records_and_dicts_raise_the_same_first_error(
    folder: Path, native: bool, shared: bool
) -> None:
    bulk = batches(folder, True, "raise", native, shared)
    dicts = batches(folder, False, "raise")
    assert bulk == dicts
    kind, message = bulk[-1]["error"]
    assert kind is DecodeError
    assert "part-" in message
    assert "sample 's0" in message
    assert sum(len(b["keys"]) for b in bulk) < 44  # the epoch ended at the error


@pytest.mark.parametrize("on_error", ["skip", "raise"])
@pytest.mark.parametrize(("native", "shared"), WAYS)
def test_a_bad_label_ends_the_epoch_on_both_paths(
    label_folder: Path, on_error: str, native: bool, shared: bool
) -> None:
    bulk = batches(label_folder, True, on_error, native, shared)
    dicts = batches(label_folder, False, on_error)
    assert bulk == dicts
    kind, message = bulk[-1]["error"]
    assert kind is DataError
    assert "no integer label in 'cls'" in message
    assert all(b["error"] is None for b in bulk[:-1])


@pytest.mark.parametrize("precheck", ["none", "header"])
@pytest.mark.parametrize("on_error", ["skip", "raise"])
@pytest.mark.parametrize("shared", [False, True])
def test_every_precheck_level_builds_the_same_batches_both_ways(
    folder: Path, precheck: str, on_error: str, shared: bool
) -> None:
    native = batches(folder, True, on_error, True, shared, precheck)
    python = batches(folder, True, on_error, False, shared, precheck)
    assert native == python
    assert native == batches(folder, False, on_error, precheck=precheck)


def test_the_state_tracked_before_every_batch_is_the_stream_s_state_then(folder: Path) -> None:
    """``read_batches`` hands ``track`` a snapshot before every batch: made into its dict
    after the pass (the stream gone on, then closed), it is the ``state_dict()`` of that
    moment, and the one the state was made as before (the run's ``ReaderState``)."""
    builder = BatchBuilder(
        5, on_error="skip", precheck="markers", image_keys=("jpg", "jpeg", "png"), label_key="cls"
    )
    tracked: list[tuple[Any, dict[str, Any], dict[str, Any]]] = []
    with ShardStream(str(folder), window=2, inflight=2, chunk_bytes=4 << 10, seed=3) as stream:

        def track(snapshot: Any) -> None:
            run = stream._run
            old = stream.state_dict() if run is None else run.state().to_dict()
            tracked.append((snapshot, stream.state_dict(), old))

        built = list(_batch.read_batches(stream, builder, drop_last=False, track=track))
    assert len(tracked) == len(built) + 1 > 3
    for batch, (snapshot, _, _) in zip(built, tracked, strict=False):
        assert batch.state is snapshot
    for snapshot, state, old in tracked:
        assert state == old
        assert json.dumps(snapshot.to_dict()) == json.dumps(state) == json.dumps(old)
