"""The bad input matrix: every bad input is a clear error naming its culprit, or a counted skip.

Each row of :data:`ROWS` (the stream) and :data:`IMAGE_ROWS` (the DALI loader) states an
input and what must come out of the public API for it: the exception type, the fragments
its message must hold (the shard URL, the sample key, the byte offset of the bad header)
and, for a :class:`~asyncstream.CorruptTarError`, its ``url`` and ``offset``. Rows that
must work state what comes out instead. The shards live on the real moto S3 server and
are read through the fault-injecting proxy, so network faults are HTTP faults.

Stages. A stream resolves its URLs and counts the samples of shards without an index
when it is constructed (through the fetch engine, with the stream's retry policy and
timeouts), so a bad object fails there ("open"); with the counts given
(``samples_per_shard``) nothing reads the bytes before the epoch does, so the same
object fails on iteration ("iterate"). Both paths are rows.

Behaviour decided here, where nothing was defined:

* A zero-byte object is no tar (no writer makes one; tar and tarfile refuse it): a
  ``CorruptTarError`` at open, even when a sample count is given, instead of a shard of no
  sample that silently drops out of the dataset. An empty archive (its end marker only) is
  a valid shard of no sample, but a dataset of nothing else is a ``DataError`` at open
  rather than epochs that end at once.
* A member larger than a ring slot works: the tar reader carries it over chunks.
* A member name that is not UTF-8 is a ``CorruptTarError`` naming shard, offset and the
  raw name: keys are ``str``, and a lossy decoding could merge two samples.
* A tar truncated exactly at a member boundary is a valid tar of fewer samples: only a
  count (the manifest, ``samples_per_shard``) can tell, and then it is a ``DataError``.
* A sample with no image passes the stream (it is a sample of other fields) and is the
  loader's culprit: ``DecodeError`` naming shard and key under ``"raise"``, a counted skip
  under ``"skip"``.

Covered elsewhere, not repeated here: bad URL syntax and braces, missing keys among many,
bad credentials from the environment (tests/test_urls.py); a corrupt header mid-shard with
its exact offset, a manifest count out of date (tests/test_stream.py); throttling that
outlasts the retries, resets, stalls, a chunk larger than its slot, at the engine level
(tests/test_engine.py); every malformation of a header at the reader level
(tests/test_tar.py, and tests/test_security.py for hostile headers through the stream); a
truncated JPEG under both policies, on local shards (tests/test_dali.py).
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import io
import itertools
import os
import random
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from _procs import segments
from PIL import Image

from asyncstream import (
    AccessDeniedError,
    CorruptTarError,
    DataError,
    DecodeError,
    LocalS3,
    NotFoundError,
    PermanentFetchError,
    RetryPolicy,
    S3Credentials,
    S3Options,
    ShardStream,
    Timeouts,
    TransientFetchError,
)
from asyncstream.testing import FaultProxy

pytestmark = pytest.mark.timeout(120)

CHUNK = 4096
N = 12  # samples in the good shard: about 11 chunks of CHUNK
FAST_RETRY = RetryPolicy(max_attempts=3, base_delay=0.001, max_delay=0.01, deadline=30)
SHORT = Timeouts(connect=5, first_byte=5, stall=0.3, chunk=20)


# --------------------------------------------------------------------------- shards


def tar_of(
    members: list[tuple[str, bytes]], *, fmt: int = tarfile.USTAR_FORMAT, **kwargs: Any
) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt, **kwargs) as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def members(n: int, seed: int = 0, size: int = 3000) -> list[tuple[str, bytes]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        out += [(f"{i:06d}.jpg", rng.randbytes(size)), (f"{i:06d}.cls", str(i % 3).encode())]
    return out


def header_offset(tar: bytes, index: int) -> int:
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        return archive.getmembers()[index].offset


GOOD = tar_of(members(N))
# Cut 100 bytes into the data of member 5 (sample 2's jpg), and exactly after sample 2.
CUT_MEMBER = header_offset(GOOD, 4)
TRUNCATED = GOOD[: CUT_MEMBER + 512 + 100]
AT_BOUNDARY = GOOD[: header_offset(GOOD, 6)]
NOT_UTF8 = tar_of([("000000.jpg", b"1"), ("\xff\xfe.jpg", b"2")], encoding="latin-1")
BIG = tar_of(
    [
        ("000000.jpg", random.Random(1).randbytes(50_000)),  # 12 slots' worth
        ("000000.cls", b"1"),
        ("000001.jpg", random.Random(2).randbytes(9_000)),
        ("000001.cls", b"2"),
    ]
)
NO_IMAGE = tar_of([("000000.jpg", b"x" * 10), ("000000.cls", b"0"), ("000001.cls", b"1")])


def reference(tar: bytes) -> list[dict[str, Any]]:
    """The samples by tarfile, in the stream's form (without ``__url__``)."""
    out: list[dict[str, Any]] = []
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        for info in archive:
            key, _, ext = info.name.partition(".")
            reader = archive.extractfile(info)
            assert reader is not None
            if not out or out[-1]["__key__"] != key:
                out.append({"__key__": key})
            out[-1][ext] = reader.read()
    return out


