"""pack: ImageFolder to tar shards, locally and on S3, read back by tar, webdataset and DALI.

Bad images and formats: every source image is decoded before anything is written; bad ones
are skipped and named or refuse the pack; the source path travels in each sample's json.
"""

from __future__ import annotations

import gc
import hashlib
import io
import json
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from asyncstream import (
    DecodeError,
    LocalS3,
    NotFoundError,
    S3Options,
    SkippedImage,
    SkippedImageWarning,
    pack,
    resolve_shards,
)
from asyncstream.packing._packsink import MULTIPART_THRESHOLD
from asyncstream.stores._s3 import parse_s3_url


def _noise(seed: str, side: int) -> Image.Image:
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(seed.encode()).digest()[:8]))
    return Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8))


def _smooth(seed: str, side: int) -> Image.Image:
    """Gradients, and a blue level per seed: what JPEG encodes with little loss."""
    ramp = np.linspace(0, 255, side, dtype=np.uint8)
    blue = hashlib.sha256(seed.encode()).digest()[0]
    planes = np.broadcast_arrays(ramp[None, :], ramp[:, None], np.uint8(blue))
    return Image.fromarray(np.stack(planes, axis=-1))


def _jpeg(seed: str, size: int = 300) -> bytes:
    """A real JPEG of noise, about ``size`` bytes (at least ~700: its tables), unique per seed."""
    out = io.BytesIO()
    _noise(seed, max(4, int((size / 2.4) ** 0.5))).save(out, "JPEG", quality=90)
    return out.getvalue()


def _make_tree(root: Path, classes: dict[str, int], size: int = 300) -> dict[str, bytes]:
    """Write real JPEGs; returns {relative path: bytes}. Content differs per file."""
    files: dict[str, bytes] = {}
    for name, count in classes.items():
        (root / name).mkdir(parents=True)
        for i in range(count):
            rel = f"{name}/img_{i:03d}.jpg"
            data = _jpeg(rel, size)
            (root / rel).write_bytes(data)
            files[rel] = data
    return files


def _read_samples(folder: Path) -> list[dict[str, bytes]]:
    """Every sample of the shards in ``folder``, in order: {"__key__": ..., ext: bytes}."""
    samples: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.glob("*.tar")):
        with tarfile.open(path) as tar:
            for m in tar:
                key, _, ext = m.name.partition(".")
                samples.setdefault(key, {"__key__": key})[ext] = tar.extractfile(m).read()  # type: ignore[union-attr]
    return list(samples.values())


def _read_local_shards(folder: Path) -> list[list[tuple[str, bytes]]]:
    shards = []
    for path in sorted(folder.glob("*.tar")):
        with tarfile.open(path) as tar:
            shards.append([(m.name, tar.extractfile(m).read()) for m in tar])  # type: ignore[union-attr]
    return shards


def test_local_pack_layout_and_bytes(tmp_path: Path) -> None:
    src = tmp_path / "src"
    files = _make_tree(src, {"cat": 5, "dog": 4, "emu": 3})
    result = pack(src, str(tmp_path / "out"), shard_samples=5, shard_bytes=None)
    assert result.classes == ["cat", "dog", "emu"]
    assert [s.samples for s in result.shards] == [5, 5, 2]
    shards = _read_local_shards(tmp_path / "out")
    members = [m for shard in shards for m in shard]
    assert len(members) == 3 * len(files)
    source = list(files.items())  # class-sorted order, as packed without shuffle
    for i, (rel, data) in enumerate(source):
        image_name, image_bytes = members[3 * i]
        cls_name, cls_bytes = members[3 * i + 1]
        json_name, json_bytes = members[3 * i + 2]
        label = ["cat", "dog", "emu"].index(rel.split("/")[0])
        assert image_name == f"{i:06d}.jpg"
        assert image_bytes == data
        assert cls_name == f"{i:06d}.cls"
        assert int(cls_bytes) == label
        assert json_name == f"{i:06d}.json"
        assert json.loads(json_bytes) == {"source": rel, "class": rel.split("/")[0], "label": label}
    assert result.skipped == []
    class_map = json.loads((tmp_path / "out" / "classes.json").read_text())
    assert class_map["class_to_index"] == {"cat": 0, "dog": 1, "emu": 2}
    assert class_map["samples"] == 12
    assert not list((tmp_path / "out").glob(".asyncstream-pack-*"))


