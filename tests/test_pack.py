"""pack: ImageFolder to tar shards, locally and on S3, read back by tar, webdataset and DALI."""

from __future__ import annotations

import gc
import io
import json
import os
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from asyncstream import LocalS3, NotFoundError, S3Options, pack, resolve_shards
from asyncstream._pack import _MULTIPART_THRESHOLD


def _make_tree(root: Path, classes: dict[str, int], size: int = 300) -> dict[str, bytes]:
    """Write fake images; returns {relative path: bytes}. Content differs per file."""
    files: dict[str, bytes] = {}
    for name, count in classes.items():
        (root / name).mkdir(parents=True)
        for i in range(count):
            data = f"{name}/{i}".encode() * (size // 8) + os.urandom(8)
            rel = f"{name}/img_{i:03d}.jpg"
            (root / rel).write_bytes(data)
            files[rel] = data
    return files


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
    assert len(members) == 2 * len(files)
    source = list(files.items())  # class-sorted order, as packed without shuffle
    for i, (rel, data) in enumerate(source):
        image_name, image_bytes = members[2 * i]
        cls_name, cls_bytes = members[2 * i + 1]
        assert image_name == f"{i:06d}.jpg"
        assert image_bytes == data
        assert cls_name == f"{i:06d}.cls"
        assert int(cls_bytes) == ["cat", "dog", "emu"].index(rel.split("/")[0])
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
    assert listing == ["000000.jpg", "000000.cls", "000001.jpg", "000001.cls"]


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
        body = client.get_object(Bucket=bucket, Key=shard.key)["Body"].read()
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
    big = os.urandom(_MULTIPART_THRESHOLD + (3 << 20))
    (src / "a" / "big.jpg").write_bytes(big)
    options = S3Options(endpoint_url=s3_server.endpoint_url)
    result = pack(src, f"s3://{bucket}/big/", shard_samples=1, shard_bytes=None, options=options)
    client = s3_server.client()
    head = client.head_object(Bucket=bucket, Key="big/shard-000000.tar")
    assert "-" in head["ETag"]  # a multipart upload's ETag is "<md5 of md5s>-<parts>"
    assert result.shards[0].etag == head["ETag"]
    body = client.get_object(Bucket=bucket, Key="big/shard-000000.tar")["Body"].read()
    assert len(body) == result.shards[0].size
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        assert tar.extractfile("000000.jpg").read() == big  # type: ignore[union-attr]


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
