"""Shards that ``asyncstream pack`` did not write: made with ``tarfile`` and ``webdataset``.

What users bring: keys that are not pack's numbering, members of varied sizes (some larger
than a chunk, so samples straddle chunks), extra fields, and no asyncstream manifest.
"""

from __future__ import annotations

import io
import random
import tarfile
from dataclasses import dataclass
from pathlib import Path

import webdataset

__all__ = ["ForeignShards", "write_foreign_shards"]


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
    """Write ``n_shards`` tar shards, even ones with ``tarfile``, odd ones with
    ``webdataset.TarWriter``; each sample has ``jpg`` (random bytes, or the given JPEGs in
    turn), ``cls`` (ASCII digits) and, in every third sample, ``json``. ``counts`` fixes
    the samples of each shard (else drawn from ``samples``)."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    written: list[int] = []
    keys: list[str] = []
    for shard in range(n_shards if counts is None else len(counts)):
        n = counts[shard] if counts is not None else rng.randint(*samples)
        written.append(n)
        path = folder / f"{prefix}-{shard:05d}.tar"
        rows = []
        for i in range(n):
            key = f"{prefix}{shard:03d}/img_{rng.getrandbits(32):08x}_{i}"
            jpg = jpgs[len(keys) % len(jpgs)] if jpgs else rng.randbytes(rng.randint(*jpg_bytes))
            fields = {"jpg": jpg, "cls": str(len(keys) % 7).encode()}
            if i % 3 == 0:
                fields["json"] = b'{"source": "%d"}' % i
            rows.append((key, fields))
            keys.append(key)
        if shard % 2 == 0:
            with tarfile.open(path, "w") as tar:
                for key, fields in rows:
                    for ext, data in fields.items():
                        info = tarfile.TarInfo(f"{key}.{ext}")
                        info.size = len(data)
                        tar.addfile(info, io.BytesIO(data))
        else:
            with webdataset.TarWriter(str(path)) as sink:
                for key, fields in rows:
                    sink.write({"__key__": key, **fields})
    return ForeignShards(folder, written, keys)
