"""What the probe's figures mean: each stage's ceiling, the one that binds, the settings to
try. A pure function of the measured figures (the report's plain dicts), so that it is
tested on figures made up as well as measured.

The stages, each with a ceiling in samples/s (one image a sample):

``network``
    The most MB/s any K reached, over the bytes a sample takes on the wire.
``engine``
    The fetch engine's process runs one event loop, on one core: its CPU per byte at
    that K gives the bytes/s it could move with a core to itself.
``stream``
    Samples per CPU second of the thread that reads the stream (no decode).
``feed``
    Images per CPU second of the process that builds DALI's batches (no decode).
``decoder``
    DALI over images already in memory: images/s.

A stage not measured has no ceiling and cannot bind; the network's is a floor where it
still rose at the largest K tried. Where no sample's size is known (the stream not
measured), the network and the engine are compared in MB/s.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["STAGES", "verdict"]

STAGES = ("network", "engine", "stream", "feed", "decoder")

_MIB = 1 << 20
_GET_SHARE = 0.8  # a GET should spend this share of its time moving bytes
_ENOUGH = 0.9  # a K within this share of the best counts as reaching it
_HEADROOM = 1.2  # the network asked for this much over what the rest can take
_RISING = 1.1  # the best K beat the one before by this much: more K may give more


def _per_sample(mb_per_s: float | None, wire_bytes: float | None) -> float | None:
    if mb_per_s is None or not wire_bytes:
        return None
    return mb_per_s * 1e6 / wire_bytes


def _best_k(ks: list[dict[str, Any]]) -> dict[str, Any] | None:
    return max(ks, key=lambda r: r["mb_per_s"]) if ks else None


def _stages(m: dict[str, Any]) -> dict[str, dict[str, Any]]:
    ks: list[dict[str, Any]] = m.get("inflight", [])
    stream = m.get("stream") or {}
    decode = m.get("decode") or {}
    wire = stream.get("sample_wire_bytes")
    stages: dict[str, dict[str, Any]] = {}
    best = _best_k(ks)
    if best is not None:
        at = ks.index(best)
        rising = (
            at == len(ks) - 1 and at > 0 and best["mb_per_s"] > _RISING * ks[at - 1]["mb_per_s"]
        )
        stages["network"] = {
            "ceiling_mb_per_s": best["mb_per_s"],
            "ceiling_samples_per_s": _per_sample(best["mb_per_s"], wire),
            "at_inflight": best["inflight"],
            "note": f"still rising at K = {best['inflight']}: a floor" if rising else "",
        }
        per_gb = best.get("engine_cpu_s_per_gb")
        if per_gb:
            stages["engine"] = {
                "ceiling_mb_per_s": 1e3 / per_gb,
                "ceiling_samples_per_s": _per_sample(1e3 / per_gb, wire),
                "note": f"{per_gb:.2f} CPU s per GB at K = {best['inflight']}, one core",
            }
    if stream.get("ceiling_samples_per_s"):
        stages["stream"] = {
            "ceiling_samples_per_s": stream["ceiling_samples_per_s"],
            "measured_samples_per_s": stream.get("samples_per_s"),
            "note": f"{stream['cpu_us_per_sample']:.1f} us of CPU a sample",
        }
    feed = decode.get("feed") or {}
    if feed.get("ceiling_images_per_s"):
        stages["feed"] = {
            "ceiling_samples_per_s": feed["ceiling_images_per_s"],
            "measured_samples_per_s": feed.get("images_per_s"),
            "note": f"batch {feed.get('batch')}",
        }
    decoder = decode.get("decoder") or {}
    if decoder.get("images_per_s"):
        stages["decoder"] = {
            "ceiling_samples_per_s": decoder["images_per_s"],
            "note": f"DALI on {decoder.get('device')}, {decoder.get('threads')} threads",
        }
    return stages


def _chunk_bytes(per_connection_mb_per_s: float | None, first_byte_s: float | None) -> int | None:
    """The smallest power of two MiB (1 to 64 MiB) whose GET moves bytes for at least
    :data:`_GET_SHARE` of its time on this link: ``C / (f + C / r) >= share * r``."""
    if not per_connection_mb_per_s or first_byte_s is None:
        return None
    need = _GET_SHARE / (1 - _GET_SHARE) * per_connection_mb_per_s * 1e6 * first_byte_s
    mib = 1
    while mib * _MIB < need and mib < 64:
        mib *= 2
    return mib * _MIB


def _inflight(ks: list[dict[str, Any]], demand_mb_per_s: float | None) -> int | None:
    """The smallest K measured that reaches what the other stages can take (with headroom),
    or the best K where none does."""
    best = _best_k(ks)
    if best is None:
        return None
    want = best["mb_per_s"] if demand_mb_per_s is None else min(best["mb_per_s"], demand_mb_per_s)
    for row in sorted(ks, key=lambda r: r["inflight"]):
        if row["mb_per_s"] >= _ENOUGH * want:
            return int(row["inflight"])
    return int(best["inflight"])


def verdict(measured: dict[str, Any]) -> dict[str, Any]:
    """The ceilings, the binding stage and the suggested settings of measured figures.

    Args:
        measured: the probe's figures: ``inflight`` (a row per K), ``connection``,
            ``stream``, ``decode`` and ``machine`` (``cpus``), as :func:`~._run.probe`
            gathers them.

    Returns:
        ``stages`` (by name: ``ceiling_samples_per_s`` and notes), ``binding`` (a stage's
        name, or None where none has a ceiling), ``next`` (the one after it) and
        ``suggested`` (``inflight``, ``chunk_bytes``, ``workers``, ``dali_threads``, each
        None where nothing measured says, and ``why``: a line each).
    """
    stages = _stages(measured)
    ranked = sorted(
        (s for s in stages if stages[s].get("ceiling_samples_per_s")),
        key=lambda s: stages[s]["ceiling_samples_per_s"],
    )
    if not ranked:  # no sample's size known (the stream not measured): bytes alone
        ranked = sorted(
            (s for s in stages if stages[s].get("ceiling_mb_per_s")),
            key=lambda s: stages[s]["ceiling_mb_per_s"],
        )
    binding = ranked[0] if ranked else None
    following = ranked[1] if len(ranked) > 1 else None
    stream = measured.get("stream") or {}
    wire = stream.get("sample_wire_bytes")
    cpus = int((measured.get("machine") or {}).get("cpus", 1))
    why: dict[str, str] = {}

    # What the stages after the network can take: the network need not give more.
    rest = [
        stages[s]["ceiling_samples_per_s"]
        for s in ranked
        if s not in ("network", "engine") and stages[s].get("ceiling_samples_per_s")
    ]
    demand = _HEADROOM * min(rest) * wire / 1e6 if rest and wire else None
    ks: list[dict[str, Any]] = measured.get("inflight", [])
    inflight = _inflight(ks, demand)
    best = _best_k(ks)
    if inflight is not None and best is not None:
        enough = demand is not None and demand < best["mb_per_s"]
        why["inflight"] = f"the smallest K reaching {_ENOUGH:.0%} of " + (
            f"what the later stages can take ({demand:,.0f} MB/s with headroom)"
            if enough
            else "the best MB/s measured"
        )
    connection = measured.get("connection") or {}
    chunk = _chunk_bytes(connection.get("mb_per_s"), connection.get("first_byte_s"))
    if chunk is not None:
        why["chunk_bytes"] = (
            f"a GET moves bytes {_GET_SHARE:.0%} of its time at "
            f"{connection['mb_per_s']:.0f} MB/s after {1e3 * connection['first_byte_s']:.0f} ms"
        )

    workers = None
    if binding in ("stream", "feed"):
        slow = stages[binding]["ceiling_samples_per_s"]
        goal = stages[following]["ceiling_samples_per_s"] if following else slow * cpus
        workers = max(1, min(cpus - 1, math.ceil(goal / slow))) if cpus > 1 else 0
        why["workers"] = f"the {binding} binds: readers in DataLoader workers add cores to it"
    elif binding is not None:
        workers = 0
        why["workers"] = f"the {binding} binds, not the reader: workers would not help"

    decoder = (measured.get("decode") or {}).get("decoder") or {}
    threads = decoder.get("threads")
    if threads is not None:
        why["dali_threads"] = f"measured with {threads} on {decoder.get('device')}"
        if binding == "decoder" and decoder.get("device") == "cpu":
            why["dali_threads"] += ": the decoder binds, give it every core the reader spares"
    return {
        "stages": stages,
        "binding": binding,
        "next": following,
        "suggested": {
            "inflight": inflight,
            "chunk_bytes": chunk,
            "workers": workers,
            "dali_threads": threads,
            "why": why,
        },
    }
