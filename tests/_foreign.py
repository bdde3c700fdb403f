"""Shards as other tools write them (``tarfile``, ``webdataset.TarWriter``), for the tests.

Never made by ``asyncstream pack``: what users bring. Two shapes:

* :func:`foreign_shards` (in memory, then :func:`write` or :func:`upload`): keys follow the
  tools whose layouts they stand for, img2dataset's nine digits (``000010003``), timm's
  ``imagenet-train-0000.tar`` shard names, and so on; each sample has a ``jpg`` (random
  bytes: nothing here decodes them), a ``cls`` and a ``json``.
* :func:`write_foreign_shards` (a folder): keys that are not any tool's numbering, members
  of varied sizes (some larger than a chunk, so samples straddle chunks), real JPEGs when
  given, ``json`` in every third sample, and the keys and counts to check epochs against.
"""

from __future__ import annotations

import io
import json
import random
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Rows = list[tuple[str, dict[str, bytes]]]


def gnu_tar() -> str | None:
    """The path of GNU tar, or None where ``tar`` is missing or another one."""
    tar = shutil.which("tar")
    if tar is None:
        return None
    version = subprocess.run([tar, "--version"], capture_output=True, text=True).stdout
    return tar if "GNU tar" in version else None


def _tarfile_bytes(rows: Rows) -> bytes:
    """A shard written with the standard library's ``tarfile`` (GNU format, as tar does)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for key, fields in rows:
            for ext, data in fields.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                info.mtime = 1_700_000_000
                archive.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _webdataset_bytes(rows: Rows) -> bytes:
    """A shard written with ``webdataset.TarWriter``."""
    import webdataset

    buf = io.BytesIO()
    with webdataset.TarWriter(buf) as sink:
        for key, fields in rows:
            sample: dict[str, Any] = {"__key__": key, **fields}
            sink.write(sample)
    return buf.getvalue()


@dataclass(frozen=True)
class Foreign:
    """One shard: its name, its bytes and the keys of its samples, in order."""

    name: str
    data: bytes
    keys: list[str]


def _samples(shard: int, n: int, seed: int) -> list[tuple[str, dict[str, bytes]]]:
    rng = random.Random(f"{seed}-{shard}")
    out = []
    for i in range(n):
        key = f"{shard:05d}{i:04d}"
        fields = {
            "jpg": rng.randbytes(rng.choice([300, 900, 2500])),
            "cls": str(i % 7).encode(),
            "json": json.dumps({"key": key, "status": "success"}).encode(),
        }
        out.append((key, fields))
    return out


def tarfile_shard(name: str, shard: int, n: int, seed: int = 0) -> Foreign:
    """A shard written with the standard library's ``tarfile``."""
    samples = _samples(shard, n, seed)
    return Foreign(name, _tarfile_bytes(samples), [key for key, _ in samples])


def webdataset_shard(name: str, shard: int, n: int, seed: int = 0) -> Foreign:
    """A shard written with ``webdataset.TarWriter``."""
    samples = _samples(shard, n, seed)
    return Foreign(name, _webdataset_bytes(samples), [key for key, _ in samples])


def foreign_shards(
    names: list[str], sizes: list[int], *, seed: int = 0, writer: str = "mixed"
) -> list[Foreign]:
    """Shards ``names`` of ``sizes`` samples; ``writer`` "tarfile", "webdataset" or "mixed"
    (alternating, so a dataset holds both)."""
    out = []
    for i, (name, n) in enumerate(zip(names, sizes, strict=True)):
        use_wds = writer == "webdataset" or (writer == "mixed" and i % 2 == 1)
        make = webdataset_shard if use_wds else tarfile_shard
        out.append(make(name, i, n, seed))
    return out


def upload(client: Any, bucket: str, prefix: str, shards: list[Foreign]) -> None:
    for shard in shards:
        client.put_object(Bucket=bucket, Key=f"{prefix}{shard.name}", Body=shard.data)


def write(folder: Path, shards: list[Foreign]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for shard in shards:
        (folder / shard.name).write_bytes(shard.data)


@dataclass(frozen=True)
class ForeignShards:
    """Where the shards are, their sample counts and every sample's key, in shard order."""

    folder: Path
    counts: list[int]
    keys: list[str]

    @property
    def total(self) -> int:
        return sum(self.counts)


def write_foreign_shards(
    folder: Path,
    n_shards: int,
    *,
    seed: int = 0,
    samples: tuple[int, int] = (12, 30),
    counts: list[int] | None = None,
    jpg_bytes: tuple[int, int] = (200, 6000),
    jpgs: list[bytes] | None = None,
    prefix: str = "part",
) -> ForeignShards:
    """Write ``n_shards`` tar shards into ``folder``, even ones with ``tarfile``, odd ones
    with ``webdataset.TarWriter``; each sample has ``jpg`` (random bytes, or the given JPEGs
    in turn), ``cls`` (ASCII digits) and, in every third sample, ``json``. ``counts`` fixes
    the samples of each shard (else drawn from ``samples``)."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    written: list[int] = []
    keys: list[str] = []
    for shard in range(n_shards if counts is None else len(counts)):
        n = counts[shard] if counts is not None else rng.randint(*samples)
        written.append(n)
        rows: Rows = []
        for i in range(n):
            key = f"{prefix}{shard:03d}/img_{rng.getrandbits(32):08x}_{i}"
            jpg = jpgs[len(keys) % len(jpgs)] if jpgs else rng.randbytes(rng.randint(*jpg_bytes))
            fields = {"jpg": jpg, "cls": str(len(keys) % 7).encode()}
            if i % 3 == 0:
                fields["json"] = b'{"source": "%d"}' % i
            rows.append((key, fields))
            keys.append(key)
        data = _tarfile_bytes(rows) if shard % 2 == 0 else _webdataset_bytes(rows)
        (folder / f"{prefix}-{shard:05d}.tar").write_bytes(data)
    return ForeignShards(folder, written, keys)
