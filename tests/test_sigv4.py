"""The S3 store's own SigV4 signer (asyncstream.stores._sigv4) against botocore's
``S3SigV4Auth``: the same Authorization for the same request at the same second."""

from __future__ import annotations

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import ReadOnlyCredentials
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncstream.stores._sigv4 import SigV4Signer, query_string

_KEY_CHARS = st.characters(codec="ascii", categories=("L", "N"), include_characters="/+=")


def botocore_headers(
    url: str,
    headers: dict[str, str],
    creds: ReadOnlyCredentials,
    region: str,
    method: str = "GET",
) -> dict[str, str]:
    aws = AWSRequest(method=method, url=url, headers=dict(headers))
    S3SigV4Auth(creds, "s3", region).add_auth(aws)
    return {k: v.decode() if isinstance(v, bytes) else v for k, v in aws.headers.items()}


def ours(
    url: str, headers: dict[str, str], creds: ReadOnlyCredentials, region: str, timestamp: str
) -> dict[str, str]:
    return SigV4Signer(region).headers(
        url,
        headers,
        access_key=creds.access_key,
        secret_key=creds.secret_key,
        token=creds.token,
        timestamp=timestamp,
    )


@settings(max_examples=200, deadline=None)
@given(
    scheme=st.sampled_from(["http", "https"]),
    host=st.sampled_from(
        ["127.0.0.1", "LocalHost", "s3.eu-west-1.amazonaws.com", "b.s3.amazonaws.com", "[::1]"]
    ),
    port=st.sampled_from([None, 80, 443, 9000]),
    key=st.lists(
        st.sampled_from(["a", "b%20c", "d%2Be", "f~g", "h.tar", "%E2%82%AC"]),
        min_size=1,
        max_size=4,
    ),
    start=st.integers(0, 1 << 40),
    length=st.integers(1, 1 << 30),
    etag=st.none()
    | st.sampled_from(['"abc123"', '"d41d8cd98f00b204e9800998ecf8427e-3"', ' "spaced  etag" ']),
    access=st.text(_KEY_CHARS, min_size=1, max_size=20),
    secret=st.text(_KEY_CHARS, min_size=1, max_size=40),
    token=st.none() | st.text(_KEY_CHARS, min_size=1, max_size=60),
    region=st.sampled_from(["us-east-1", "eu-west-1", "auto"]),
)
def test_the_signature_is_botocores(
    scheme: str,
    host: str,
    port: int | None,
    key: list[str],
    start: int,
    length: int,
    etag: str | None,
    access: str,
    secret: str,
    token: str | None,
    region: str,
) -> None:
    url = f"{scheme}://{host}{'' if port is None else f':{port}'}/bucket/{'/'.join(key)}"
    headers = {"Range": f"bytes={start}-{start + length - 1}"}
    if etag is not None:
        headers["If-Match"] = etag
    creds = ReadOnlyCredentials(access, secret, token)
    theirs = botocore_headers(url, headers, creds, region)
    assert ours(url, headers, creds, region, theirs["X-Amz-Date"]) == theirs


@settings(max_examples=200, deadline=None)
@given(
    method=st.sampled_from(["GET", "HEAD"]),
    params=st.dictionaries(
        st.sampled_from(["list-type", "prefix", "max-keys", "continuation-token", "encoding-type"]),
        st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30),
        max_size=5,
    ),
    token=st.none() | st.text(_KEY_CHARS, min_size=1, max_size=60),
)
def test_a_listing_or_head_is_signed_as_botocore_signs_it(
    method: str, params: dict[str, str], token: str | None
) -> None:
    """The requests at open: a query (the listing's, values of any text, continuation
    tokens with ``/+=``) and ``HEAD``."""
    url = "http://127.0.0.1:9000/bucket"
    query = query_string(params)
    creds = ReadOnlyCredentials("AKID", "secret/key+=", token)
    theirs = botocore_headers(f"{url}?{query}" if query else url, {}, creds, "eu-west-1", method)
    mine = SigV4Signer("eu-west-1").headers(
        url,
        {},
        access_key=creds.access_key,
        secret_key=creds.secret_key,
        token=creds.token,
        timestamp=theirs["X-Amz-Date"],
        method=method,
        query=query,
    )
    assert mine == theirs


def test_the_days_key_is_kept_and_remade_for_another_day_or_secret() -> None:
    signer = SigV4Signer("us-east-1")
    sign = lambda secret, ts: signer.headers(  # noqa: E731
        "http://h/b/k", {"Range": "bytes=0-9"}, access_key="A", secret_key=secret, timestamp=ts
    )
    a = sign("s1", "20261127T000000Z")
    assert sign("s1", "20261127T235959Z")["Authorization"] != a["Authorization"]  # the time
    # the next day and another secret: the key is made again (each equal to a fresh signer)
    for secret, ts in (("s1", "20261128T000000Z"), ("s2", "20261128T000000Z")):
        fresh = SigV4Signer("us-east-1").headers(
            "http://h/b/k", {"Range": "bytes=0-9"}, access_key="A", secret_key=secret, timestamp=ts
        )
        assert sign(secret, ts) == fresh
