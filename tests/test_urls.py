"""Shard URL parsing, expansion, listing and the errors of bad input."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from asyncstream import (
    AccessDeniedError,
    LocalS3,
    NotFoundError,
    S3Options,
    ShardURLError,
    expand_braces,
    resolve_shards,
)
from asyncstream.stores._localstore import local_path
from asyncstream.stores._registry import is_local
from asyncstream.stores._s3 import parse_s3_url


def test_brace_range_keeps_zero_padding() -> None:
    assert expand_braces("s3://b/train-{0000..0002}.tar") == [
        "s3://b/train-0000.tar",
        "s3://b/train-0001.tar",
        "s3://b/train-0002.tar",
    ]
    assert expand_braces("x{8..10}") == ["x8", "x9", "x10"]
    assert expand_braces("x{0..6..3}") == ["x0", "x3", "x6"]


def test_brace_alternatives_and_products() -> None:
    assert expand_braces("{a,b}-{0..1}") == ["a-0", "a-1", "b-0", "b-1"]
    assert expand_braces("plain.tar") == ["plain.tar"]


@pytest.mark.parametrize(
    ("pattern", "fragment"),
    [
        ("s3://b/x-{0..3.tar", "unbalanced '{'"),
        ("s3://b/x-0..3}.tar", "unbalanced '}'"),
        ("s3://b/x-{5..1}.tar", "backwards"),
        ("s3://b/x-{{1..2}}.tar", "nested"),
        ("s3://b/x-{abc}.tar", "cannot read {abc}"),
    ],
)
def test_bad_braces_name_the_pattern(pattern: str, fragment: str) -> None:
    with pytest.raises(ShardURLError) as info:
        expand_braces(pattern)
    assert pattern in str(info.value)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    "url",
    ["s3://", "s3:///key.tar", "s3://UPPER/key.tar", "s3://a/key.tar", "s3://bad_name/k.tar"],
)
def test_bad_bucket_names(url: str) -> None:
    with pytest.raises(ShardURLError) as info:
        parse_s3_url(url)
    assert repr(url) in str(info.value)


@pytest.mark.parametrize("url", ["ftp://host/x.tar", "unregistered://bucket/x.tar", ""])
def test_unsupported_scheme(url: str) -> None:
    with pytest.raises(ShardURLError) as info:
        resolve_shards(url)
    if url:
        assert url in str(info.value)


def test_empty_list_is_refused() -> None:
    with pytest.raises(ShardURLError, match="no shard URL"):
        resolve_shards([])


def test_non_string_is_refused() -> None:
    with pytest.raises(TypeError, match="strings"):
        resolve_shards([Path("/x.tar")])  # type: ignore[list-item]


def _put(client: Any, bucket: str, keys: list[str], body: bytes = b"x" * 10) -> None:
    for key in keys:
        client.put_object(Bucket=bucket, Key=key, Body=body)


def test_single_key_pattern_prefix_and_list(
    s3_server: LocalS3, s3_client: Any, bucket: str
) -> None:
    keys = [f"data/train-{i:04d}.tar" for i in range(20)] + ["data/notes.txt"]
    _put(s3_client, bucket, keys)
    s3_client.put_object(Bucket=bucket, Key="data/big.tar", Body=b"y" * 1234)
    options = S3Options(endpoint_url=s3_server.endpoint_url)

    one = resolve_shards(f"s3://{bucket}/data/big.tar", options)
    assert [(s.url, s.size) for s in one] == [(f"s3://{bucket}/data/big.tar", 1234)]
    assert one[0].etag

    ranged = resolve_shards(f"s3://{bucket}/data/train-{{0000..0019}}.tar", options)
    assert [parse_s3_url(s.url)[1] for s in ranged] == keys[:20]
    assert all(s.size == 10 for s in ranged)

    few = resolve_shards(f"s3://{bucket}/data/train-{{0003..0004}}.tar", options)
    assert [parse_s3_url(s.url)[1] for s in few] == ["data/train-0003.tar", "data/train-0004.tar"]

    listed = resolve_shards(f"s3://{bucket}/data/", options)
    assert [parse_s3_url(s.url)[1] for s in listed] == sorted([*keys[:20], "data/big.tar"])

    mixed = resolve_shards(
        [f"s3://{bucket}/data/big.tar", f"s3://{bucket}/data/train-0001.tar"], options
    )
    assert [parse_s3_url(s.url)[1] for s in mixed] == ["data/big.tar", "data/train-0001.tar"]


def test_endpoint_from_environment(
    s3_server: LocalS3, s3_client: Any, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _put(s3_client, bucket, ["a.tar"])
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint_url)
    assert S3Options().resolve().endpoint_url == s3_server.endpoint_url
    assert [parse_s3_url(s.url)[1] for s in resolve_shards(f"s3://{bucket}/a.tar")] == ["a.tar"]


def test_missing_key_names_the_url(s3_server: LocalS3, s3_client: Any, bucket: str) -> None:
    options = S3Options(endpoint_url=s3_server.endpoint_url)
    url = f"s3://{bucket}/nope.tar"
    with pytest.raises(NotFoundError) as info:
        resolve_shards(url, options)
    assert url in str(info.value)
    assert "no such key" in str(info.value)
    assert info.value.url == url


def test_a_prefix_without_its_slash_says_so(
    s3_server: LocalS3, s3_client: Any, bucket: str
) -> None:
    _put(s3_client, bucket, ["train/a.tar", "train/b.tar"])
    options = S3Options(endpoint_url=s3_server.endpoint_url)
    with pytest.raises(NotFoundError) as info:
        resolve_shards(f"s3://{bucket}/train", options)
    assert f"objects are under s3://{bucket}/train/: a prefix needs its trailing '/'" in str(
        info.value
    )
    with pytest.raises(NotFoundError) as info:  # no folder of that name: no hint
        resolve_shards(f"s3://{bucket}/tra", options)
    assert "trailing" not in str(info.value)


def test_missing_key_among_many_names_it(s3_server: LocalS3, s3_client: Any, bucket: str) -> None:
    _put(s3_client, bucket, [f"t-{i:02d}.tar" for i in range(20) if i != 13])
    options = S3Options(endpoint_url=s3_server.endpoint_url)
    with pytest.raises(NotFoundError) as info:
        resolve_shards(f"s3://{bucket}/t-{{00..19}}.tar", options)
    assert f"s3://{bucket}/t-13.tar" in str(info.value)


def test_missing_bucket_names_it(s3_server: LocalS3) -> None:
    options = S3Options(endpoint_url=s3_server.endpoint_url)
    for url in ("s3://no-such-bucket-here/x.tar", "s3://no-such-bucket-here/prefix/"):
        with pytest.raises(NotFoundError) as info:
            resolve_shards(url, options)
        assert url in str(info.value)
        assert "no-such-bucket-here" in str(info.value)
        assert "bucket" in str(info.value)


def test_empty_prefix_is_not_found(s3_server: LocalS3, s3_client: Any, bucket: str) -> None:
    _put(s3_client, bucket, ["other/readme.txt"])
    options = S3Options(endpoint_url=s3_server.endpoint_url)
    url = f"s3://{bucket}/other/"
    with pytest.raises(NotFoundError) as info:
        resolve_shards(url, options)
    assert url in str(info.value)
    assert "no shard (.tar/" in str(info.value)


def test_duplicate_shards_are_refused(s3_server: LocalS3, s3_client: Any, bucket: str) -> None:
    _put(s3_client, bucket, ["a.tar"])
    options = S3Options(endpoint_url=s3_server.endpoint_url)
    url = f"s3://{bucket}/a.tar"
    with pytest.raises(ShardURLError, match="more than once") as info:
        resolve_shards([url, url], options)
    assert url in str(info.value)


@pytest.fixture(scope="module")
def auth_server(aws_env: dict[str, str]) -> Iterator[LocalS3]:
    with LocalS3(mode="process", require_auth=True) as server:
        yield server


def test_bad_credentials_fail_fast(auth_server: LocalS3) -> None:
    options = S3Options(endpoint_url=auth_server.endpoint_url)
    for url in ("s3://some-bucket/x.tar", "s3://some-bucket/prefix/"):
        with pytest.raises(AccessDeniedError) as info:
            resolve_shards(url, options)
        message = str(info.value)
        assert url in message
        assert "credentials" in message
        assert "asyncstream-test-secret" not in message


def test_missing_credentials(s3_server: LocalS3, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    url = "s3://some-bucket/x.tar"
    with pytest.raises(AccessDeniedError) as info:
        resolve_shards(url, S3Options(endpoint_url=s3_server.endpoint_url))
    assert url in str(info.value)
    assert "credentials" in str(info.value)


def test_local_files_folders_and_file_urls(tmp_path: Path) -> None:
    for name in ("b.tar", "a.tar", "c.txt"):
        (tmp_path / name).write_bytes(b"z" * 7)
    by_folder = resolve_shards(str(tmp_path))
    assert [local_path(s.url).name for s in by_folder] == ["a.tar", "b.tar"]
    assert all(is_local(s.url) and s.size == 7 for s in by_folder)
    by_uri = resolve_shards((tmp_path / "a.tar").as_uri())
    assert local_path(by_uri[0].url) == tmp_path / "a.tar"
    by_pattern = resolve_shards(str(tmp_path / "{a,b}.tar"))
    assert [local_path(s.url).name for s in by_pattern] == ["a.tar", "b.tar"]


def test_local_missing_file_and_empty_folder(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.tar")
    with pytest.raises(NotFoundError) as info:
        resolve_shards(missing)
    assert missing in str(info.value)
    with pytest.raises(NotFoundError, match=r"no shard \(\.tar/"):
        resolve_shards(str(tmp_path))
    with pytest.raises(ShardURLError, match="local path"):
        resolve_shards("file://remotehost/x.tar")