# --------------------------------------------------------------------------- the table


@dataclass
class Env:
    """What a row's mid-epoch action may touch."""

    client: Any
    bucket: str
    proxy: FaultProxy
    url: str


@dataclass(frozen=True)
class Row:
    """One bad input and what the stream must do with it.

    Attributes:
        objects: key -> body, put in a fresh bucket.
        url: the stream's URL, formatted with ``bucket``.
        culprit_url: the URL the error must name (default: ``url``).
        stage: where the error comes: "open" (constructing the stream) or "iterate".
        error: the exception type; ``None`` for a row that must work.
        culprit: fragments the message must hold, formatted with ``url`` and ``bucket``.
        offset: the ``CorruptTarError.offset`` expected.
        kwargs: more stream arguments.
        before: a fault set up before the stream opens.
        after_first: an action after the first sample (mid-epoch).
        expected: the samples a working row must give, as ``reference`` makes them.
        auth: read from a server that checks signatures, with wrong credentials.
        s3: more :class:`~asyncstream.S3Options` arguments.
    """

    objects: dict[str, bytes]
    url: str
    stage: str
    error: type[Exception] | None
    culprit: tuple[str, ...] = ()
    culprit_url: str | None = None
    offset: int | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    before: Callable[[Env], None] | None = None
    after_first: Callable[[Env], None] | None = None
    expected: list[dict[str, Any]] | None = None
    auth: bool = False


def _replace(env: Env) -> None:
    env.client.put_object(Bucket=env.bucket, Key="shard.tar", Body=tar_of(members(N, seed=9)))


def _delete(env: Env) -> None:
    env.client.delete_object(Bucket=env.bucket, Key="shard.tar")


def _revoke(env: Env) -> None:
    env.proxy.inject(
        "status",
        status=403,
        code="InvalidAccessKeyId",
        message="The AWS Access Key Id you provided does not exist in our records.",
        count=100,
        match="shard.tar",
        method="GET",
    )


def _truncate_always(env: Env) -> None:
    env.proxy.inject("truncate", count=100, match="shard.tar", method="GET")


def _stall_always(env: Env) -> None:
    env.proxy.inject("stall", count=100, match="shard.tar", method="GET", after_bytes=100)


SHARD = "s3://{bucket}/shard.tar"
COUNTED = {"samples_per_shard": N}  # nothing reads the shard before the engine does

