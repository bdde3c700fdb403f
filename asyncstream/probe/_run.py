"""The probe's run: the stages in order, within a budget of seconds, and its report.

The budget is split: two fifths to the K sweep (shared by the Ks), one fifth to the
stream, two fifths to the feed and the decoder (``dali_ops``' process). Listing the
shards, starting engines and importing DALI come on top (a few seconds).
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..dataset._dataset import DatasetPlan, plan_dataset
from ..dataset._index_cache import IndexCache
from ..stores._s3 import S3Options
from ._decode import measure_decode
from ._fetch import measure_k
from ._stream import measure_stream
from ._verdict import verdict

__all__ = ["DEFAULT_KS", "probe"]

DEFAULT_KS = (1, 4, 16, 64)
_SWEEP, _STREAM = 0.4, 0.2
_COUNT_S = 2.0  # shards with no count: as many as the fastest K reads in this (or more)


def _machine() -> dict[str, Any]:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpus": cpus or 1, "platform": platform.platform(), "python": platform.python_version()}


def _plan(url: str, options: S3Options) -> DatasetPlan:
    cache = IndexCache.open()
    try:
        return plan_dataset(url, options, cache=cache)
    finally:
        if cache is not None:
            cache.close()


def _readable(plan: DatasetPlan, url: str, budget_bytes: float) -> tuple[str | list[str], str]:
    """What the stream stages read: ``url`` where every shard's count is known (an index,
    the local cache); else the first shards that counting (reading each once, as a stream
    would) can get through in ``budget_bytes``, or none (``[]``) with the reason."""
    if all(s.url in plan.counts for s in plan.shards):
        return url, ""
    urls: list[str] = []
    taken = 0
    shard = plan.shards[0]
    for shard in plan.shards:
        if urls and taken + shard.size > budget_bytes:
            break
        urls.append(shard.url)
        taken += shard.size
    if taken > budget_bytes:
        return [], (
            f"no index, and counting the first shard ({shard.size / 1e6:,.0f} MB) outlasts the "
            f"budget: run 'asyncstream index {url}' once"
        )
    return urls, f"no index: the first {len(urls)} shards, counted first (not timed)"


def probe(
    url: str,
    options: S3Options | None = None,
    *,
    seconds: float = 30.0,
    ks: Sequence[int] = DEFAULT_KS,
    chunk_bytes: int = 4 << 20,
    decode: bool = True,
    say: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measure what will limit a stream of ``url`` here, stage by stage.

    Reads only the shards ``url`` names, through the stores and the settings a stream of
    it would use (``options``: credentials, endpoint, certificates).

    Args:
        url: the dataset, as :class:`~asyncstream.ShardStream` takes it.
        options: how to reach S3; resolved from the environment where left unset.
        seconds: the measuring budget (module docstring).
        ks: the downloads in flight to try, ascending.
        chunk_bytes: the bytes of one GET in the sweep, and the stream's chunk size.
        decode: measure the feed and the decoder (DALI, through ``dali_ops``).
        say: called with a line as each stage starts (progress), or None.

    Returns:
        The report as plain JSON: ``url``, ``shards``, ``bytes``, ``machine``,
        ``connection`` (``first_byte_s``, ``mb_per_s`` of one connection), ``inflight``
        (a row per K), ``stream``, ``decode``, and :func:`~._verdict.verdict`'s
        ``stages``, ``binding``, ``next`` and ``suggested``.

    Raises:
        ValueError: ``seconds``, ``ks`` or ``chunk_bytes`` out of range.
        AsyncStreamError: the shards cannot be listed or read.
    """
    if not seconds > 0:
        raise ValueError(f"seconds must be > 0, got {seconds!r}")
    if not ks or any(k < 1 for k in ks) or list(ks) != sorted(set(ks)):
        raise ValueError(f"ks must be distinct integers >= 1, ascending, got {list(ks)!r}")
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes!r}")
    tell = say or (lambda line: None)
    options = (options or S3Options()).resolve()
    started = time.perf_counter()
    tell(f"listing {url}")
    plan = _plan(url, options)
    shards = plan.shards
    report: dict[str, Any] = {
        "url": url,
        "shards": len(shards),
        "bytes": sum(s.size for s in shards),
        "seconds_budget": seconds,
        "chunk_bytes": chunk_bytes,
        "machine": _machine(),
    }
    tell(f"GETs at K = {', '.join(map(str, ks))}")
    rows = [
        r.as_dict()
        for r in measure_k(
            shards, options, ks=ks, chunk_bytes=chunk_bytes, seconds=_SWEEP * seconds / len(ks)
        )
    ]
    report["inflight"] = rows
    one = rows[0]
    first, whole = one["first_byte_s"].get("p50"), one["chunk_s"].get("p50")
    per_get = one["bytes"] / one["gets"] if one["gets"] else 0.0
    report["connection"] = {
        "inflight": one["inflight"],
        "first_byte_s": first,
        "first_byte_p95_s": one["first_byte_s"].get("p95"),
        "get_bytes": per_get,
        # One connection's rate, its first byte left out.
        "mb_per_s": per_get / (whole - first) / 1e6
        if first is not None and whole is not None and whole > first
        else None,
    }
    best = max(rows, key=lambda r: r["mb_per_s"])["inflight"]
    fastest = max(r["mb_per_s"] for r in rows) * 1e6
    source, why = _readable(plan, url, fastest * max(_STREAM * seconds, _COUNT_S))
    if source:
        tell(f"the stream, no decode (inflight {best})")
        named = set(source) if isinstance(source, list) else None
        report["stream"] = measure_stream(
            source,
            options,
            shard_bytes=sum(s.size for s in shards if named is None or s.url in named),
            inflight=best,
            chunk_bytes=chunk_bytes,
            seconds=_STREAM * seconds,
        ).as_dict()
        report["stream"]["read"] = why or "the dataset"
    else:
        report["stream"] = {"not_measured": why}
    if not decode:
        report["decode"] = {"not_measured": "not asked (--no-decode)"}
    elif not source:
        report["decode"] = {"not_measured": why}
    else:
        tell("the feed and the decoder (DALI)")
        left = (1 - _SWEEP - _STREAM) * seconds
        report["decode"] = measure_decode(
            source, options, seconds=left, inflight=best, chunk_bytes=chunk_bytes
        )
    report.update(verdict(report))
    report["seconds"] = time.perf_counter() - started
    return report
