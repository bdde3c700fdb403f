"""The S3 store's own object URLs against botocore's, and the engine that needs no client.

Where an endpoint is read with path-style addressing, the engine builds each object's URL
itself (``S3Options.path_base`` and ``object_url``) instead of asking botocore's
``generate_presigned_url``; the two must give the same URL for every key, or a read would
go to another object (or be refused by its signature).
"""

from __future__ import annotations

import contextlib
import io
import tarfile

import botocore.session
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncstream import S3Options, ShardStream
from asyncstream.stores._s3 import object_url
from asyncstream.testing import LocalS3

ENDPOINTS = [
    "http://127.0.0.1:9000",
    "http://127.0.0.1:9000/",
    "https://minio.cluster.local/base",
    "https://Storage.Example:443/a/b/",
    "http://[::1]:8080",
]
BUCKETS = ["bkt", "my.bucket-1", "a1b"]


def _botocore_url(endpoint: str, bucket: str, key: str) -> str:
    options = S3Options(endpoint_url=endpoint, addressing_style="path")
    kwargs = options.client_kwargs()
    kwargs.update(aws_access_key_id="k", aws_secret_access_key="s")
    client = _CLIENTS.get(endpoint)
    if client is None:
        client = _CLIENTS[endpoint] = botocore.session.get_session().create_client("s3", **kwargs)
    url = client.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key})
    return str(url).partition("?")[0]


_CLIENTS: dict[str, object] = {}

# Keys as users and tar writers name them: any text, with separators, dots, percent
# signs, query and fragment characters, spaces and non-ASCII letters.
_KEYS = st.text(
    st.one_of(
        st.sampled_from(list("/.-_~%?#+ &=:@!$'()*,;[]")),
        st.characters(codec="utf-8", exclude_categories=("Cs",)),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(
    endpoint=st.sampled_from(ENDPOINTS),
    bucket=st.sampled_from(BUCKETS),
    key=_KEYS,
)
def test_a_path_style_objects_url_is_botocores(endpoint: str, bucket: str, key: str) -> None:
    base = S3Options(endpoint_url=endpoint, addressing_style="path").path_base(bucket)
    assert base is not None
    assert object_url(base, key) == _botocore_url(endpoint, bucket, key)


def test_named_keys_match_botocore() -> None:
    keys = ["a b/c+d%e?f#g~h", "/lead", "x//y", "ü/é", "a/../b", ".", "shard-000001.tar"]
    for endpoint in ENDPOINTS:
        base = S3Options(endpoint_url=endpoint, addressing_style="path").path_base("bkt")
        assert base is not None
        for key in keys:
            assert object_url(base, key) == _botocore_url(endpoint, "bkt", key)


def test_only_a_path_style_endpoint_has_a_base_of_its_own() -> None:
    """Virtual hosts and AWS's own endpoints follow AWS's rules: botocore resolves them."""
    assert S3Options(endpoint_url="http://h:1").path_base("b") == "http://h:1/b/"  # auto: path
    assert S3Options(endpoint_url="http://h:1", addressing_style="virtual").path_base("b") is None
    assert S3Options().path_base("b") is None
    assert S3Options(addressing_style="path").path_base("b") is None  # AWS: its regions
    assert S3Options().signing_region == "us-east-1"
    assert S3Options(region_name="eu-west-3").signing_region == "eu-west-3"
    kwargs = S3Options(region_name="eu-west-3").client_kwargs()
    assert kwargs["region_name"] == "eu-west-3"


def _tar(name: str, data: bytes) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_a_stream_reads_odd_keys_over_the_engines_own_urls(s3_server: LocalS3) -> None:
    """Objects whose keys need encoding, read by the engine on its own URLs and the chain's
    credentials (the fixtures' environment), with no botocore client in the engine (the
    aiohttp transport, which needs one, runs in ``test_engine.py``): the bytes are the
    objects'."""
    client = s3_server.client()
    client.create_bucket(Bucket="odd-keys")
    expected = {}
    for i, key in enumerate(["a b/ü+1.tar", "q?x#y/%41.tar", "x//y/~z.tar"]):
        expected[f"s{i}"] = f"payload {i}".encode() * 50
        client.put_object(Bucket="odd-keys", Key=key, Body=_tar(f"s{i}.bin", expected[f"s{i}"]))
    options = S3Options(endpoint_url=s3_server.endpoint_url)
    with ShardStream("s3://odd-keys/", s3=options, shuffle=False, index_cache=False) as stream:
        got = {sample["__key__"]: sample["bin"] for sample in stream}
        assert stream.stats()["fetch"]["transport"] == "direct"
    assert got == expected


@pytest.mark.parametrize("scheme", ["http", "https"])
@pytest.mark.parametrize("path", ["own", "botocore"])
def test_the_open_answers_alike_by_its_own_requests_and_botocores(
    path: str, scheme: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every request at open, on moto, by the store's own requests (a path-style endpoint)
    and by botocore's client (what AWS's endpoints, virtual hosts and proxies take: chosen
    here by turning the own requests off): the same listing over pages, sizes, ETags,
    bytes, and the same errors."""
    from asyncstream import NotFoundError
    from asyncstream.stores._s3objects import S3Objects

    fixture = "s3_tls_server" if scheme == "https" else "s3_server"
    s3_server: LocalS3 = request.getfixturevalue(fixture)
    client = s3_server.client()
    with contextlib.suppress(Exception):  # made by the other scheme's run (one moto)
        client.create_bucket(Bucket="both-ways")
    keys = [f"ds/{i:04d} ü+x.tar" for i in range(5)]
    for i, key in enumerate(keys):
        client.put_object(Bucket="both-ways", Key=key, Body=b"x" * (100 + i))
    client.put_object(Bucket="both-ways", Key="ds/asyncstream.json", Body=b'{"a": 1}')
    if path == "botocore":
        monkeypatch.setattr(S3Objects, "rest", lambda self, bucket: None)
    monkeypatch.setattr("asyncstream.stores._s3objects._PAGE", 2)  # pages of two keys
    objects = S3Objects(s3_server.options())
    try:
        listed = objects.list("s3://both-ways/ds/")
        expected = sorted([*keys, "ds/asyncstream.json"])
        assert [s.url for s in listed] == [f"s3://both-ways/{k}" for k in expected]
        etags = {k: client.head_object(Bucket="both-ways", Key=k)["ETag"] for k in expected}
        assert [s.etag for s in listed] == [etags[k] for k in expected]
        head = objects.head(f"s3://both-ways/{keys[3]}")
        assert (head.size, head.etag) == (103, etags[keys[3]])
        assert objects.read("s3://both-ways/ds/asyncstream.json") == b'{"a": 1}'
        assert objects.read("s3://both-ways/ds/missing.json") is None
        with pytest.raises(NotFoundError, match="a prefix needs its trailing '/'"):
            objects.head("s3://both-ways/ds")
        with pytest.raises(NotFoundError, match="NoSuchBucket"):
            objects.list("s3://no-such-bucket/ds/")
        assert (objects._client is None) == (path == "own")
    finally:
        objects.close()
