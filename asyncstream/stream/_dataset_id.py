"""A dataset's identity in a saved state: what decides the order, not where it lives.

A state names its dataset by a fingerprint of what the epoch's order is made of: each
shard's *relative* name (its URL less the folder, bucket or origin that all the shards of
its source share, and less a web URL's query), its size and its sample count, in order.
So the same shards copied from ``s3://bucket/train/`` to ``/nvme/train/`` (or to another
bucket) are the same dataset, and a state saved on one resumes exactly on the other.
ETags are left out: S3's is an MD5 where a local file has none.

States saved before (asyncstream up to this change) name the dataset by the old
fingerprint, over full URLs, sizes, ETags and counts; it is still accepted
(:attr:`DatasetId.legacy`), so those states load where their shards still are.

Beside the fingerprint a state carries ``dataset_shards``, a small description of the
dataset (where it was, how many shards, samples and bytes, digests of the names, counts and
sizes, and one digest per group of at most 32 groups of neighbouring shards), from which a
refusal says what differs: the shard count, the names, counts or sizes, and in which
shard (or group of shards). It is read as hostile data: anything malformed is ignored.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..shards._urls import Shard

__all__ = ["DatasetId", "dataset_id", "difference"]

_GROUPS = 32
_TAG = b"asyncstream dataset 2\n"


@dataclass(frozen=True)
class DatasetId:
    """A dataset's fingerprint, its older form and its description (see the module)."""

    fingerprint: str
    legacy: str
    shards: Mapping[str, Any]
    names: tuple[str, ...]  # each shard's relative name, for messages

    def accepts(self, saved: object) -> bool:
        """Whether ``saved`` (a state's ``dataset``) names this dataset."""
        return saved == self.fingerprint or saved == self.legacy

    def description(self) -> dict[str, Any]:
        """``dataset_shards`` for a new state: a new dict (and lists) each call."""
        return {k: list(v) if isinstance(v, list) else v for k, v in self.shards.items()}


def _relative(urls: Sequence[str]) -> tuple[str, list[str]]:
    """The folder the URLs share (up to a ``/``) and each URL's name below it."""
    bare = [u.split("?", 1)[0] if u.startswith(("http://", "https://")) else u for u in urls]
    if not bare:
        return "", []
    lo, hi = min(bare), max(bare)
    n = 0
    while n < min(len(lo), len(hi)) and lo[n] == hi[n]:
        n += 1
    cut = lo.rfind("/", 0, n if len(bare) > 1 else len(lo)) + 1
    return bare[0][:cut], [u[cut:] for u in bare]


def _digest(lines: Sequence[str], size: int = 16) -> str:
    h = hashlib.sha256(_TAG)
    for line in lines:
        h.update(line.encode("utf-8", "surrogatepass") + b"\n")
    return h.hexdigest()[:size]


def dataset_id(
    shards: Sequence[Shard], counts: Sequence[int], groups: Sequence[tuple[int, int]]
) -> DatasetId:
    """The identity of ``shards`` (with their sample ``counts``), each ``(first, stop)``
    range of ``groups`` (a mixed stream's sources; else the whole list) named relative to
    its own folder."""
    legacy = hashlib.sha256()
    for shard, n in zip(shards, counts, strict=True):
        legacy.update(f"{shard.url}\0{shard.size}\0{shard.etag}\0{n}\n".encode())
    roots: list[str] = []
    names: list[str] = []
    for first, stop in groups or [(0, len(shards))]:
        root, below = _relative([s.url for s in shards[first:stop]])
        roots.append(root)
        names.extend(below)
    sizes = [str(s.size) for s in shards]
    lines = [f"{name}\0{size}\0{n}" for name, size, n in zip(names, sizes, counts, strict=True)]
    step = max(1, -(-len(lines) // _GROUPS))
    described: dict[str, Any] = {
        "where": roots,
        "shards": len(shards),
        "samples": sum(counts),
        "bytes": sum(s.size for s in shards),
        "first": names[0] if names else "",
        "names": _digest(names),
        "counts": _digest([str(n) for n in counts]),
        "sizes": _digest(sizes),
        "groups": [_digest(lines[i : i + step], 8) for i in range(0, len(lines), step)],
    }
    return DatasetId(_digest(lines, 32), legacy.hexdigest()[:32], described, tuple(names))


def _summary(d: Mapping[str, Any]) -> str:
    where = ", ".join(str(w) for w in d.get("where", []) if isinstance(w, str))[:300]
    return (
        f"{d.get('shards')} shards under {where or '?'} (first {str(d.get('first'))[:100]!r}, "
        f"{d.get('samples')} samples, {d.get('bytes')} bytes)"
    )


def _valid(saved: object) -> Mapping[str, Any] | None:
    """``saved`` where it has the shape of a ``dataset_shards``, else None (hostile)."""
    if not isinstance(saved, Mapping):
        return None
    ints = ("shards", "samples", "bytes")
    strs = ("first", "names", "counts", "sizes")
    if not all(type(saved.get(k)) is int for k in ints):
        return None
    if not all(isinstance(saved.get(k), str) for k in strs):
        return None
    for key in ("where", "groups"):
        value = saved.get(key)
        if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            return None
    return saved


def difference(saved: object, here: DatasetId) -> str:
    """Why a state's dataset (its ``dataset_shards``, ``saved``) is not ``here``'s: both
    datasets, and what differs where the state says enough."""
    mine = here.shards
    old = _valid(saved)
    if old is None:
        return (
            "state_dict was saved from another dataset (the state does not describe it: "
            f"saved by an older asyncstream, whose states resume only on the same URLs); "
            f"this stream has {_summary(mine)}"
        )
    what = _what(old, here)
    return (
        f"state_dict was saved from another dataset: {what}. The state's: {_summary(old)}; "
        f"this stream's: {_summary(mine)}"
    )


def _what(old: Mapping[str, Any], here: DatasetId) -> str:
    mine = here.shards
    if old["shards"] != mine["shards"]:
        return f"{old['shards']} shards in the state, {mine['shards']} here"
    kinds = [k for k in ("names", "counts", "sizes") if old[k] != mine[k]]
    words = {"names": "shard names", "counts": "sample counts", "sizes": "shard sizes"}
    what = " and ".join(words[k] for k in kinds) or "the shards"
    n, groups = mine["shards"], mine["groups"]
    if len(old["groups"]) != len(groups):
        return f"{what} differ"
    step = max(1, -(-n // _GROUPS))
    for g, (a, b) in enumerate(zip(old["groups"], groups, strict=True)):
        if a != b:
            first, last = g * step, min(n, (g + 1) * step) - 1
            if first == last:
                return f"{what} differ, at shard {first} ({here.names[first]!r} here)"
            return (
                f"{what} differ, first in shards {first} to {last} "
                f"({here.names[first]!r} to {here.names[last]!r} here)"
            )
    return f"{what} differ"
