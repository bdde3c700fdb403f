"""What every peer adapter shares, on the child side: the run context, samples, tar reading
and the process measurements.

Only the standard library is imported here (boto3 and torch are imported where used), so
this module loads in any interpreter that runs a peer, the main one or ``.venv-peers``.
"""

from __future__ import annotations

import os
import resource
import tarfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, NamedTuple

__all__ = [
    "PEERS",
    "PROBE_TAG",
    "Context",
    "PeerInfo",
    "Sample",
    "delete_prefix",
    "dir_bytes",
    "identity",
    "iterate",
    "mapped_shm_bytes",
    "prefix_bytes",
    "proc_status",
    "reset_peak_rss",
    "rusage",
    "s3_client",
    "sample_of",
    "split_s3_url",
    "tar_samples",
]


@dataclass(frozen=True)
class PeerInfo:
    """A peer as the harness sees it before importing it.

    Attributes:
        module: its adapter, ``bench.peers.<module>``.
        converts: whether it reads its own format, written from the tars by a conversion
            step first.
    """

    module: str
    converts: bool = False


PEERS: dict[str, PeerInfo] = {
    "naive": PeerInfo("naive"),
    "webdataset": PeerInfo("wds"),
    "s3torchconnector": PeerInfo("s3connector"),
    "mosaic": PeerInfo("mosaic", converts=True),
    "litdata": PeerInfo("lit", converts=True),
}
"""The peers, by name, in the order a report lists them."""

PROBE_TAG = "bench.peers.probe: "
"""Starts the line of ``python -m bench.peers.run --probe`` output that holds its JSON."""


@dataclass(frozen=True, kw_only=True)
class Context:
    """What one peer run is given (the child reads it from the spec file).

    Attributes:
        shards: the tar shards, ``s3://bucket/key``, in dataset order.
        target: where a converting peer writes its own format, and reads it back from.
        endpoint_url: the S3 endpoint (also in ``AWS_ENDPOINT_URL``), or ``None`` for AWS.
        region: the S3 region.
        seed: the shuffle seed.
        workers: DataLoader worker processes (0: iterate in this process).
        batch_size: the per-device batch size, for peers whose shuffle depends on it.
        shuffle_buffer: webdataset's sample shuffle buffer.
        scratch: a folder of this run's own (caches, temporary files); removed afterwards.
        end_of_epoch: called by the peer after its last sample, while its dataset, caches
            and shared memory are still alive, so that they can be measured.
    """

    shards: list[str]
    target: str
    endpoint_url: str | None
    region: str
    seed: int
    workers: int
    batch_size: int
    shuffle_buffer: int
    scratch: Path
    end_of_epoch: Callable[[], None] = field(default=lambda: None, repr=False)


class Sample(NamedTuple):
    """One emitted sample, as the measurement needs it."""

    key: str
    label: int
    nbytes: int


def sample_of(key: str, jpg: Any, cls: Any) -> Sample:
    """A :class:`Sample` from a key and the ``jpg`` and ``cls`` payloads (bytes-like)."""
    return Sample(key, int(bytes(cls).strip() or b"-1"), len(jpg) + len(cls))


def delete_prefix(client: Any, url: str) -> None:
    """Delete every object under ``s3://bucket/prefix`` (a conversion's old output)."""
    bucket, prefix = split_s3_url(url)
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
        keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})


def prefix_bytes(client: Any, url: str) -> tuple[int, int]:
    """(objects, bytes) under ``s3://bucket/prefix``."""
    bucket, prefix = split_s3_url(url)
    count = size = 0
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            count += 1
            size += int(item["Size"])
    return count, size


def split_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/key`` → ``(bucket, key)``."""
    if not url.startswith("s3://"):
        raise ValueError(f"expected an s3:// URL, got {url!r}")
    bucket, _, key = url[len("s3://") :].partition("/")
    return bucket, key


def s3_client(endpoint_url: str | None) -> Any:
    """A boto3 S3 client: credentials and region from the environment, path-style
    addressing for a custom endpoint (as MinIO, moto and proxies in front of them need)."""
    import boto3
    from botocore.config import Config

    config = Config(s3={"addressing_style": "path"}) if endpoint_url else None
    return boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=config)


def tar_samples(fileobj: IO[bytes]) -> Iterator[tuple[str, dict[str, bytes]]]:
    """Read a tar stream front to back and group consecutive members by key.

    As webdataset does: ``dir/000017.jpg`` and ``dir/000017.cls`` make the sample
    ``"dir/000017"`` with fields ``jpg`` and ``cls``. The stream is read once, in order.
    """
    key: str | None = None
    fields: dict[str, bytes] = {}
    with tarfile.open(fileobj=fileobj, mode="r|") as archive:
        for member in archive:
            if not member.isfile():
                continue
            name = member.name
            slash = name.rfind("/")
            dot = name.find(".", slash + 1)
            if dot < 0:
                continue
            member_key, ext = name[:dot], name[dot + 1 :]
            handle = archive.extractfile(member)
            data = handle.read() if handle is not None else b""
            if member_key != key:
                if key is not None:
                    yield key, fields
                key, fields = member_key, {}
            fields[ext] = data
    if key is not None:
        yield key, fields


def identity(batch: Any) -> Any:
    """A DataLoader ``collate_fn`` that hands samples over untouched."""
    return batch


def iterate(dataset: Any, workers: int) -> Iterator[Any]:
    """Iterate a dataset in this process, or through a DataLoader with ``workers`` processes
    (``dataset`` is then a torch ``IterableDataset``)."""
    if workers == 0:
        yield from dataset
        return
    from torch.utils.data import DataLoader

    loader: Iterable[Any] = DataLoader(
        dataset,
        batch_size=None,
        num_workers=workers,
        collate_fn=identity,
    )
    yield from loader


def proc_status() -> dict[str, int]:
    """The memory lines of ``/proc/self/status``, in bytes (``VmRSS``, ``VmHWM``, ...)."""
    out: dict[str, int] = {}
    with open("/proc/self/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            parts = value.split()
            if len(parts) == 2 and parts[1] == "kB":
                out[name] = int(parts[0]) * 1024
    return out


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS (``VmHWM``) to its current RSS; ``False`` if refused."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:
        return False
    return True


def rusage() -> tuple[float, float]:
    """(CPU seconds of this process, CPU seconds of its children that have been reaped).

    Children's peak RSS is left out on purpose: a forked child's counts the pages it shares
    with its parent, so it says nothing about what the child itself used.
    """
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def mapped_shm_bytes() -> int:
    """Bytes of shared-memory segments this process has mapped now (each segment once):
    ``/dev/shm`` ones and memfds (asyncstream's rings and batch buffers)."""
    segments: dict[str, int] = {}
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].startswith(("/dev/shm/", "/memfd:")):
                start, _, end = parts[0].partition("-")
                name = parts[5].strip()
                segments[name] = segments.get(name, 0) + int(end, 16) - int(start, 16)
    return sum(segments.values())


def dir_bytes(root: Path) -> int:
    """Bytes of the regular files under ``root`` (0 if it does not exist)."""
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except FileNotFoundError:
                continue
    return total
