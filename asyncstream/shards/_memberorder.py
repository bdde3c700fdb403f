"""A warning for a shard whose samples' members are apart.

A sample is a run of *adjacent* members sharing a key (webdataset's rule, :mod:`._tar`).
``tar czf s.tar.gz -C dir .`` writes a folder's files in directory order, so the members
of one key (``0001.jpg``, ``0001.cls``) land apart: the shard then reads as about twice
as many samples, most with one member, and a loader fails later on a missing label.

:class:`MemberOrder` looks at the first :data:`LOOK` samples of a shard read from its start
(the same records whichever walk made them, native or Python: a bounded cost per shard,
nothing per sample past them). Where a key comes back in a later sample and most samples
hold fewer members than the set of their key, it warns (:class:`MemberOrderWarning`), once
per folder of shards in a process, with the likely cause and the fix.
"""

from __future__ import annotations

import threading
import warnings
from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._tarfast import Records

from .._exceptions import MemberOrderWarning

__all__ = ["LOOK", "MemberOrder"]

LOOK = 256  # samples looked at, at the start of each shard
_warned: set[str] = set()  # folders of shards warned about, in this process
_lock = threading.Lock()


class MemberOrder:
    """Collects the members of a shard's first samples; warns once they say enough.

    Args:
        url: the shard, named in the warning.
    """

    __slots__ = ("_exts", "_keys", "url")

    def __init__(self, url: str) -> None:
        self.url = url
        self._keys: list[str] = []  # the key of each sample seen
        self._exts: list[tuple[str, ...]] = []  # the member extensions of each

    def see(self, records: Records, done: bool) -> bool:
        """Take a range's records (each ``(key, offset, *fields)``); ``done``: the shard
        has ended. True once it has seen enough (warned, or not): drop it then.

        The native walk's table gives the keys and extensions in bulk
        (``Records.members``), with no record tuple per sample: looking at the first
        :data:`LOOK` samples of each shard one record at a time cost 0.4 to 0.5 us a
        sample over shards of 2,000 tiny images (``python -m bench.samplecost``)."""
        take = min(len(records), LOOK - len(self._keys))
        if take > 0:
            keys, exts = _members(records, take)
            self._keys += keys
            self._exts += exts
        if len(self._keys) < LOOK and not done:
            return False
        self._judge()
        return True

    def _judge(self) -> None:
        keys = self._keys
        if len(set(keys)) == len(keys):
            return  # no key comes back: members are adjacent (the common case, in C)
        sets: dict[str, set[str]] = {}
        for key, exts in zip(keys, self._exts, strict=True):
            sets.setdefault(key, set()).update(exts)
        rows = [(key, len(exts)) for key, exts in zip(keys, self._exts, strict=True)]
        usual = max(len(s) for s in sets.values())
        short = sum(1 for key, n in rows if n < len(sets[key]))
        if short * 2 <= len(rows):
            return
        folder = self.url.rsplit("/", 1)[0]
        with _lock:
            if folder in _warned:
                return
            _warned.add(folder)
        times = Counter(k for k, _ in rows)
        key = next(k for k, _ in rows if times[k] > 1)
        members = ", ".join(sorted(sets[key]))
        warnings.warn(
            f"{self.url}: {short} of its first {len(rows)} samples hold fewer members than "
            f"the {usual} their key has: the members of one key are not adjacent in the tar "
            f"(key {key!r}: {members} apart), so each run of them is read as a sample of "
            "its own, as webdataset reads it. A tar of a folder written in directory order "
            "does this (tar czf s.tar.gz -C dir .): write it sorted, tar --sort=name -czf "
            "s.tar.gz -C dir . (GNU tar), or with asyncstream pack. Other shards of this "
            "folder are not warned about.",
            MemberOrderWarning,
            stacklevel=2,
        )


def _members(records: Records, take: int) -> tuple[list[str], list[tuple[str, ...]]]:
    """The keys and member extensions of the first ``take`` records: in bulk from the
    native table, else (the Python walk's list of tuples, the reference) from each."""
    members = getattr(records, "members", None)
    if members is not None:
        found: tuple[list[str], list[tuple[str, ...]]] = members(take)
        return found
    head = [records[i] for i in range(take)]
    return [r[0] for r in head], [tuple(f[0] for f in r[2:]) for r in head]