ROWS: dict[str, Row] = {
    # -- where the shards are --------------------------------------------------------------
    "wrong-credentials": Row(
        {}, SHARD, "open", AccessDeniedError, ("{url}", "access denied", "credentials"), auth=True
    ),
    "no-such-bucket": Row(
        {},
        "s3://{bucket}-gone/shard.tar",
        "open",
        NotFoundError,
        ("{url}", "no such bucket", "'{bucket}-gone'"),
    ),
    "no-such-bucket-prefix": Row(
        {}, "s3://{bucket}-gone/train/", "open", NotFoundError, ("{url}", "NoSuchBucket")
    ),
    "no-such-key": Row({}, SHARD, "open", NotFoundError, ("{url}", "no such key")),
    "empty-prefix": Row(
        {"train/readme.txt": b"not a shard"},
        "s3://{bucket}/train/",
        "open",
        NotFoundError,
        ("{url}", "no shard (.tar/.tar.gz/.tgz/", "under this prefix"),
    ),
    # -- objects that are not tars (decided: a zero-byte object is refused) ----------------
    "zero-byte-object": Row(
        {"shard.tar": b""}, SHARD, "open", CorruptTarError, ("{url}", "empty (0 bytes)"), offset=0
    ),
    "zero-byte-object-counted": Row(
        {"shard.tar": b""},
        SHARD,
        "open",
        CorruptTarError,
        ("{url}", "empty (0 bytes)"),
        offset=0,
        kwargs={"samples_per_shard": 1},
    ),
    "zero-byte-among-good": Row(
        {"train/a.tar": GOOD, "train/b.tar": b""},
        "s3://{bucket}/train/",
        "open",
        CorruptTarError,
        ("{url}", "byte 0"),
        culprit_url="s3://{bucket}/train/b.tar",
        offset=0,
    ),
    "not-a-tar": Row(
        {"shard.tar": random.Random(3).randbytes(5000)},
        SHARD,
        "open",
        CorruptTarError,
        ("{url}", "byte 0", "checksum"),
        offset=0,
    ),
    "not-a-tar-counted": Row(
        {"shard.tar": random.Random(3).randbytes(5000)},
        SHARD,
        "iterate",
        CorruptTarError,
        ("{url}", "byte 0", "checksum"),
        offset=0,
        kwargs=COUNTED,
    ),
    "gzip-compressed-tar": Row(
        {"shard.tar": gzip.compress(GOOD, mtime=0)},
        SHARD,
        "open",
        CorruptTarError,
        ("{url}", "byte 0", "gzip-compressed"),
        offset=0,
    ),
    "smaller-than-a-header": Row(
        {"shard.tar": b"<Error>not a tar</Error>"},
        SHARD,
        "iterate",
        CorruptTarError,
        ("{url}", "byte 0", "truncated"),
        offset=0,
        kwargs={"samples_per_shard": 1},
    ),
    # -- truncated tars --------------------------------------------------------------------
    "truncated-in-a-member": Row(
        {"shard.tar": TRUNCATED},
        SHARD,
        "open",
        CorruptTarError,
        ("{url}", f"byte {CUT_MEMBER}", "past the end"),
        offset=CUT_MEMBER,
    ),
    "truncated-in-a-member-counted": Row(
        {"shard.tar": TRUNCATED},
        SHARD,
        "iterate",
        CorruptTarError,
        ("{url}", f"byte {CUT_MEMBER}", "past the end"),
        offset=CUT_MEMBER,
        kwargs=COUNTED,
    ),
    # A cut exactly at a header: only the missing end-of-archive marker shows it.
    "truncated-at-a-member-boundary": Row(
        {"shard.tar": AT_BOUNDARY},
        SHARD,
        "open",
        CorruptTarError,
        ("{url}", f"byte {len(AT_BOUNDARY)}", "end-of-archive marker", "truncated"),
        offset=len(AT_BOUNDARY),
    ),
    "truncated-at-a-member-boundary-counted": Row(
        {"shard.tar": AT_BOUNDARY},
        SHARD,
        "iterate",
        CorruptTarError,
        ("{url}", f"byte {len(AT_BOUNDARY)}", "end-of-archive marker", "truncated"),
        offset=len(AT_BOUNDARY),
        kwargs=COUNTED,
    ),
    # -- members ---------------------------------------------------------------------------
    # -- names that are not UTF-8: read with surrogate escapes, as webdataset reads them -----
    "non-utf8-member-name": Row(
        {"shard.tar": NOT_UTF8}, SHARD, "iterate", None, expected=reference(NOT_UTF8)
    ),
    "non-utf8-member-name-counted": Row(
        {"shard.tar": NOT_UTF8},
        SHARD,
        "iterate",
        None,
        expected=reference(NOT_UTF8),
        kwargs={"samples_per_shard": 2},
    ),
    "member-larger-than-a-slot": Row(
        {"shard.tar": BIG}, SHARD, "iterate", None, expected=reference(BIG)
    ),
    "sample-without-image": Row(
        {"shard.tar": NO_IMAGE}, SHARD, "iterate", None, expected=reference(NO_IMAGE)
    ),
    # -- the store changes or fails under a running epoch -----------------------------------
    "object-replaced-mid-epoch": Row(
        {"shard.tar": GOOD},
        SHARD,
        "iterate",
        PermanentFetchError,
        ("{url}", "changed since it was listed"),
        after_first=_replace,
    ),
    "object-deleted-mid-epoch": Row(
        {"shard.tar": GOOD},
        SHARD,
        "iterate",
        NotFoundError,
        ("{url}", "not found", "NoSuchKey"),
        after_first=_delete,
    ),
    "credentials-revoked-mid-epoch": Row(
        {"shard.tar": GOOD},
        SHARD,
        "iterate",
        AccessDeniedError,
        ("{url}", "access denied", "InvalidAccessKeyId"),
        after_first=_revoke,
    ),
    "truncated-on-the-wire-every-time": Row(
        {"shard.tar": GOOD},
        SHARD,
        "iterate",
        TransientFetchError,
        ("{url}", "giving up after 3 failed attempts", "truncated"),
        kwargs=COUNTED,
        before=_truncate_always,
    ),
    "store-stalls-every-time": Row(
        {"shard.tar": GOOD},
        SHARD,
        "iterate",
        TransientFetchError,
        ("{url}", "giving up after 3 failed attempts", "stall"),
        kwargs=COUNTED,
        before=_stall_always,
    ),
    "truncated-on-the-wire-while-counting": Row(
        {"shard.tar": GOOD},
        SHARD,
        "open",
        TransientFetchError,
        ("{url}", "giving up after 3 failed attempts", "truncated"),
        before=_truncate_always,
    ),
    "store-stalls-while-counting": Row(
        {"shard.tar": GOOD},
        SHARD,
        "open",
        TransientFetchError,
        ("{url}", "giving up after 3 failed attempts", "stall"),
        before=_stall_always,
    ),
}


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def auth_server(aws_env: dict[str, str]) -> Iterator[LocalS3]:
    """A server that checks request signatures (moto's IAM), so unknown keys get 403."""
    with LocalS3(mode="process", require_auth=True) as server:
        yield server


