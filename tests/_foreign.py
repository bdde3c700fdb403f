"""Shards as other tools write them (``tarfile``, ``webdataset.TarWriter``), for the tests.

Keys follow the tools whose layouts they stand for: img2dataset's nine digits
(``000010003``), timm's ``imagenet-train-0000.tar`` shard names, and so on. Each sample
has a ``jpg`` (random bytes: nothing here decodes them), a ``cls`` and a ``json``.
"""

from __future__ import annotations

import io
import json
import random
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any


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
    """A shard written with the standard library's ``tarfile`` (GNU format, as tar does)."""
    buf = io.BytesIO()
    samples = _samples(shard, n, seed)
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for key, fields in samples:
            for ext, data in fields.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                info.mtime = 1_700_000_000
                archive.addfile(info, io.BytesIO(data))
    return Foreign(name, buf.getvalue(), [key for key, _ in samples])


def webdataset_shard(name: str, shard: int, n: int, seed: int = 0) -> Foreign:
    """A shard written with ``webdataset.TarWriter``."""
    import webdataset

    buf = io.BytesIO()
    samples = _samples(shard, n, seed)
    with webdataset.TarWriter(buf) as sink:
        for key, fields in samples:
            sample: dict[str, Any] = {"__key__": key, **fields}
            sink.write(sample)
    return Foreign(name, buf.getvalue(), [key for key, _ in samples])


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
