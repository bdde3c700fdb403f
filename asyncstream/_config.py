"""Configuration objects: a stream's settings, grouped by concern.

As httpx's ``Timeout`` / ``Limits``: small frozen, keyword-only objects with a readable
``repr``, passed whole across a seam and never copied by reflection.

* :class:`OrderConfig`: what decides the sample order (seed, shuffle, window, mode,
  remainder, topology), and so what a saved checkpoint must share with the stream that
  loads it;
* :class:`FetchConfig`: how chunks are fetched (inflight, prefetch, chunk size,
  coalescing, retries, timeouts, adaptive concurrency, hedging, transport, ETag checks):
  speed and memory only, never the order, so a checkpoint resumes under any of them;
* :class:`CacheConfig`: the local chunk cache;
* :class:`IndexConfig`: where sample counts come from.

``ShardStream``'s flat keyword arguments (``seed=``, ``inflight=``, ...) map onto these
through one table, :data:`FLAT`; :func:`group` applies it.

Its own layer, below the engine and above the stores (it holds their
:class:`~asyncstream.RetryPolicy` and :class:`~asyncstream.Timeouts`), so that the engine,
the dataset and the stream all stand on it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

from .stores._retry import RetryPolicy, Timeouts

__all__ = [
    "AUTO_INFLIGHT_MAX",
    "AUTO_INFLIGHT_START",
    "AUTO_START_BYTES",
    "FLAT",
    "RING_BUDGET_BYTES",
    "CacheConfig",
    "Configs",
    "FetchConfig",
    "FlatSettings",
    "IndexConfig",
    "OrderConfig",
    "auto_range",
    "group",
    "hedge_reserve",
]


AUTO_INFLIGHT_START = 8
"""Where ``inflight="auto"`` starts at the least (GETs of 4 MiB and more; see
:func:`auto_range`)."""

AUTO_START_BYTES = 32 << 20
"""The bytes in flight ``inflight="auto"`` starts with: 32 GETs of 1 MiB (the fixed
default K at the default block), 8 of 4 MiB (see :func:`auto_range`)."""

RING_BUDGET_BYTES = 128 << 20
"""What a reader's ring holds at most under the default ``prefetch`` (issue 30 item 2: a
node's memory). The window's lanes take one block each; the prefetch the rest, up to
``2 * inflight`` blocks."""

AUTO_INFLIGHT_MAX = 64
"""The most downloads ``inflight="auto"`` ever lets run (GETs of 512 KiB and less; see
:func:`auto_range`)."""


def auto_range(get_bytes: int) -> tuple[int, int]:
    """Where ``inflight="auto"`` starts, and the most it lets run, for GETs of
    ``get_bytes``: it starts with :data:`AUTO_START_BYTES` in flight (within
    :data:`AUTO_INFLIGHT_START` and half :data:`AUTO_INFLIGHT_MAX` downloads) and may
    double that.

    In bytes, because what a link needs in flight is its rate times its time to the first
    byte, whatever the GET's size: 1 MiB GETs start at 32 (the fixed default) and may
    reach 64, GETs of 4 MiB and more start at 8 and may reach 16 (the range the tuner was
    first measured with, in ``bench/RESULTS.md``).
    """
    start = AUTO_START_BYTES // max(1, get_bytes)
    start = max(AUTO_INFLIGHT_START, min(AUTO_INFLIGHT_MAX // 2, start))
    return start, 2 * start


def hedge_reserve(hedge: bool) -> int:
    """Ring slots the fetch engine keeps back for hedged requests: 1 with hedging, else 0.

    The one rule, read both where the ring is sized (:attr:`FetchConfig.hedge_slots`) and
    where the engine holds the slots back (``engine._policies.Hedging.reserve``): the
    head-of-line chunk is the one worth hedging, and by the time it is late the chunks
    behind it fill every other slot.
    """
    return 1 if hedge else 0


def _positive(owner: str, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{owner}.{name} must be an integer >= 1, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class OrderConfig:
    """What decides the sample order, and so what a checkpoint must share.

    Args:
        seed: the run's seed.
        shuffle: ``False`` reads shards in order and samples in shard order.
        window: shards open at once for the window shuffle.
        mode: pick the next sample uniformly over resident samples (``"samples"``) or
            over open shards (``"shards"``).
        block_bytes: the bytes of its shard each open lane holds and draws from at a time
            (a ring slot; capped at the largest shard): the window shuffle's unit, so part
            of the order. ``None``: the block a loaded checkpoint was saved with, else
            ``FetchConfig.chunk_bytes``. Memory is ``(window + prefetch + 1)`` blocks.
        remainder: when the total does not divide by the world size: ``"drop"`` the last
            few samples of the epoch, or ``"pad"`` by repeating the first few.
        rank: this process's rank; default torch.distributed, else ``RANK``, else 0.
        world_size: number of ranks; default torch.distributed, else ``WORLD_SIZE``,
            else 1.

    Raises:
        ValueError: a window below 1, or an unknown mode or remainder policy.
    """

    seed: int = 0
    shuffle: bool = True
    window: int = 64
    mode: Literal["samples", "shards"] = "shards"
    block_bytes: int | None = None
    remainder: Literal["drop", "pad"] = "drop"
    rank: int | None = None
    world_size: int | None = None

    def __post_init__(self) -> None:
        _positive("OrderConfig", "window", self.window)
        if self.block_bytes is not None:
            _positive("OrderConfig", "block_bytes", self.block_bytes)
        if self.mode not in ("samples", "shards"):
            raise ValueError(f"OrderConfig.mode must be 'samples' or 'shards', got {self.mode!r}")
        if self.remainder not in ("drop", "pad"):
            raise ValueError(
                f"OrderConfig.remainder must be 'drop' or 'pad', got {self.remainder!r}"
            )


@dataclass(frozen=True, kw_only=True)
class FetchConfig:
    """How chunks are fetched: speed and memory, never the order.

    Args:
        inflight: K, chunk downloads in flight at most (fewer while throttled); or
            ``"auto"`` (the default): the engine finds K itself, from where it starts to
            twice that (:meth:`inflight_range`): 32 MiB in flight to start with, i.e. 32
            GETs of 1 MiB (the default block) rising to at most 64, 8 GETs of 4 MiB or
            more rising to 16 (:func:`auto_range`), and never more than the ring's
            prefetch slots. While the downloads are what the stream waits for (chunks
            are wanted, the ring has free slots, and every download allowed is running)
            it tries its ceiling; it keeps a step that raised the bytes per second by an
            eighth of its size (12.5% for a doubling) and 5% at least, takes back one
            that did not and tries half the step later (less often after each try that
            failed), and settles. Throttling (``503 SlowDown``) halves it as
            ``adaptive`` does, and it settles at the halved value. Over an S3-like link
            it reads 1.4x a fixed K = 32 (``bench/RESULTS.md``, issue 31 item 4). Never
            part of the order: a checkpoint taken under ``"auto"`` resumes under a fixed
            K and the reverse.
        prefetch: chunks requested ahead of need; unset, ``2 * inflight`` (under
            ``"auto"``, twice its ceiling), within a ring of 128 MiB
            (:data:`RING_BUDGET_BYTES`: at most what the window's lanes and the hedge
            slot leave of it, and at least enough blocks for the GETs of the start; see
            ``StreamSettings.prefetch_slots``). ``"auto"`` (the default under
            ``inflight="auto"``): the same slots, of which the stream asks ahead for
            twice the engine's concurrency of the moment: memory stays bounded by the
            ring (the slots beyond the budget of the moment are never touched, so never
            resident) and a fixed ``prefetch`` bounds it further.
        chunk_bytes: the most bytes one ranged GET reads: a block
            (``OrderConfig.block_bytes``) larger than this is read by several GETs at
            once, each retried on its own; also the block size where the order does not
            set one (capped at the largest shard: :meth:`chunk_for`). Never part of a
            checkpoint: a state saved under one chunk size resumes under any other.
        coalesce_bytes: the most bytes one GET fetches for consecutive chunks of one
            object (on local files, one ``preadv``); 0 fetches every chunk alone.
        retry: the chunk download retry policy.
        timeouts: the chunk download timeouts.
        adaptive: halve the downloads in flight on throttling and grow them back.
        hedge: send a second request for a chunk far slower than recent ones.
        hedge_factor: how many times the predicted time a chunk may take before its
            hedge (>= 1).
        hedge_budget: the most hedges, as a fraction of the chunks started (0 to 1).
        transport: ``"auto"`` (the S3 store's direct transport where no HTTP proxy is
            configured) or ``"aiohttp"`` (always botocore's).
        check_etag: require every chunk to come from the object version that was listed.
        max_sample_bytes: the most bytes one sample may hold (all its members; a sparse
            member by the size it expands to, a compressed shard's by the bytes it
            decompresses to); a larger one is a ``CorruptTarError`` naming the shard and
            the member, met before it is held. ``None``: the block (a ring slot), at
            least 16 MiB.
        on_truncated: a shard without its end-of-archive marker (cut short): ``"error"``
            (a ``CorruptTarError``), or ``"warn"`` (a ``TruncatedShardWarning``, and its
            last, possibly partial, sample dropped).

    Raises:
        ValueError: a count below 1, a negative ``coalesce_bytes``, a hedge factor below
            1, a budget outside [0, 1], an unknown transport or ``on_truncated``.
    """

    inflight: int | Literal["auto"] = "auto"
    prefetch: int | Literal["auto"] | None = None
    chunk_bytes: int = 1 << 20
    coalesce_bytes: int = 8 << 20
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    timeouts: Timeouts = field(default_factory=Timeouts)
    adaptive: bool = True
    hedge: bool = True
    hedge_factor: float = 2.0
    hedge_budget: float = 0.05
    transport: Literal["auto", "aiohttp"] = "auto"
    check_etag: bool = True
    max_sample_bytes: int | None = None
    on_truncated: Literal["error", "warn"] = "error"

    def __post_init__(self) -> None:
        for name in ("inflight", "prefetch"):
            value = getattr(self, name)
            if value == "auto" or (name == "prefetch" and value is None):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"FetchConfig.{name} must be an integer >= 1 or 'auto', got {value!r}"
                )
        if self.max_sample_bytes is not None:
            _positive("FetchConfig", "max_sample_bytes", self.max_sample_bytes)
        if self.on_truncated not in ("error", "warn"):
            raise ValueError(
                f"FetchConfig.on_truncated must be 'error' or 'warn', got {self.on_truncated!r}"
            )
        _positive("FetchConfig", "chunk_bytes", self.chunk_bytes)
        c = self.coalesce_bytes
        if isinstance(c, bool) or not isinstance(c, int) or c < 0:
            raise ValueError(f"FetchConfig.coalesce_bytes must be an integer >= 0, got {c!r}")
        if not self.hedge_factor >= 1.0:
            raise ValueError(f"FetchConfig.hedge_factor must be >= 1, got {self.hedge_factor}")
        if not 0.0 <= self.hedge_budget <= 1.0:
            raise ValueError(f"FetchConfig.hedge_budget must be in [0, 1], got {self.hedge_budget}")
        if self.transport not in ("auto", "aiohttp"):
            raise ValueError(
                f"FetchConfig.transport must be 'auto' or 'aiohttp', got {self.transport!r}"
            )

    @property
    def auto_inflight(self) -> bool:
        """Whether the engine finds the concurrency itself (``inflight="auto"``)."""
        return self.inflight == "auto"

    @property
    def auto_prefetch(self) -> bool:
        """Whether the chunks requested ahead follow the engine's concurrency:
        ``prefetch="auto"``, or no ``prefetch`` under ``inflight="auto"``."""
        return self.prefetch == "auto" or (self.prefetch is None and self.auto_inflight)

    def inflight_range(self, get_bytes: int | None = None) -> tuple[int, int]:
        """The downloads allowed at the start and at most: ``(inflight, inflight)``, or
        under ``"auto"`` :func:`auto_range` of the GET size (``get_bytes``, by default
        ``chunk_bytes``: a block smaller than that is read by GETs of the block)."""
        if self.inflight == "auto":
            return auto_range(self.chunk_bytes if get_bytes is None else get_bytes)
        return self.inflight, self.inflight

    @property
    def inflight_max(self) -> int:
        """The most downloads at once: ``inflight``, or under ``"auto"`` twice where it
        starts (64 for 1 MiB GETs; :func:`auto_range`)."""
        return self.inflight_range()[1]

    @property
    def inflight_start(self) -> int:
        """The downloads allowed at the start: ``inflight``, or under ``"auto"``
        :func:`auto_range` of ``chunk_bytes`` (32 for 1 MiB GETs)."""
        return self.inflight_range()[0]

    @property
    def prefetch_chunks(self) -> int:
        """``prefetch``, or twice :attr:`inflight_max`: the chunks a ring with no budget
        would take ahead. A stream's own are ``StreamSettings.prefetch_slots``, within
        the ring's 128 MiB budget; the library itself no longer reads this (public, kept
        for callers)."""
        if self.prefetch is None or self.prefetch == "auto":
            return 2 * self.inflight_max
        return self.prefetch

    @property
    def hedge_slots(self) -> int:
        """Ring slots the engine keeps back for hedges (:func:`hedge_reserve`)."""
        return hedge_reserve(self.hedge)

    def chunk_for(self, largest: int) -> int:
        """The chunk size used for shards of at most ``largest`` bytes: ``chunk_bytes``,
        capped at ``largest`` (a chunk never holds more than one shard)."""
        return max(1, min(self.chunk_bytes, largest))


@dataclass(frozen=True, kw_only=True)
class CacheConfig:
    """The local chunk cache (see the README's cache section).

    Args:
        path: a local folder (created ``0o700`` if missing) that keeps every chunk
            fetched from object storage; ``True``: the per-user default,
            ``$ASYNCSTREAM_CACHE_DIR/chunks``, else ``$XDG_CACHE_HOME/asyncstream/chunks``,
            else ``~/.cache/asyncstream/chunks``; None: no cache. A folder owned by
            another user, or writable by group or others, is refused (``ValueError``).
        limit: the most bytes the folder may hold (least recently used chunks are
            evicted); None: no limit.
    """

    path: str | os.PathLike[str] | bool | None = None
    limit: int | None = None


@dataclass(frozen=True, kw_only=True)
class IndexConfig:
    """Where the sample counts come from.

    Args:
        samples_per_shard: samples in each shard (one number or a list); given, no index
            is read.
        split: the split to read, for an index with splits.
        strict: a shard under the prefix that the index does not list is a ``DataError``
            rather than a warning.
        cache: the local index cache of counted shards: None for the default folder,
            ``False`` for none, or a folder.
        trust_index_urls: what a remote index given as the dataset URL may name beyond
            the origins of the URLs given (its own server or bucket, and theirs):
            ``False`` nothing; ``True`` any remote URL; or a list of URL prefixes
            (``["https://cdn.example.com/data/", "s3://other-bucket/"]``; only a
            ``file://`` prefix admits local files). Web origins admitted get none of the
            credentials or headers configured for their scheme.
    """

    samples_per_shard: int | Sequence[int] | None = None
    split: str | None = None
    strict: bool = False
    cache: str | os.PathLike[str] | bool | None = None
    trust_index_urls: bool | Sequence[str] = False

    def __post_init__(self) -> None:
        trust = self.trust_index_urls
        if isinstance(trust, bool):
            return
        if isinstance(trust, str) or not isinstance(trust, Sequence):
            raise TypeError(
                "trust_index_urls must be True, False or a list of URL prefixes "
                f"(['https://cdn.example.com/data/']), got {trust!r}"
            )
        object.__setattr__(self, "trust_index_urls", tuple(trust))


Group = Literal["order", "fetch", "cache", "index"]

FLAT: Mapping[str, tuple[Group, str]] = {
    # ShardStream's flat keyword argument -> (config group, field): the one table.
    "seed": ("order", "seed"),
    "shuffle": ("order", "shuffle"),
    "window": ("order", "window"),
    "shuffle_mode": ("order", "mode"),
    "block_bytes": ("order", "block_bytes"),
    "remainder": ("order", "remainder"),
    "rank": ("order", "rank"),
    "world_size": ("order", "world_size"),
    "inflight": ("fetch", "inflight"),
    "prefetch": ("fetch", "prefetch"),
    "chunk_bytes": ("fetch", "chunk_bytes"),
    "retry": ("fetch", "retry"),
    "timeouts": ("fetch", "timeouts"),
    "check_etag": ("fetch", "check_etag"),
    "adaptive": ("fetch", "adaptive"),
    "hedge": ("fetch", "hedge"),
    "max_sample_bytes": ("fetch", "max_sample_bytes"),
    "on_truncated": ("fetch", "on_truncated"),
    "cache_dir": ("cache", "path"),
    "cache_limit": ("cache", "limit"),
    "samples_per_shard": ("index", "samples_per_shard"),
    "split": ("index", "split"),
    "strict": ("index", "strict"),
    "index_cache": ("index", "cache"),
    "trust_index_urls": ("index", "trust_index_urls"),
}

_CLASSES: dict[Group, type[Any]] = {
    "order": OrderConfig,
    "fetch": FetchConfig,
    "cache": CacheConfig,
    "index": IndexConfig,
}


@dataclass(frozen=True)
class Configs:
    """The four groups of one stream."""

    order: OrderConfig
    fetch: FetchConfig
    cache: CacheConfig
    index: IndexConfig


def group(
    flat: Mapping[str, Any],
    *,
    order: OrderConfig | None = None,
    fetch: FetchConfig | None = None,
    cache: CacheConfig | None = None,
    index: IndexConfig | None = None,
) -> Configs:
    """The config objects of flat keyword arguments and the groups given whole.

    Raises:
        TypeError: an unknown keyword argument, a group of the wrong type, or a flat
            argument given with the group that holds it (naming both).
        ValueError: a value the group refuses.
    """
    given: dict[Group, Any] = {"order": order, "fetch": fetch, "cache": cache, "index": index}
    for name, value in given.items():
        cls = _CLASSES[name]
        if value is not None and not isinstance(value, cls):
            raise TypeError(f"{name}= must be an asyncstream.{cls.__name__}, got {value!r}")
    changes: dict[Group, dict[str, Any]] = {name: {} for name in _CLASSES}
    for key, value in flat.items():
        if key not in FLAT:
            raise TypeError(f"ShardStream() got an unexpected keyword argument {key!r}")
        name, attr = FLAT[key]
        if given[name] is not None:
            owner = _CLASSES[name].__name__
            raise TypeError(
                f"{key}= and {name}= were both given: {key} is {owner}.{attr}; give it "
                f"inside {name}={owner}({attr}=...) or drop {name}="
            )
        if value is None and key in ("retry", "timeouts"):
            continue  # None was their default: the group's own
        changes[name][attr] = value
    made: dict[str, Any] = {}
    for name, cls in _CLASSES.items():
        if given[name] is not None:
            made[name] = given[name]
            continue
        try:
            made[name] = cls(**changes[name])
        except ValueError as exc:  # say it by the flat name it was given as
            message = str(exc)
            for key, (g, attr) in FLAT.items():
                if g == name and key in flat and key != attr:
                    message = message.replace(f"{cls.__name__}.{attr} ", f"{key} ")
            raise ValueError(message) from None
    return Configs(**made)


class FlatSettings(TypedDict, total=False):
    """``ShardStream``'s flat keyword arguments (typed), each one field of a group as
    :data:`FLAT` maps it."""

    seed: int
    shuffle: bool
    window: int
    shuffle_mode: Literal["samples", "shards"]
    block_bytes: int | None
    remainder: Literal["drop", "pad"]
    rank: int | None
    world_size: int | None
    inflight: int | Literal["auto"]
    prefetch: int | Literal["auto"] | None
    chunk_bytes: int
    retry: RetryPolicy | None
    timeouts: Timeouts | None
    check_etag: bool
    adaptive: bool
    hedge: bool
    max_sample_bytes: int | None
    on_truncated: Literal["error", "warn"]
    cache_dir: str | os.PathLike[str] | bool | None
    cache_limit: int | None
    samples_per_shard: int | Sequence[int] | None
    split: str | None
    strict: bool
    index_cache: str | os.PathLike[str] | bool | None
    trust_index_urls: bool | Sequence[str]
