"""Index formats: each parsed into one shape, discovery and its order, the manifest written.

Pure: files are bytes in a dict, read by a function that counts the reads. The same
formats against the real S3 server, with shards written by other tools, are in
tests/test_dataset.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from asyncstream import DataError
from asyncstream.dataset._index import (
    MANIFEST_KIND,
    Entry,
    find_index,
    join_url,
    manifest_bytes,
    parse_index,
)

F = "s3://bkt/train"


def doc(value: Any) -> bytes:
    return json.dumps(value).encode()


def store(files: dict[str, Any]) -> tuple[Callable[[str], bytes | None], list[str]]:
    """A reader over ``{url: JSON value or bytes}`` and the list of URLs it was asked for."""
    asked: list[str] = []

    def read(url: str) -> bytes | None:
        asked.append(url)
        value = files.get(url)
        return value if value is None or isinstance(value, bytes) else doc(value)

    return read, asked


# --------------------------------------------------------------------------- the formats


def test_asyncstream_manifest_with_sizes_etags_and_splits() -> None:
    raw = doc(
        {
            "__kind__": MANIFEST_KIND,
            "shards": [
                {"url": "a.tar", "samples": 3, "size": 4096, "etag": '"e1"'},
                {"url": "sub/b.tar", "samples": 0, "size": 2048, "etag": None},
                {"url": "s3://elsewhere/c.tar", "samples": 1},
            ],
            "splits": {"train": ["a.tar", "sub/b.tar"], "val": ["s3://elsewhere/c.tar"]},
        }
    )
    index = parse_index(f"{F}/asyncstream.json", raw, expect=None, rebase=False)
    assert index is not None
    assert index.kind == "asyncstream"
    assert dict(index.entries) == {
        f"{F}/a.tar": Entry(3, 4096, '"e1"'),
        f"{F}/sub/b.tar": Entry(0, 2048, None),
        "s3://elsewhere/c.tar": Entry(1),
    }
    assert index.members("train") == [f"{F}/a.tar", f"{F}/sub/b.tar"]
    assert index.members("val") == ["s3://elsewhere/c.tar"]
    with pytest.raises(ValueError, match=r"several splits \('train', 'val'\)"):
        index.members(None)
    with pytest.raises(ValueError, match="no split 'test'; its splits are 'train', 'val'"):
        index.members("test")
    beside = parse_index(f"{F}/asyncstream.json", raw, expect="asyncstream", rebase=True)
    assert beside is not None
    assert f"{F}/c.tar" in beside.entries  # found beside the shards: matched by file name


def test_legacy_classes_json_matches_by_file_name_and_a_class_map_is_ignored() -> None:
    legacy = {"classes": ["a"], "shards": [{"url": "s3://old/x/shard-0.tar", "samples": 7}]}
    index = parse_index(f"{F}/classes.json", doc(legacy), expect="classes.json", rebase=True)
    assert index is not None
    assert dict(index.entries) == {f"{F}/shard-0.tar": Entry(7)}
    class_map = {"classes": ["cat", "dog"], "class_to_index": {"cat": 0, "dog": 1}}
    assert (
        parse_index(f"{F}/classes.json", doc(class_map), expect="classes.json", rebase=True) is None
    )


def test_wids_index_relative_base_absolute_and_filesize() -> None:
    wids = {
        "__kind__": "wids-shard-index-v1",
        "wids_version": 1,
        "name": "train",
        "shardlist": [
            {"url": "shards/a.tar", "nsamples": 5, "filesize": 10240},
            {"url": "s3://other/b.tar", "nsamples": 2},
        ],
    }
    index = parse_index(f"{F}/train.json", doc(wids), expect=None, rebase=False)
    assert index is not None
    assert index.kind == "wids"
    assert dict(index.entries) == {
        f"{F}/shards/a.tar": Entry(5, 10240),
        "s3://other/b.tar": Entry(2),
    }
    with_base = {**wids, "base": "../data/"}
    index = parse_index(f"{F}/train.json", doc(with_base), expect=None, rebase=False)
    assert index is not None
    assert next(iter(index.entries)) == "s3://bkt/data/shards/a.tar"
    web = {**wids, "shardlist": [{"url": "ftp://host/x/c.tar", "nsamples": 1}]}
    index = parse_index(f"{F}/train.json", doc(web), expect=None, rebase=False)
    assert index is not None
    assert list(index.entries) == [f"{F}/c.tar"]  # another scheme: by file name, here


def test_timm_info_json_splits() -> None:
    info = {
        "name": "imagenet",
        "splits": {
            "train": {
                "name": "train",
                "num_samples": 30,
                "filenames": ["imagenet-train-0000.tar", "imagenet-train-0001.tar"],
                "shard_lengths": [20, 10],
            },
            "validation": {
                "name": "validation",
                "filenames": ["imagenet-validation-0000.tar"],
                "shard_lengths": [5],
            },
        },
    }
    index = parse_index(f"{F}/_info.json", doc(info), expect="info.json", rebase=True)
    assert index is not None
    assert index.members("train") == [
        f"{F}/imagenet-train-0000.tar",
        f"{F}/imagenet-train-0001.tar",
    ]
    assert index.entries[f"{F}/imagenet-validation-0000.tar"] == Entry(5)
    bad = {"splits": {"train": {"filenames": ["a.tar"], "shard_lengths": [1, 2]}}}
    with pytest.raises(DataError, match="1 filenames and 2 lengths"):
        parse_index(f"{F}/_info.json", doc(bad), expect="info.json", rebase=True)


def test_openclip_sizes_json() -> None:
    index = parse_index(f"{F}/sizes.json", doc({"0.tar": 3, "1.tar": 4}), expect=None, rebase=False)
    assert index is not None
    assert index.kind == "sizes.json"
    assert dict(index.entries) == {f"{F}/0.tar": Entry(3), f"{F}/1.tar": Entry(4)}
    assert index.members(None) == [f"{F}/0.tar", f"{F}/1.tar"]
    with pytest.raises(ValueError, match="has no splits"):
        index.members("train")


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ({"__kind__": MANIFEST_KIND, "shards": [{"url": "a.tar", "samples": -1}]}, ">= 0"),
        ({"__kind__": MANIFEST_KIND, "shards": [{"url": "a.tar", "samples": True}]}, ">= 0"),
        ({"__kind__": MANIFEST_KIND, "shards": [{"url": "", "samples": 1}]}, "non-empty"),
        ({"__kind__": MANIFEST_KIND, "shards": "nope"}, "'shards' must be a list of objects"),
        (
            {"__kind__": MANIFEST_KIND, "shards": [], "splits": {"t": ["x.tar"]}},
            "not in 'shards'",
        ),
        (
            {
                "__kind__": "wids-shard-index-v1",
                "shardlist": [{"url": "a.tar", "nsamples": 1}, {"url": "a.tar", "nsamples": 2}],
            },
            "listed twice",
        ),
        ({"__kind__": "wids-shard-index-v1", "shardlist": [{"url": "a.tar"}]}, "None"),
        ({"something": "else"}, "not an index asyncstream reads"),
        (["a", "list"], "a JSON object was expected"),
    ],
)
def test_a_bad_index_is_a_data_error_naming_the_file(value: Any, fragment: str) -> None:
    with pytest.raises(DataError) as info:
        parse_index(f"{F}/given.json", doc(value), expect=None, rebase=False)
    assert f"{F}/given.json" in str(info.value)
    assert fragment in str(info.value)


def test_malformed_json_is_refused_for_our_manifest_and_ignored_for_a_foreign_name() -> None:
    with pytest.raises(DataError, match="not JSON"):
        parse_index(f"{F}/asyncstream.json", b"{nope", expect="asyncstream", rebase=True)
    assert parse_index(f"{F}/sizes.json", b"{nope", expect="sizes.json", rebase=True) is None


# --------------------------------------------------------------------------- discovery


SIZES = {"a.tar": 1}
MANIFEST = {"__kind__": MANIFEST_KIND, "shards": [{"url": "a.tar", "samples": 2}]}
WIDS = {"__kind__": "wids-shard-index-v1", "shardlist": [{"url": "a.tar", "nsamples": 3}]}
INFO = {"splits": {"train": {"filenames": ["a.tar"], "shard_lengths": [4]}}}


@pytest.mark.parametrize(
    ("present", "kind"),
    [
        ({"asyncstream.json": MANIFEST, "sizes.json": SIZES, "_info.json": INFO}, "asyncstream"),
        ({"classes.json": {"classes": []}, "my-set.json": WIDS, "sizes.json": SIZES}, "wids"),
        ({"_info.json": INFO, "sizes.json": SIZES}, "info.json"),
        ({"info.json": INFO, "sizes.json": SIZES}, "info.json"),
        ({"sizes.json": SIZES, "a_stats.json": {"successes": 9}}, "sizes.json"),
        ({"a_stats.json": {"successes": 9}}, "img2dataset"),
        ({"other.json": {"nothing": "here"}}, None),
    ],
)
def test_discovery_order_with_a_listing(present: dict[str, Any], kind: str | None) -> None:
    files = {f"{F}/{name}": value for name, value in present.items()}
    read, asked = store(files)
    index = find_index(F, read, known=set(files) | {f"{F}/a.tar"})
    assert (index.kind if index else None) == kind
    assert set(asked) <= set(files)  # with a listing, nothing absent is asked for


def test_discovery_without_a_listing_probes_the_usual_names() -> None:
    read, asked = store({f"{F}/shardindex.json": WIDS})
    index = find_index(F, read, known=None, shard_urls=[f"{F}/a.tar"])
    assert index is not None
    assert index.kind == "wids"
    assert dict(index.entries) == {f"{F}/a.tar": Entry(3)}
    read, asked = store({f"{F}/a_stats.json": {"successes": 6, "failed_to_download": 1}})
    index = find_index(F, read, known=None, shard_urls=[f"{F}/a.tar", f"{F}/b.tar"])
    assert index is not None
    assert index.kind == "img2dataset"
    assert dict(index.entries) == {f"{F}/a.tar": Entry(6)}
    assert f"{F}/b_stats.json" in asked
    read, asked = store({})
    assert find_index(F, read, known=None) is None
    assert len(asked) == 7  # asyncstream, classes, two wids names, _info, info, sizes


# --------------------------------------------------------------------------- writing


def test_manifest_round_trip_relative_where_it_can_be(tmp_path: Path) -> None:
    folder = tmp_path.as_uri()
    rows = [
        (f"{folder}/a.tar", 3, 2048, None),
        (f"{folder}/sub/b.tar", 1, 1024, None),
        ("s3://bkt/c.tar", 2, 4096, '"etag"'),
    ]
    raw = manifest_bytes(folder, rows, splits={"train": [rows[0][0], rows[2][0]]})
    text = raw.decode()
    assert '"url": "a.tar"' in text
    assert '"url": "sub/b.tar"' in text
    assert '"url": "s3://bkt/c.tar"' in text
    assert len(text.splitlines()) == 5  # one shard per line
    index = parse_index(f"{folder}/asyncstream.json", raw, expect=None, rebase=False)
    assert index is not None
    assert [(u, e.samples, e.size, e.etag) for u, e in index.entries.items()] == rows
    assert index.members("train") == [rows[0][0], rows[2][0]]
    assert json.loads(raw)["samples"] == 6


def test_join_url() -> None:
    assert join_url("s3://b/x/y", "../z/a.tar") == "s3://b/x/z/a.tar"
    assert join_url("s3://b", "a.tar") == "s3://b/a.tar"
    assert join_url("s3://b/x", "s3://c/a.tar") == "s3://c/a.tar"
    assert join_url("file:///data/x", "a b.tar") == "file:///data/x/a%20b.tar"
