"""What a shard may make its reader hold, and what a cut shard is: the reader's policy.

A shard is remote data: its headers say how large a member is, how large a sparse member
expands, and whether the archive is whole. :class:`ReadLimits` is what the readers
(:class:`~._tar.ShardReader`, :class:`~._compressed.CompressedReader`) are told to trust:

* ``max_sample_bytes``: the most bytes one sample (all its members; a sparse member by the
  size it expands to) may hold. A member declared larger is refused at its header, before a
  byte of it is kept or decompressed; a sample whose members add up to more, as soon as
  they do. Either is a :class:`~asyncstream.CorruptTarError` naming the shard, the member
  or sample and the limit. The stream's default is its block (a ring slot: what a lane
  holds at a time), at least :data:`DEFAULT_MAX_SAMPLE_BYTES`.
* ``on_truncated``: a shard that ends without its end-of-archive marker (two zero blocks,
  which every tar writer writes) was cut short, and its last sample may lack members.
  ``"error"`` (the default) raises a :class:`~asyncstream.CorruptTarError` naming the shard
  and the byte it ends at; ``"warn"`` issues a :class:`~asyncstream.TruncatedShardWarning`
  and drops the last, possibly partial, sample. The last sample of a shard is only handed
  out once the marker (or, with ``"warn"``, the end) is reached.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["DEFAULT_MAX_SAMPLE_BYTES", "ReadLimits", "sample_limit"]

DEFAULT_MAX_SAMPLE_BYTES = 16 << 20  # samples a 1 MiB block carries across its edges


def sample_limit(max_sample_bytes: int | None, block: int) -> int:
    """The sample limit in force: ``max_sample_bytes`` if given, else the ring's block
    (``block``), at least :data:`DEFAULT_MAX_SAMPLE_BYTES` (a small block, as tests and
    small shards use, still reads samples of a few megabytes)."""
    if max_sample_bytes is not None:
        return max_sample_bytes
    return max(block, DEFAULT_MAX_SAMPLE_BYTES)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadLimits:
    """What a shard's reader may hold and how it treats a cut shard (see the module).

    Args:
        max_sample_bytes: the most bytes one sample may hold (>= 1).
        on_truncated: ``"error"`` or ``"warn"`` for a shard without its end marker.

    Raises:
        ValueError: a limit below 1 or an unknown ``on_truncated``.
    """

    max_sample_bytes: int = DEFAULT_MAX_SAMPLE_BYTES
    on_truncated: Literal["error", "warn"] = "error"

    def __post_init__(self) -> None:
        m = self.max_sample_bytes
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"max_sample_bytes must be an integer >= 1, got {m!r}")
        if self.on_truncated not in ("error", "warn"):
            raise ValueError(f"on_truncated must be 'error' or 'warn', got {self.on_truncated!r}")