def test_pack_is_deterministic_and_shuffle_is_seeded(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _make_tree(src, {"a": 6, "b": 6})
    outs = {}
    for name, seed in (("x", 3), ("y", 3), ("z", 4), ("plain", None)):
        pack(src, str(tmp_path / name), shard_samples=100, shard_bytes=None, shuffle_seed=seed)
        outs[name] = (tmp_path / name / "shard-000000.tar").read_bytes()
    assert outs["x"] == outs["y"]
    assert outs["x"] != outs["z"]
    assert outs["x"] != outs["plain"]


def test_shard_bytes_target(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _make_tree(src, {"a": 40}, size=10_000)
    result = pack(src, str(tmp_path / "out"), shard_bytes=50_000)
    assert len(result.shards) > 5
    assert all(s.size <= 50_000 + 10 * 1024 for s in result.shards)
    assert sum(s.samples for s in result.shards) == 40


def test_plain_tar_lists_the_members(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _make_tree(src, {"a": 2})
    pack(src, str(tmp_path / "out"), shard_samples=10, shard_bytes=None)
    listing = subprocess.run(
        ["tar", "-tf", str(tmp_path / "out" / "shard-000000.tar")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert listing == [f"00000{i}.{ext}" for i in range(2) for ext in ("jpg", "cls", "json")]


# webdataset leaves its shard files for the garbage collector to close (its own leak).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_webdataset_reads_the_shards(tmp_path: Path) -> None:
    wds = pytest.importorskip("webdataset")
    src = tmp_path / "src"
    files = _make_tree(src, {"a": 3, "b": 3})
    pack(src, str(tmp_path / "out"), shard_samples=4, shard_bytes=None)
    urls = [str(p) for p in sorted((tmp_path / "out").glob("*.tar"))]
    samples = list(wds.WebDataset(urls, shardshuffle=False, empty_check=False))
    assert [s["__key__"] for s in samples] == [f"{i:06d}" for i in range(6)]
    assert [s["jpg"] for s in samples] == list(files.values())
    assert [int(s["cls"]) for s in samples] == [0, 0, 0, 1, 1, 1]
    gc.collect()


def test_dali_webdataset_reader_reads_the_shards(tmp_path: Path) -> None:
    dali = pytest.importorskip("nvidia.dali")
    from nvidia.dali import fn, pipeline_def

    src = tmp_path / "src"
    files = _make_tree(src, {"a": 3, "b": 2})
    pack(src, str(tmp_path / "out"), shard_samples=10, shard_bytes=None)
    tar = str(tmp_path / "out" / "shard-000000.tar")

    @pipeline_def(batch_size=5, num_threads=1, device_id=None)  # type: ignore[misc]
    def read() -> Any:
        jpg, cls = fn.readers.webdataset(
            paths=[tar], ext=["jpg", "cls"], missing_component_behavior="error"
        )
        return jpg, cls

    pipe = read()
    pipe.build()
    jpgs, clss = pipe.run()
    assert [bytes(jpgs.at(i)) for i in range(5)] == list(files.values())
    assert [int(bytes(clss.at(i))) for i in range(5)] == [0, 0, 0, 1, 1]
    del dali


def test_symlink_out_of_source_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret.jpg"
    secret.write_bytes(b"private")
    src = tmp_path / "src"
    _make_tree(src, {"a": 1})
    (src / "a" / "link.jpg").symlink_to(secret)
    with pytest.raises(ValueError, match="outside") as info:
        pack(src, str(tmp_path / "out"), shard_samples=10, shard_bytes=None)
    assert "link.jpg" in str(info.value)


def test_symlinked_folder_out_of_source_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x.jpg").write_bytes(b"x")
    src = tmp_path / "src"
    _make_tree(src, {"a": 1})
    (src / "a" / "sub").symlink_to(outside)
    with pytest.raises(ValueError, match="outside"):
        pack(src, str(tmp_path / "out"), shard_samples=10, shard_bytes=None)
    (src / "b").symlink_to(outside)
    (src / "a" / "sub").unlink()
    with pytest.raises(ValueError, match="outside"):
        pack(src, str(tmp_path / "out"), shard_samples=10, shard_bytes=None)


def test_symlink_inside_source_is_followed(tmp_path: Path) -> None:
    src = tmp_path / "src"
    files = _make_tree(src, {"a": 1, "b": 1})
    (src / "b" / "alias.jpg").symlink_to(src / "a" / "img_000.jpg")
    result = pack(src, str(tmp_path / "out"), shard_samples=10, shard_bytes=None)
    assert result.samples == len(files) + 1


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"shard_bytes": None, "shard_samples": None}, "shard_bytes"),
        ({"shard_bytes": 0}, "shard_bytes"),
        ({"shard_samples": 0}, "shard_samples"),
        ({"workers": 0}, "workers"),
        ({"name_prefix": "a/b"}, "name_prefix"),
        ({"on_error": "ignore"}, "on_error"),
        ({"jpeg_quality": 0}, "jpeg_quality"),
        ({"jpeg_quality": 101}, "jpeg_quality"),
        ({"jpeg_quality": True}, "jpeg_quality"),
    ],
)
def test_bad_arguments(tmp_path: Path, kwargs: dict[str, Any], fragment: str) -> None:
    _make_tree(tmp_path / "src", {"a": 1})
    with pytest.raises(ValueError, match=fragment):
        pack(tmp_path / "src", str(tmp_path / "out"), **kwargs)


def test_bad_sources(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a folder") as info:
        pack(tmp_path / "missing", str(tmp_path / "out"))
    assert "missing" in str(info.value)
    (tmp_path / "empty" / "a").mkdir(parents=True)
    with pytest.raises(ValueError, match="no image"):
        pack(tmp_path / "empty", str(tmp_path / "out"))


def test_s3_round_trip_byte_for_byte(tmp_path: Path, s3_server: LocalS3, bucket: str) -> None:
    src = tmp_path / "src"
    files = _make_tree(src, {"a": 7, "b": 6}, size=2_000)
    options = S3Options(endpoint_url=s3_server.endpoint_url)
    result = pack(
        src, f"s3://{bucket}/ds/", shard_samples=4, shard_bytes=None, options=options, workers=3
    )
    listed = resolve_shards(f"s3://{bucket}/ds/", options)
    assert [(s.url, s.size) for s in listed] == [(s.url, s.size) for s in result.shards]
    client = s3_server.client()
    got: list[bytes] = []
    for shard in listed:
        body = client.get_object(Bucket=bucket, Key=parse_s3_url(shard.url)[1])["Body"].read()
        with tarfile.open(fileobj=io.BytesIO(body)) as tar:
            got.extend(tar.extractfile(m).read() for m in tar if m.name.endswith(".jpg"))  # type: ignore[union-attr]
    assert got == list(files.values())
    class_map = json.loads(client.get_object(Bucket=bucket, Key="ds/classes.json")["Body"].read())
    assert class_map["classes"] == ["a", "b"]
    manifest = json.loads(
        client.get_object(Bucket=bucket, Key="ds/asyncstream.json")["Body"].read()
    )
    assert manifest["__kind__"] == "asyncstream-manifest-v1"
    assert manifest["samples"] == 13
    assert [(e["url"], e["samples"], e["size"], e["etag"]) for e in manifest["shards"]] == [
        (s.url.rsplit("/", 1)[1], r.samples, s.size, s.etag)
        for s, r in zip(listed, result.shards, strict=True)
    ]
    assert all(e["etag"] for e in manifest["shards"])  # the ETags S3 returned on upload


def test_s3_multipart_upload_for_large_shards(
    tmp_path: Path, s3_server: LocalS3, bucket: str
) -> None:
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    Image.new("RGB", (4800, 4800), (10, 20, 30)).save(src / "a" / "big.bmp")  # 69 MB
    big = (src / "a" / "big.bmp").read_bytes()
    assert len(big) > MULTIPART_THRESHOLD
    options = S3Options(endpoint_url=s3_server.endpoint_url)
    result = pack(src, f"s3://{bucket}/big/", shard_samples=1, shard_bytes=None, options=options)
    client = s3_server.client()
    head = client.head_object(Bucket=bucket, Key="big/shard-000000.tar")
    assert "-" in head["ETag"]  # a multipart upload's ETag is "<md5 of md5s>-<parts>"
    assert result.shards[0].etag == head["ETag"]
    body = client.get_object(Bucket=bucket, Key="big/shard-000000.tar")["Body"].read()
    assert len(body) == result.shards[0].size
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        assert tar.extractfile("000000.bmp").read() == big  # type: ignore[union-attr]


def test_s3_missing_bucket_is_named(tmp_path: Path, s3_server: LocalS3) -> None:
    _make_tree(tmp_path / "src", {"a": 1})
    options = S3Options(endpoint_url=s3_server.endpoint_url)
    with pytest.raises(NotFoundError) as info:
        pack(tmp_path / "src", "s3://no-such-bucket-pack/x/", options=options)
    assert "s3://no-such-bucket-pack/x/" in str(info.value)


def test_a_destination_that_holds_shards_is_refused(tmp_path: Path) -> None:
    _make_tree(tmp_path / "src", {"a": 5})
    out = tmp_path / "out"
    pack(tmp_path / "src", str(out), shard_samples=1, shard_bytes=None)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(ValueError, match="already holds a dataset") as info:
        pack(tmp_path / "src", str(out), shard_samples=2, shard_bytes=None)
    assert (out / "shard-000000.tar").as_uri() in str(info.value)
    assert "--overwrite" in str(info.value)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing touched
    manifest_only = tmp_path / "manifest-only"
    manifest_only.mkdir()
    (manifest_only / "asyncstream.json").write_text("{}")
    with pytest.raises(ValueError, match="already holds a dataset"):
        pack(tmp_path / "src", str(manifest_only), shard_samples=2, shard_bytes=None)
    compressed = tmp_path / "compressed"  # compressed shards are shards of a dataset too
    compressed.mkdir()
    (compressed / "old-0000.tar.gz").write_bytes(b"\x1f\x8b")
    with pytest.raises(ValueError, match=r"old-0000\.tar\.gz"):
        pack(tmp_path / "src", str(compressed), shard_samples=2, shard_bytes=None)
    pack(tmp_path / "src", str(compressed), shard_samples=2, shard_bytes=None, overwrite=True)
    assert not (compressed / "old-0000.tar.gz").exists()


def test_overwrite_removes_the_shards_it_does_not_write(tmp_path: Path) -> None:
    _make_tree(tmp_path / "src", {"a": 5})
    out = tmp_path / "out"
    (out / "keep").mkdir(parents=True)
    (out / "keep" / "other.tar").write_bytes(b"not ours")  # below the folder: left alone
    (out / "notes.txt").write_text("left alone")
    pack(tmp_path / "src", str(out), shard_samples=1, shard_bytes=None)
    result = pack(tmp_path / "src", str(out), shard_samples=2, shard_bytes=None, overwrite=True)
    assert sorted(p.name for p in out.glob("*.tar")) == [f"shard-00000{i}.tar" for i in range(3)]
    assert (out / "keep" / "other.tar").exists()
    assert (out / "notes.txt").exists()
    manifest = json.loads((out / "asyncstream.json").read_text())
    assert [e["url"] for e in manifest["shards"]] == [
        s.url.rsplit("/", 1)[1] for s in result.shards
    ]
    assert [e["etag"] for e in manifest["shards"]] == [None] * 3  # local files have none


def test_overwrite_on_s3(tmp_path: Path, s3_server: LocalS3, bucket: str) -> None:
    _make_tree(tmp_path / "src", {"a": 4, "b": 4})
    options = S3Options(endpoint_url=s3_server.endpoint_url)
    dest = f"s3://{bucket}/ds/"
    pack(tmp_path / "src", dest, shard_samples=1, shard_bytes=None, options=options)
    with pytest.raises(ValueError, match="already holds a dataset"):
        pack(tmp_path / "src", dest, shard_samples=4, shard_bytes=None, options=options)
    pack(tmp_path / "src", dest, shard_samples=4, shard_bytes=None, options=options, overwrite=True)
    listed = resolve_shards(dest, options)
    assert [s.url for s in listed] == [f"{dest}shard-00000{i}.tar" for i in range(2)]


# --------------------------------------------------------------------------- bad images


def _bad_tree(root: Path) -> dict[str, bytes]:
    """Good JPEGs in a/ and b/, plus a truncated JPEG and a text file named .jpg in a/."""
    files = _make_tree(root, {"a": 3, "b": 2})
    good = _jpeg("whole", 3_000)
    (root / "a" / "cut.jpg").write_bytes(good[: len(good) // 2])
    (root / "a" / "notes.jpg").write_text("shopping list: not a picture\n")
    return files


def test_bad_images_are_skipped_and_named(tmp_path: Path) -> None:
    files = _bad_tree(tmp_path / "src")
    with pytest.warns(SkippedImageWarning) as caught:
        result = pack(tmp_path / "src", str(tmp_path / "out"), shard_samples=2, shard_bytes=None)
    (warning,) = caught
    message = str(warning.message)
    assert "skipped 2 of 7 images" in message
    assert "a/cut.jpg: does not decode" in message
    assert "a/notes.jpg: not an image" in message
    assert result.skipped == [
        SkippedImage("a/cut.jpg", result.skipped[0].reason),
        SkippedImage("a/notes.jpg", result.skipped[1].reason),
    ]
    assert "truncated" in result.skipped[0].reason.lower()
    assert result.samples == 5
    samples = _read_samples(tmp_path / "out")
    assert [s["__key__"] for s in samples] == [f"{i:06d}" for i in range(5)]  # no gaps
    assert [json.loads(s["json"])["source"] for s in samples] == list(files)
    assert [s["jpg"] for s in samples] == list(files.values())
    manifest = json.loads((tmp_path / "out" / "asyncstream.json").read_text())
    assert manifest["samples"] == 5


def test_on_error_fail_refuses_the_pack_naming_the_files(tmp_path: Path) -> None:
    _bad_tree(tmp_path / "src")
    out = tmp_path / "out"
    with pytest.raises(DecodeError) as caught:
        pack(tmp_path / "src", str(out), shard_samples=2, shard_bytes=None, on_error="fail")
    message = str(caught.value)
    assert "2 of 7 images" in message
    assert "a/cut.jpg: does not decode" in message
    assert "a/notes.jpg: not an image" in message
    assert "nothing was written" in message
    assert list(out.iterdir()) == []  # no shard, no manifest, no temporary folder


def test_on_error_fail_uploads_nothing_to_s3(
    tmp_path: Path, s3_server: LocalS3, bucket: str
) -> None:
    _bad_tree(tmp_path / "src")
    options = S3Options(endpoint_url=s3_server.endpoint_url)
    with pytest.raises(DecodeError, match=r"a/cut\.jpg"):
        pack(
            tmp_path / "src",
            f"s3://{bucket}/ds/",
            shard_samples=1,
            options=options,
            on_error="fail",
        )
    client = s3_server.client()
    assert client.list_objects_v2(Bucket=bucket).get("KeyCount") == 0
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_a_source_of_bad_images_only_is_refused_under_skip(tmp_path: Path) -> None:
    (tmp_path / "src" / "a").mkdir(parents=True)
    (tmp_path / "src" / "a" / "empty.png").write_bytes(b"")
    with pytest.raises(DecodeError, match=r"a/empty\.png: empty file"):
        pack(tmp_path / "src", str(tmp_path / "out"))


def test_source_travels_with_each_sample_through_the_shuffle(tmp_path: Path) -> None:
    files = _make_tree(tmp_path / "src", {"cat": 4, "dog": 5})
    progress: list[tuple[int, int]] = []
    pack(
        tmp_path / "src",
        str(tmp_path / "out"),
        shard_samples=3,
        shard_bytes=None,
        shuffle_seed=5,
        check_progress=lambda done, total: progress.append((done, total)),
    )
    samples = _read_samples(tmp_path / "out")
    sources = [json.loads(s["json"])["source"] for s in samples]
    assert sources != list(files)  # shuffled
    assert sorted(sources) == sorted(files)
    for sample, source in zip(samples, sources, strict=True):
        assert sample["jpg"] == files[source]
        assert int(sample["cls"]) == ["cat", "dog"].index(source.split("/")[0])
    assert progress[-1] == (9, 9)
    assert [done for done, _ in progress] == list(range(1, 10))


# --------------------------------------------------------------------------- formats


def _format_tree(root: Path) -> dict[str, Image.Image]:
    """One image per format Pillow writes, in two classes; returns {path: image}."""
    images: dict[str, Image.Image] = {}
    saves: dict[str, dict[str, Any]] = {
        "a/one.png": {},
        "a/two.webp": {"lossless": True},
        "a/three.bmp": {},
        "b/four.gif": {},
        "b/five.tif": {},
        "b/six.jpg": {"quality": 95},
        "b/seven.jpg": {"format": "PNG"},  # a PNG named .jpg: the bytes decide
    }
    for rel, kwargs in saves.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        image = _smooth(rel, 16)
        if rel.endswith(".gif"):
            image = image.quantize(64).convert("RGB")  # what a GIF can hold, exactly
        image.save(root / rel, **kwargs)
        images[rel] = image
    return images


def _pixels(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("RGB"), dtype=np.int16)


def test_formats_kept_or_converted_losslessly(tmp_path: Path) -> None:
    images = _format_tree(tmp_path / "src")
    pack(tmp_path / "src", str(tmp_path / "out"), shard_samples=10, shard_bytes=None)
    by_source = {json.loads(s["json"])["source"]: s for s in _read_samples(tmp_path / "out")}
    assert {src: sorted(set(s) - {"__key__", "cls", "json"}) for src, s in by_source.items()} == {
        "a/one.png": ["png"],
        "a/two.webp": ["webp"],
        "a/three.bmp": ["bmp"],
        "b/four.gif": ["png"],
        "b/five.tif": ["png"],
        "b/six.jpg": ["jpg"],
        "b/seven.jpg": ["png"],
    }
    for rel in ("a/one.png", "a/two.webp", "a/three.bmp", "b/six.jpg", "b/seven.jpg"):
        ext = {"webp": "webp", "bmp": "bmp", "jpg": "jpg"}.get(rel.rsplit(".")[1], "png")
        ext = "png" if rel == "b/seven.jpg" else ext
        assert by_source[rel][ext] == (tmp_path / "src" / rel).read_bytes()  # as they are
        assert "converted_from" not in json.loads(by_source[rel]["json"])
    for rel, fmt in (("b/four.gif", "GIF"), ("b/five.tif", "TIFF")):
        assert json.loads(by_source[rel]["json"])["converted_from"] == fmt
        assert np.array_equal(_pixels(by_source[rel]["png"]), np.asarray(images[rel]))


def test_to_jpeg_writes_only_jpeg_members(tmp_path: Path) -> None:
    images = _format_tree(tmp_path / "src")
    sizes = {}
    for quality in (95, 50):
        out = tmp_path / f"out{quality}"
        pack(
            tmp_path / "src",
            str(out),
            shard_samples=10,
            shard_bytes=None,
            to_jpeg=True,
            jpeg_quality=quality,
        )
        samples = _read_samples(out)
        assert all(set(s) == {"__key__", "jpg", "cls", "json"} for s in samples)
        by_source = {json.loads(s["json"])["source"]: s["jpg"] for s in samples}
        assert by_source["b/six.jpg"] == (tmp_path / "src" / "b" / "six.jpg").read_bytes()
        for rel, image in images.items():
            with Image.open(io.BytesIO(by_source[rel])) as decoded:
                assert decoded.format == "JPEG"
            if quality == 95:  # close to the source pixels: a mean error of a few levels
                assert np.abs(_pixels(by_source[rel]) - np.asarray(image)).mean() < 8
        sizes[quality] = sum(len(by_source[rel]) for rel in images if rel != "b/six.jpg")
    assert sizes[50] < sizes[95]


def test_a_jpeg_loses_only_what_follows_its_end_marker(tmp_path: Path) -> None:
    """Phones append videos, cameras a second picture: no decoder reads them, and the
    loader's pre-check would take a JPEG that does not end with its marker as truncated."""
    (tmp_path / "src" / "a").mkdir(parents=True)
    image = _jpeg("trailer", 2_000)
    (tmp_path / "src" / "a" / "plain.jpg").write_bytes(image)
    (tmp_path / "src" / "a" / "video.jpg").write_bytes(image + b"\xff\xd9" + b"\x00ftypmp42" * 50)
    pack(tmp_path / "src", str(tmp_path / "out"), shard_samples=10, shard_bytes=None)
    samples = _read_samples(tmp_path / "out")
    assert [s["jpg"] for s in samples] == [image, image]
    assert all("converted_from" not in json.loads(s["json"]) for s in samples)