@pytest.fixture(scope="module")
def client(s3_server: LocalS3) -> Any:
    """One botocore client for the module (making one costs a few tenths of a second)."""
    return s3_server.client()


_buckets = itertools.count()


@pytest.fixture
def bucket(client: Any) -> str:
    """A fresh, empty bucket for one row."""
    name = f"bad-input-{os.getpid()}-{next(_buckets)}"
    client.create_bucket(Bucket=name)
    return name


def _drop_tracebacks(error: BaseException | None) -> None:
    """Let go of the frames an error (and its causes) keep alive."""
    while error is not None:
        error.__traceback__ = None
        error = error.__cause__ or error.__context__


def our_segments() -> set[str]:
    """The rings this process made that this process still holds (or named in /dev/shm);
    its engine process lets go of its own as it exits."""
    gc.collect()
    return segments((f"asyncstream-{os.getpid()}-",), {os.getpid()})


# --------------------------------------------------------------------------- the stream


@pytest.mark.parametrize("name", list(ROWS))
def test_bad_input(
    name: str,
    request: pytest.FixtureRequest,
    s3_server: LocalS3,
    client: Any,
    bucket: str,
    proxy: FaultProxy,
) -> None:
    row = ROWS[name]
    for key, body in row.objects.items():
        client.put_object(Bucket=bucket, Key=key, Body=body)
    url = row.url.format(bucket=bucket)
    culprit_url = (row.culprit_url or row.url).format(bucket=bucket)
    if row.auth:
        server: LocalS3 = request.getfixturevalue("auth_server")
        wrong = S3Credentials("AKIAWRONGKEYID000000", "wrong-secret-for-the-matrix")
        options = S3Options(endpoint_url=server.endpoint_url, credentials=wrong)
    else:
        options = S3Options(
            endpoint_url=proxy.endpoint_url, credentials=s3_server.options().credentials
        )
    env = Env(client, bucket, proxy, url)
    if row.before is not None:
        row.before(env)
    kwargs = {
        "s3": options,
        "chunk_bytes": CHUNK,
        "window": 1,
        "inflight": 1,  # one chunk ahead at most: a mid-epoch change meets later chunks
        "shuffle": False,
        "retry": FAST_RETRY,
        "timeouts": SHORT,
        **row.kwargs,
    }
    before = our_segments()
    samples: list[dict[str, Any]] = []
    expect = pytest.raises(row.error) if row.error else contextlib.nullcontext()
    with expect as caught, ShardStream(url, **kwargs) as stream:
        assert row.stage == "iterate", "constructing the stream should have failed"
        for sample in stream:
            samples.append(sample)
            if len(samples) == 1 and row.after_first is not None:
                row.after_first(env)
    # The closed stream and the error's traceback (pytest's, and the error's own: their
    # frames) hold the last chunk views: the ring stays mapped while they live, no longer.
    error = None if caught is None else caught.value
    del caught, expect
    stream = None  # type: ignore[assignment]  # (unbound where constructing it failed)
    _drop_tracebacks(error)
    assert our_segments() <= before  # the ring is gone, error or not
    if row.error is None:
        assert [{k: v for k, v in s.items() if k != "__url__"} for s in samples] == row.expected
        assert all(s["__url__"] == culprit_url for s in samples)
        return
    assert error is not None
    assert type(error) is row.error, f"{type(error).__name__}: {error}"
    if row.stage == "open":
        assert samples == []
    else:
        assert len(samples) < N
    message = str(error)
    for fragment in row.culprit:
        assert fragment.format(url=culprit_url, bucket=bucket) in message, message
    if isinstance(error, CorruptTarError | PermanentFetchError | TransientFetchError):
        assert error.url == culprit_url
    if row.offset is not None:
        assert isinstance(error, CorruptTarError)
        assert error.offset == row.offset


