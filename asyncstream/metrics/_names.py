"""The one table of exported metrics: each figure of ``stats()``, its Prometheus family.

:func:`readings` turns one ``stats()`` dict (a :class:`~asyncstream.ShardStream`'s, a
:class:`~asyncstream.MappedStream`'s or a ``DALIImageLoader``'s) into :class:`Reading`
records: a family of :data:`FAMILIES`, its labels and the value as ``stats()`` gave it.
Names follow Prometheus's conventions (``asyncstream_`` prefix, base units, ``_bytes``
and ``_seconds`` suffixes; a counter's family name is exposed with ``_total``), and are
the OpenTelemetry instruments' names too. A new metric is one row of :data:`FAMILIES`
and one line in :func:`readings`.

Counters come in three scopes, which :class:`~._tally.Tally` turns into totals that
only grow: ``engine`` (the fetch engine's counters, since the engine started; an engine
replaced starts again at 0), ``epoch`` (the reader's figures of the current epoch) and
``total`` (a DALI loader's, since the loader was made). Gauges are values now.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["FAMILIES", "Family", "ReaderReading", "Reading", "readings"]

Kind = Literal["counter", "gauge"]
Scope = Literal["engine", "epoch", "total", "gauge"]


@dataclass(frozen=True, slots=True)
class Family:
    """One exported metric: its name (a counter's without ``_total``), kind, help text,
    OpenTelemetry unit and the labels beyond the reader's (``rank``, ``worker``)."""

    name: str
    kind: Kind
    help: str
    unit: str = "1"
    labels: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Reading:
    """One value of one family: ``labels`` are the extra labels' values, in the family's
    order; ``scope`` says how a counter's value grows (see the module docstring)."""

    family: str
    labels: tuple[str, ...]
    value: float
    scope: Scope


@dataclass(frozen=True, slots=True)
class ReaderReading:
    """One reader's readings: ``reader`` is ``""`` for the source's own figures, else a
    DataLoader worker's number; ``era`` names the iteration the epoch's figures belong to
    (``(iteration, epoch)`` as the figures give them)."""

    reader: str
    era: Hashable
    items: list[Reading]


_P = "asyncstream_"

_ROWS: list[Family] = [
    # The reader (the stream in this process, or in one DataLoader worker).
    Family(_P + "samples", "counter", "Samples handed out by the reader."),
    Family(_P + "epoch", "gauge", "The epoch the reader reads (or read last)."),
    Family(_P + "open_shards", "gauge", "Shards open in the shuffle window (one chunk each)."),
    Family(_P + "shuffle_radius_samples", "gauge", "Samples resident in the shuffle window."),
    Family(_P + "ring_slots", "gauge", "Slots of the reader's shared-memory ring."),
    Family(_P + "ring_slots_used", "gauge", "Ring slots held: open shards' and prefetched."),
    Family(
        _P + "tar_general_members",
        "counter",
        "Tar members read by the general parser rather than the native walk.",
    ),
    # The training loop's wait (the stall meter).
    Family(_P + "stall_waited_seconds", "counter", "The loop's time waiting in next().", "s"),
    Family(_P + "stall_worked_seconds", "counter", "The loop's time between next() calls.", "s"),
    Family(_P + "stall_calls", "counter", "next() calls timed by the stall meter."),
    Family(
        _P + "stall_share",
        "gauge",
        "Share of the loop's time spent waiting for data, over the recent calls.",
    ),
    # The fetch engine.
    Family(_P + "fetch_bytes", "counter", "Bytes of chunks fetched and handed over.", "By"),
    Family(_P + "fetch_chunks", "counter", "Chunks fetched and handed over."),
    Family(_P + "fetch_shards", "counter", "Shards whose last chunk was handed over."),
    Family(_P + "fetch_requests", "counter", "Reads started at the store (GETs; cache hits too)."),
    Family(_P + "fetch_part_reads", "counter", "GETs of parts of chunks larger than one GET."),
    Family(_P + "fetch_coalesced_chunks", "counter", "Chunks that rode on another chunk's GET."),
    Family(_P + "fetch_retries", "counter", "Retried reads, by cause.", labels=("cause",)),
    Family(_P + "fetch_failed_chunks", "counter", "Chunks that failed after their retries."),
    Family(_P + "fetch_hedges", "counter", "Hedged requests sent for slow chunks."),
    Family(_P + "fetch_hedge_wins", "counter", "Hedged requests that finished first."),
    Family(_P + "fetch_throttle_cuts", "counter", "Times the adaptive limit was halved."),
    Family(_P + "fetch_inflight", "gauge", "Downloads in flight now."),
    Family(_P + "fetch_concurrency_limit", "gauge", "The adaptive concurrency limit now."),
    Family(
        _P + "fetch_first_byte_seconds",
        "gauge",
        "Time to first byte of recent downloads, by quantile.",
        "s",
        ("quantile",),
    ),
    Family(
        _P + "fetch_chunk_seconds",
        "gauge",
        "Whole time of recent chunk downloads, by quantile.",
        "s",
        ("quantile",),
    ),
    Family(_P + "reader_starved_seconds", "counter", "The reader's wait for chunks.", "s"),
    Family(_P + "engine_cpu_seconds", "counter", "CPU time of the fetch engine's process.", "s"),
    Family(_P + "engine_max_rss_bytes", "gauge", "Peak RSS of the fetch engine's process.", "By"),
    # Each store the engine opened (scheme, or scheme:endpoint name).
    Family(
        _P + "store_connections_opened",
        "counter",
        "Connections opened to the store.",
        labels=("store",),
    ),
    Family(
        _P + "store_connections_reused",
        "counter",
        "Requests that reused an open connection.",
        labels=("store",),
    ),
    Family(_P + "cache_hits", "counter", "Chunk reads served by the cache.", labels=("store",)),
    Family(_P + "cache_misses", "counter", "Chunk reads the cache sent on.", labels=("store",)),
    Family(
        _P + "cache_read_bytes", "counter", "Bytes read from the cache.", "By", labels=("store",)
    ),
    Family(_P + "cache_evictions", "counter", "Cache files evicted.", labels=("store",)),
    Family(_P + "cache_write_failures", "counter", "Cache writes that failed.", labels=("store",)),
    # A DALIImageLoader (its counters since it was made).
    Family(_P + "loader_batches", "counter", "Batches handed out by the loader."),
    Family(_P + "loader_images", "counter", "Images handed out by the loader."),
    Family(_P + "loader_skipped_images", "counter", "Images skipped (on_error='skip')."),
    Family(
        _P + "loader_stage_seconds",
        "counter",
        "Time of each loader stage: decode_wait (the loop waiting for DALI), feed_wait "
        "(DALI waiting for the producer), feed (building batches), probe.",
        "s",
        ("stage",),
    ),
]

FAMILIES: dict[str, Family] = {family.name: family for family in _ROWS}
"""Every exported family, by name."""

_QUANTILES = (("p50", "0.5"), ("p95", "0.95"), ("p99", "0.99"))

_FETCH_COUNTERS = (
    ("bytes", "fetch_bytes"),
    ("chunks", "fetch_chunks"),
    ("shards", "fetch_shards"),
    ("requests", "fetch_requests"),
    ("part_reads", "fetch_part_reads"),
    ("coalesced_chunks", "fetch_coalesced_chunks"),
    ("failed_chunks", "fetch_failed_chunks"),
    ("hedged", "fetch_hedges"),
    ("hedge_wins", "fetch_hedge_wins"),
    ("throttle_cuts", "fetch_throttle_cuts"),
    ("starved_s", "reader_starved_seconds"),
    ("cpu_s", "engine_cpu_seconds"),
)
_FETCH_GAUGES = (
    ("inflight", "fetch_inflight"),
    ("concurrency_limit", "fetch_concurrency_limit"),
    ("max_rss_bytes", "engine_max_rss_bytes"),
)
_STORE_COUNTERS = (
    ("connections_opened", "store_connections_opened"),
    ("connections_reused", "store_connections_reused"),
)
_CACHE_COUNTERS = (
    ("hits", "cache_hits"),
    ("misses", "cache_misses"),
    ("bytes_from_cache", "cache_read_bytes"),
    ("evictions", "cache_evictions"),
    ("write_failures", "cache_write_failures"),
)
_LOADER_STAGES = (
    ("decode_wait_seconds", "decode_wait"),
    ("feed_wait_seconds", "feed_wait"),
    ("feed_seconds", "feed"),
    ("probe_seconds", "probe"),
)


def _number(value: Any) -> float | None:
    """``value`` as a float if it is a plain number (never a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


class _Out:
    def __init__(self) -> None:
        self.items: list[Reading] = []

    def add(self, name: str, value: Any, scope: Scope, *labels: str) -> None:
        number = _number(value)
        if number is not None:
            self.items.append(Reading(_P + name, labels, number, scope))


def _store_name(store: dict[str, Any]) -> str:
    scheme, endpoint = str(store.get("scheme", "")), str(store.get("endpoint", ""))
    return f"{scheme}:{endpoint}" if endpoint else scheme


def _fetch(out: _Out, fetch: dict[str, Any]) -> None:
    for key, name in _FETCH_COUNTERS:
        out.add(name, fetch.get(key), "engine")
    for key, name in _FETCH_GAUGES:
        out.add(name, fetch.get(key), "gauge")
    retries = fetch.get("retries")
    if isinstance(retries, dict):
        for cause, count in sorted(retries.items()):
            out.add("fetch_retries", count, "engine", str(cause))
    for key, name in (
        ("first_byte_s", "fetch_first_byte_seconds"),
        ("chunk_s", "fetch_chunk_seconds"),
    ):
        summary = fetch.get(key)
        if isinstance(summary, dict):
            for field, quantile in _QUANTILES:
                out.add(name, summary.get(field), "gauge", quantile)
    stores = fetch.get("stores")
    for store in stores if isinstance(stores, list) else []:
        if not isinstance(store, dict):
            continue
        label = _store_name(store)
        for key, name in _STORE_COUNTERS:
            out.add(name, store.get(key), "engine", label)
        cache = store.get("cache")
        if isinstance(cache, dict):
            for key, name in _CACHE_COUNTERS:
                out.add(name, cache.get(key), "engine", label)


def _stream(out: _Out, stats: dict[str, Any]) -> None:
    out.add("samples", stats.get("samples"), "epoch")
    out.add("epoch", stats.get("epoch"), "gauge")
    out.add("open_shards", stats.get("open_shards"), "gauge")
    out.add("shuffle_radius_samples", stats.get("shuffle_radius"), "gauge")
    out.add("tar_general_members", stats.get("tar_general_members"), "epoch")
    ring = stats.get("ring")
    if isinstance(ring, dict):
        out.add("ring_slots", ring.get("slots"), "gauge")
        out.add("ring_slots_used", ring.get("used"), "gauge")
    fetch = stats.get("fetch")
    if isinstance(fetch, dict):
        _fetch(out, fetch)


def _stall(out: _Out, stall: Any, scope: Scope | None) -> None:
    """The stall meter's report; its epoch's seconds only with a ``scope``."""
    if not isinstance(stall, dict):
        return
    epoch, recent = stall.get("epoch"), stall.get("recent")
    if isinstance(epoch, dict) and scope is not None:
        out.add("stall_waited_seconds", epoch.get("waited_s"), scope)
        out.add("stall_worked_seconds", epoch.get("worked_s"), scope)
        out.add("stall_calls", epoch.get("calls"), scope)
    if isinstance(recent, dict):
        out.add("stall_share", recent.get("waited_share"), "gauge")


def _era(stats: dict[str, Any]) -> Hashable:
    return (stats.get("iteration"), stats.get("epoch"))


def readings(stats: dict[str, Any]) -> list[ReaderReading]:
    """The metrics in one ``stats()`` dict, by reader: ``""`` for the source's own figures
    and, for a ``DALIImageLoader`` with DataLoader workers, each worker's stream figures
    under its worker number (as a string).

    Args:
        stats: what ``stats()`` returned; figures missing or of another type are left out,
            never guessed.
    """
    own = _Out()
    out = [ReaderReading("", _era(stats), own.items)]
    stream = stats.get("stream")
    if isinstance(stream, dict) and "batches" in stats:  # a DALIImageLoader's
        for key, name in (
            ("batches", "loader_batches"),
            ("images", "loader_images"),
            ("skipped", "loader_skipped_images"),
        ):
            own.add(name, stats.get(key), "total")
        for key, stage in _LOADER_STAGES:
            own.add("loader_stage_seconds", stats.get(key), "total", stage)
        _stall(own, stats.get("stall"), None)
        # The stream's figures are the producer's snapshots, whose epoch's last may be
        # replaced by the next epoch's before any reading: the loader's own counters
        # stand for the epoch's (images), the engine's never start again.
        workers = stream.get("workers")
        snapshots = workers if isinstance(workers, dict) else {"": stream}
        for worker, snapshot in sorted(snapshots.items(), key=lambda kv: str(kv[0])):
            if isinstance(snapshot, dict):
                mine = _Out()
                _stream(mine, snapshot)
                items = [item for item in mine.items if item.scope != "epoch"]
                if worker == "":
                    own.items += items
                else:
                    out.append(ReaderReading(str(worker), _era(snapshot), items))
        return out
    _stream(own, stats)
    _stall(own, stats.get("stall"), "epoch")
    return out
