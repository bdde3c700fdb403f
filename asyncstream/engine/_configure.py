"""The one place a :class:`~asyncstream.FetchConfig` becomes the engine's
:class:`~._engine.EngineConfig`: every setting by name, checked by the type checker, so a
renamed field fails there and not at run time."""

from __future__ import annotations

from .._config import FetchConfig
from ..stores._registry import store_settings
from ..stores._s3 import S3Options
from ._engine import EngineConfig

__all__ = ["engine_config"]


def engine_config(
    fetch: FetchConfig,
    *,
    s3: S3Options,
    endpoints: tuple[tuple[str, S3Options], ...] = (),
    cache_dir: str | None = None,
    cache_limit: int | None = None,
    seed: int = 0,
    request_bytes: int | None = None,
    withhold: frozenset[str] = frozenset(),
    inflight: int | None = None,
    auto_start: int | None = None,
) -> EngineConfig:
    """The engine's settings for a stream (or a count) fetching with ``fetch``.

    Args:
        fetch: how to fetch.
        s3: how to reach the store.
        endpoints: more endpoints by name (a mixed stream's sources with options of their
            own).
        cache_dir: the chunk cache's folder, already validated (None: no cache).
        cache_limit: its size limit.
        seed: seeds the backoff jitter.
        request_bytes: the most bytes one GET reads of a slot (None: a slot per GET).
        withhold: web origins (``scheme://host:port``) sent none of the configured
            credentials: those only a remote index named (the opened dataset's, carried
            here as data, so a DataLoader worker of any start method withholds them too).
        inflight: the most downloads at once, where the ring allows fewer than
            ``fetch.inflight_max`` (None: that).
        auto_start: where ``inflight="auto"`` starts, for the stream's GET size (None:
            ``fetch.inflight_start``, for GETs of ``chunk_bytes``).
    """
    return EngineConfig(
        inflight=inflight if inflight is not None else fetch.inflight_max,
        auto=fetch.auto_inflight,
        auto_start=auto_start if auto_start is not None else fetch.inflight_start,
        retry=fetch.retry,
        timeouts=fetch.timeouts,
        check_etag=fetch.check_etag,
        s3=s3,
        endpoints=endpoints,
        seed=seed,
        adaptive=fetch.adaptive,
        hedge=fetch.hedge,
        hedge_factor=fetch.hedge_factor,
        hedge_budget=fetch.hedge_budget,
        transport=fetch.transport,
        cache_dir=cache_dir,
        cache_limit=cache_limit,
        coalesce_bytes=fetch.coalesce_bytes,
        request_bytes=request_bytes,
        store_settings=store_settings(withhold),
    )