def test_every_row_goes_through_the_engine_or_fails_before_it() -> None:
    stages = {row.stage for row in ROWS.values()}
    assert stages == {"open", "iterate"}
    for name, row in ROWS.items():
        assert (row.error is None) == (row.expected is not None), name
        assert row.error is None or row.culprit, name


# --------------------------------------------------------------------------- the loader


def jpeg(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (24, 32, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG")
    return out.getvalue()


def _corrupt_data(good: bytes) -> bytes:
    """A JPEG whose header and end marker are intact and whose data is not: DALI fails."""
    return good[:200] + bytes(range(256)) * 2 + good[-300:]


BAD = 5  # the bad sample's index; batches of 3: batch 1 holds it
IMAGE_ROWS: dict[str, tuple[Callable[[bytes], bytes | None], str]] = {
    "sample-without-image": (lambda good: None, "no image member: it has 'cls'"),
    "not-an-image": (lambda good: b"<html>this is not an image</html>" * 9, "not an image"),
    "corrupt-jpeg-data": (_corrupt_data, "DALI cannot decode it"),
}


@pytest.fixture(scope="module")
def image_shards(client: Any) -> dict[str, str]:
    """One shard of 8 samples per image row, sample BAD broken; returns row -> URL."""
    client.create_bucket(Bucket="bad-images")
    urls = {}
    for name, (breaks, _) in IMAGE_ROWS.items():
        entries = []
        for i in range(8):
            image = jpeg(i) if i != BAD else breaks(jpeg(i))
            if image is not None:
                entries.append((f"{i:06d}.jpg", image))
            entries.append((f"{i:06d}.cls", str(i % 3).encode()))
        client.put_object(Bucket="bad-images", Key=f"{name}.tar", Body=tar_of(entries))
        urls[name] = f"s3://bad-images/{name}.tar"
    return urls


def image_loader(s3_server: LocalS3, url: str, on_error: str) -> Any:
    from dali_ops import DALIImageLoader, PipelineSettings

    stream = ShardStream(
        url, s3=s3_server.options(), shuffle=False, window=1, inflight=1, chunk_bytes=CHUNK
    )
    settings = PipelineSettings(image_size=16, num_threads=1, seed=0, train=False)
    return DALIImageLoader(stream, 3, device="cpu", on_error=on_error, settings=settings)


def drain(loader: Any, keys: list[str]) -> None:
    """Read a pass, appending each batch's keys as it is handed out."""
    for _ in loader:
        keys += [k for _, k in loader.last_keys]


@pytest.mark.parametrize("on_error", ["raise", "skip"])
@pytest.mark.parametrize("name", list(IMAGE_ROWS))
def test_bad_image(
    name: str, on_error: str, s3_server: LocalS3, image_shards: dict[str, str]
) -> None:
    url, why = image_shards[name], IMAGE_ROWS[name][1]
    key = f"{BAD:06d}"
    keys: list[str] = []
    with image_loader(s3_server, url, on_error) as loader:
        if on_error == "raise":
            with pytest.raises(DecodeError) as caught:
                drain(loader, keys)
            message = str(caught.value)
            assert url in message
            assert repr(key) in message
            assert why in message
            assert keys == [f"{i:06d}" for i in range(3)]  # every earlier batch came first
            return
        drain(loader, keys)
        stats = loader.stats()
    assert keys == [f"{i:06d}" for i in range(8) if i != BAD]
    assert stats["skipped"] == 1
    assert stats["images"] == 7
    (skipped,) = stats["skipped_samples"]
    assert skipped[:2] == (url, key)
    assert why.removeprefix("DALI cannot decode it") in skipped[2]


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_label_that_is_no_integer_raises_under_both_policies(
    on_error: str, s3_server: LocalS3, client: Any, bucket: str
) -> None:
    entries = [("000000.jpg", jpeg(0)), ("000000.cls", b"1"), ("000001.jpg", jpeg(1))]
    entries.append(("000001.cls", b"1.5e0"))
    client.put_object(Bucket=bucket, Key="labels.tar", Body=tar_of(entries))
    url = f"s3://{bucket}/labels.tar"
    with image_loader(s3_server, url, on_error) as loader, pytest.raises(DataError) as caught:
        list(loader)
    assert not isinstance(caught.value, DecodeError)
    assert url in str(caught.value)
    assert "'000001'" in str(caught.value)
    assert "no integer label in 'cls'" in str(caught.value)
