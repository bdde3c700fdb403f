"""Opening a stream: its arguments mapped onto its settings, and its dataset opened.

What :class:`~._stream.ShardStream`'s constructor does before it can read: the config
objects (:mod:`asyncstream._config`, one table from the flat keyword arguments), the S3
options, the topology, and what it reads: plain shard URLs are a stream of one source
(:func:`~asyncstream.dataset._sources.open_plain`), opened on the same path as a mixed
stream's sources (:func:`~asyncstream.dataset._sources.open_sources`), as one
:class:`~._settings.StreamSettings`.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from .._config import Configs
from ..dataset._progress import Progress
from ..dataset._sources import Source, open_plain, open_sources, split_sources
from ..engine._cache import cache_options
from ..engine._launch import EngineProcess, store_modules
from ..order._plan import Topology
from ..stores._s3 import S3Options
from ._run import default_topology
from ._settings import StreamSettings

__all__ = ["Opened", "open_settings", "start_engine_process"]


@dataclass(frozen=True)
class Opened:
    """A stream's settings, which index gave its counts, and its rank and world size."""

    settings: StreamSettings
    index: dict[str, Any]
    rank: int
    world_size: int


def open_settings(
    urls: str | Sequence[str] | Source | Sequence[Source],
    *,
    epoch_size: int | None,
    endpoint_url: str | None,
    s3: S3Options | None,
    configs: Configs,
    progress: Progress = None,
) -> Opened:
    """Open what a stream reads (see :class:`~._stream.ShardStream` for the arguments and
    what it raises)."""
    order, fetch, index = configs.order, configs.fetch, configs.index
    cache_path, cache_limit = cache_options(configs.cache.path, configs.cache.limit)
    options = s3 or S3Options()
    if endpoint_url is not None:
        options = replace(options, endpoint_url=endpoint_url)
    options = options.resolve()
    rank, world_size = default_topology(order.rank, order.world_size)
    Topology(rank, world_size)  # validates
    settings = StreamSettings(
        shards=(),
        counts=(),
        order=order,
        fetch=fetch,
        s3=options,
        cache_dir=cache_path,
        cache_limit=cache_limit,
    )
    samples_per_shard, split = index.samples_per_shard, index.split
    strict, index_cache = index.strict, index.cache
    shuffle, window = order.shuffle, order.window
    sources, plain = split_sources(urls)
    if sources is None:
        if epoch_size is not None:
            raise ValueError(
                "epoch_size sets the samples per epoch of a stream of sources: give "
                "ShardStream a list of asyncstream.Source"
            )
        opened = open_plain(
            plain,
            options,
            samples_per_shard=samples_per_shard,
            split=split,
            counting=settings.counting(),  # counted as an epoch reads
            strict=strict,
            index_cache=index_cache,
            trust_index_urls=index.trust_index_urls,
            progress=progress,
        )
        index_info: dict[str, Any] = opened.infos[""].as_dict()
    else:
        if samples_per_shard is not None or split is not None:
            raise ValueError(
                "with sources, give samples_per_shard and split to each Source, not the stream"
            )
        if shuffle and window < len(sources):
            raise ValueError(
                f"window={window} is less than the {len(sources)} sources: every source "
                "needs an open shard in the window to be drawn"
            )
        opened = open_sources(
            sources,
            options,
            epoch_size=epoch_size,
            counting=settings.counting(),
            strict=strict,
            index_cache=index_cache,
            trust_index_urls=index.trust_index_urls,
            progress=progress,
        )
        index_info = {name: info.as_dict() for name, info in opened.infos.items()}
    settings = replace(
        settings,
        shards=opened.shards,
        counts=opened.counts,
        sources=opened.plans,
        endpoints=opened.endpoints,
        withhold=opened.withheld,  # travels with the stream, to every reader's engine
    )
    return Opened(settings, index_info, rank, world_size)


def start_engine_process(
    urls: str | Sequence[str] | Source | Sequence[Source],
) -> EngineProcess | None:
    """The fetch engine's process, started before the dataset is opened so that its start
    overlaps the open (:mod:`asyncstream.engine._launch`); it imports the stores of the
    URLs' schemes (one URL per source names it) meanwhile. ``None`` where the engine will
    run in a thread: a daemonic process (a DataLoader worker) may not start children.
    """
    if multiprocessing.current_process().daemon:
        return None
    try:
        sources, plain = split_sources(urls)
        given = [s.urls for s in sources] if sources is not None else [plain]
        firsts = [u if isinstance(u, str) else next(iter(u), "") for u in given]
    except Exception:  # bad arguments are the open's to report
        firsts = []
    return EngineProcess(store_modules(u for u in firsts if isinstance(u, str)))
