"""The S3 servers the HTTPS and second-server tests run against, and their shared checks.

A :class:`Backend` is one S3 implementation reachable over HTTP and over HTTPS (its own TLS
listener, with the session's test certificate): moto, and s3rver
(``asyncstream.testing.S3rver``). The tests upload foreign shards (``_foreign.py``) to
it, read them back through :class:`~asyncstream.ShardStream` on either transport, and
check the epoch is exact.
"""

from __future__ import annotations

import tarfile
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from asyncstream import RetryPolicy, S3Credentials, S3Options, Timeouts
from asyncstream.stores._s3 import sync_client
from asyncstream.testing._s3rver import S3rver, S3rverUnavailable

if TYPE_CHECKING:
    from _foreign import ForeignShards

    from asyncstream import ShardStream

__all__ = [
    "FAST_RETRY",
    "SHORT",
    "Backend",
    "Dataset",
    "assert_exact_epoch",
    "open_stream",
    "start_s3rver_or_skip",
    "upload_foreign",
]

FAST_RETRY = RetryPolicy(max_attempts=12, base_delay=0.005, max_delay=0.05, deadline=60)
SHORT = Timeouts(connect=5, first_byte=5, stall=0.5, chunk=20)


@dataclass(frozen=True)
class Backend:
    """One S3 implementation, over HTTP and HTTPS.

    Attributes:
        name: ``"moto"`` or ``"s3rver"``.
        http: its plain endpoint (what a :class:`FaultProxy` forwards to).
        https: its own TLS endpoint, with the session's test certificate.
        ca_bundle: the test CA.
        credentials: what it accepts (s3rver checks signatures; moto here does not).
        honours_if_match: whether a GET with a stale ``If-Match`` gets 412 (moto, S3) or
            is served anyway (s3rver 3.7.1).
    """

    name: str
    http: str
    https: str
    ca_bundle: str
    credentials: S3Credentials
    honours_if_match: bool

    def endpoint(self, scheme: str) -> str:
        return self.https if scheme == "https" else self.http

    def options(self, endpoint: str, **overrides: Any) -> S3Options:
        """Options for ``endpoint`` (this server, or a proxy in front of it)."""
        base = S3Options(
            endpoint_url=endpoint, credentials=self.credentials, ca_bundle=self.ca_bundle
        )
        return replace(base, **overrides).resolve()

    def client(self) -> Any:
        """A botocore client over HTTP, to set up buckets and objects."""
        return sync_client(self.options(self.http))


@dataclass(frozen=True)
class Dataset:
    """Foreign shards uploaded to a bucket: their URLs, bytes and samples."""

    bucket: str
    shards: ForeignShards
    blobs: dict[str, bytes]  # s3:// URL -> the shard's bytes
    samples: dict[str, dict[str, bytes]]  # key -> {extension: bytes}

    @property
    def prefix(self) -> str:
        return f"s3://{self.bucket}/"

    def url(self, shard: int) -> str:
        return f"s3://{self.bucket}/part-{shard:05d}.tar"

    def name(self, shard: int) -> str:
        """The shard's key, which FaultProxy faults match."""
        return f"part-{shard:05d}.tar"


def _samples(paths: Iterable[Path]) -> dict[str, dict[str, bytes]]:
    """Every sample of the shards, read back with ``tarfile``."""
    out: dict[str, dict[str, bytes]] = {}
    for path in paths:
        with tarfile.open(path) as tar:
            for member in tar:
                key, _, ext = member.name.rpartition(".")
                data = tar.extractfile(member)
                assert data is not None
                out.setdefault(key, {})[ext] = data.read()
    return out


def upload_foreign(client: Any, bucket: str, folder: Path, n_shards: int, **kwargs: Any) -> Dataset:
    """Write foreign shards into ``folder`` and upload them to a new ``bucket``."""
    from _foreign import write_foreign_shards  # webdataset imports PyTorch

    shards = write_foreign_shards(folder, n_shards, **kwargs)
    client.create_bucket(Bucket=bucket)
    blobs = {}
    paths = sorted(folder.glob("*.tar"))
    for path in paths:
        client.put_object(Bucket=bucket, Key=path.name, Body=path.read_bytes())
        blobs[f"s3://{bucket}/{path.name}"] = path.read_bytes()
    return Dataset(bucket, shards, blobs, _samples(paths))


def open_stream(
    dataset: Dataset, options: S3Options, *, transport: str = "auto", **kwargs: Any
) -> ShardStream:
    """A ShardStream over the whole dataset: small chunks (many requests), fast retries,
    the engine on ``transport``; ``kwargs`` are ShardStream's flat settings."""
    from asyncstream import FetchConfig, ShardStream

    fetching = {"inflight": 4, "chunk_bytes": 16 << 10, "retry": FAST_RETRY, "timeouts": SHORT}
    for name in ("inflight", "chunk_bytes", "retry", "timeouts", "check_etag", "hedge"):
        if name in kwargs:
            fetching[name] = kwargs.pop(name)
    fetch = FetchConfig(**fetching, transport=transport)
    settings: dict[str, Any] = {
        "s3": options,
        "samples_per_shard": dataset.shards.counts,
        "window": 4,
        "seed": 3,
        **kwargs,
    }
    return ShardStream(dataset.prefix, fetch=fetch, **settings)


def assert_exact_epoch(samples: list[dict[str, Any]], dataset: Dataset) -> None:
    """Every sample of the dataset exactly once, each field's bytes equal to the shard's."""
    keys = Counter(sample["__key__"] for sample in samples)
    assert [key for key, n in keys.items() if n > 1] == []
    assert set(keys) == set(dataset.samples)
    for sample in samples:
        fields = {k: v for k, v in sample.items() if not k.startswith("__")}
        assert fields == dataset.samples[sample["__key__"]], sample["__key__"]
        assert sample["__url__"] in dataset.blobs


def start_s3rver_or_skip(server: S3rver) -> S3rver:
    """Started, or the test skipped where s3rver cannot be installed; an installed s3rver
    that does not start raises :class:`~asyncstream.testing.S3rverStartError`, which fails
    its tests instead of skipping them."""
    try:
        return server.start()
    except S3rverUnavailable as exc:
        pytest.skip(f"s3rver, the second S3 server, cannot be installed here: {exc}")
