"""The fetch engine's settings: :class:`EngineConfig`, one frozen object that the
consumer builds and hands whole to the engine (pickled, in the :class:`~._protocol.Hello`
message, when the engine runs in its own process)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from .._config import AUTO_INFLIGHT_START
from ..stores._registry import registered_stores, store_settings
from ..stores._retry import RetryPolicy, Timeouts
from ..stores._s3 import S3Options

__all__ = ["EngineConfig"]


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """Settings of the fetch engine.

    Args:
        inflight: K, the most chunk downloads at once.
        auto: find the concurrency below ``inflight`` (``FetchConfig(inflight="auto")``):
            it starts at ``min(auto_start, inflight)`` and moves as
            :class:`~._policies.HillClimb` decides.
        auto_start: where ``auto`` starts (``asyncstream._config.auto_range`` of the
            GET size).
        retry: retries of one chunk.
        timeouts: time limits of one attempt.
        check_etag: compare the listed ETag with every response (``If-Match``).
        s3: how to reach the store.
        endpoints: more endpoints by name (a mixed stream's sources with options of their
            own): a :class:`~._store.ChunkRequest` with ``endpoint=name`` reads from the
            store of its URL's scheme made with that name's options.
        registry: the table of stores by scheme (:mod:`asyncstream.stores._registry`), as
            the caller's process has it when the settings are made.
        store_settings: the stores' own settings by scheme (``configure_store``), as the
            caller's process has them when the settings are made.
        seed: seeds the backoff jitter.
        adaptive: cut concurrency on throttling and grow it back (AIMD).
        hedge: send a second request for a chunk far slower than recent ones.
        hedge_factor: how many times the predicted time a chunk may take before its hedge.
        hedge_budget: the most hedges, as a fraction of the chunks started.
        transport: ``"auto"``: the S3 store's direct transport (kept-alive connections
            of its own, bodies received straight into the slot, HTTP and HTTPS) where no
            HTTP proxy is configured, botocore's aiohttp request otherwise; ``"aiohttp"``:
            always botocore's (see :mod:`asyncstream.stores._s3store`).
        cache_dir: a local folder that keeps the S3 chunks fetched, served from it
            afterwards (see :mod:`asyncstream.engine._cache`); None: no cache.
        cache_limit: the most bytes the cache folder's files may take; None: no limit.
        coalesce_bytes: the most bytes one GET fetches for consecutive chunks of one
            object waiting together (each still has its slot and is handed over as soon
            as it is whole); 0 fetches every chunk alone. Each request pays a round trip
            to the store, so small chunks in one request go faster: K requests in flight
            carry more bytes. A group takes at most its share of the free slots (free
            slots / downloads that may still start), so that all K connections stay busy.
            A group is not hedged, so chunks of half this or more (16 MiB, the stream's
            default) are always fetched alone.
        request_bytes: the most bytes one GET reads of a slot: a larger chunk is read by
            several GETs at once, each retried on its own (a failed attempt is taken up
            again with the parts not yet whole); None: one GET per chunk. The slot (the
            stream's block) is part of the order; the GET size is not.
    """

    inflight: int = 8
    auto: bool = False
    auto_start: int = AUTO_INFLIGHT_START
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    timeouts: Timeouts = field(default_factory=Timeouts)
    check_etag: bool = True
    s3: S3Options = field(default_factory=S3Options)
    endpoints: tuple[tuple[str, S3Options], ...] = ()
    registry: tuple[tuple[str, str], ...] = field(default_factory=registered_stores)
    store_settings: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = field(
        default_factory=store_settings,
        repr=False,  # tokens, connection strings
    )
    seed: int = 0
    adaptive: bool = True
    hedge: bool = True
    hedge_factor: float = 2.0
    hedge_budget: float = 0.05
    transport: Literal["auto", "aiohttp"] = "auto"
    cache_dir: str | None = None
    cache_limit: int | None = None
    coalesce_bytes: int = 8 << 20
    request_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.inflight < 1:
            raise ValueError(f"inflight must be >= 1, got {self.inflight}")
        if not self.hedge_factor >= 1.0:
            raise ValueError(f"hedge_factor must be >= 1, got {self.hedge_factor}")
        if not 0.0 <= self.hedge_budget <= 1.0:
            raise ValueError(f"hedge_budget must be in [0, 1], got {self.hedge_budget}")
        if self.coalesce_bytes < 0:
            raise ValueError(f"coalesce_bytes must be >= 0, got {self.coalesce_bytes}")
        if self.request_bytes is not None and self.request_bytes < 1:
            raise ValueError(f"request_bytes must be >= 1, got {self.request_bytes}")
        if self.transport not in ("auto", "aiohttp"):
            raise ValueError(f"transport must be 'auto' or 'aiohttp', got {self.transport!r}")
        if self.cache_limit is not None and (self.cache_dir is None or self.cache_limit < 1):
            raise ValueError(
                f"cache_limit must be >= 1 and needs a cache_dir, got {self.cache_limit!r} "
                f"with cache_dir={self.cache_dir!r}"
            )

    @property
    def inflight_start(self) -> int:
        """The downloads allowed at the start: ``inflight``, or under ``auto``
        ``auto_start`` at most."""
        return min(self.auto_start, self.inflight) if self.auto else self.inflight

    @property
    def wait_timeout(self) -> float:
        """The longest a consumer waits for the next chunk before declaring the engine stuck."""
        return self.retry.deadline + self.timeouts.chunk + 30.0
