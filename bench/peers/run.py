"""Run one peer in this process and write what it measured: the child side of the harness.

``python -m bench.peers.run --spec SPEC.json --out RESULT.json`` runs one phase of one peer
(``convert`` or ``read``, named in the spec) and writes its measurements;
``python -m bench.peers.run --probe [NAME ...]`` imports the peers' adapters and prints, as
JSON, which ones import here and the versions of their packages. Run from the repository
root, with any interpreter that has the peer installed (the main one or ``.venv-peers``):
this module and the adapters' shared code import only the standard library until a peer is
chosen, and never import asyncstream.

The S3 endpoint, region and credentials come from the environment (``AWS_ENDPOINT_URL``,
``AWS_DEFAULT_REGION``, ``AWS_ACCESS_KEY_ID``, ...), as each peer's library reads them;
:func:`bench.peers.run_peer` sets them.

Measured for a read (keys of the result):

* ``samples``, ``bytes`` (``jpg`` + ``cls`` of every sample), ``seconds`` (from the
  dataset's construction to its last sample), ``samples_per_s``, ``mb_per_s`` (10^6 B);
* ``first_sample_s``: from the dataset's construction (listing, index download and
  presigning included) to the first sample; ``import_s``: importing the library, before;
* ``cpu_s`` = ``cpu_self_s`` + ``cpu_children_s``: CPU seconds of this process and of its
  children reaped during the phase (webdataset's curl, DataLoader workers);
* ``peak_rss_bytes``: this process's peak RSS during the phase (``VmHWM``, reset once the
  library is imported, when ``peak_rss_reset``); ``rss_start_bytes``: its RSS then, mostly
  the imported libraries (the CUDA build of torch in ``.venv-peers`` is ~0.3 GB more than the
  CPU build); ``import_peak_rss_bytes``: the peak before. DataLoader workers' memory is
  not included: compare memory with ``workers=0``;
* ``shm_bytes``: ``/dev/shm`` segments mapped at the end of the epoch; ``cache_bytes``:
  bytes on local disk in the run's scratch folder (the peer's local cache) then;
* ``keys`` and ``labels``: what was emitted, in order.

A conversion reports ``seconds``, the CPU and memory figures, and ``output_objects`` and
``output_bytes`` written at ``output_url``.

A ``mix`` phase (peers with ``mix_samples``: webdataset, litdata) reads several datasets
mixed by weight, ``spec["mix"]`` = ``{"sources": [{"name", "shards", "weight",
"target"}], "samples": N, "convert": bool}``: converting peers first convert each source
to its ``target`` (timed apart, ``convert_s``), then ``N`` samples are read (fewer if a
source runs out first) and measured as a read is, with ``sources``, the source of each
sample in order, instead of keys and labels.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import os
import sys
import time
import types
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ._common import (
    PEERS,
    PROBE_TAG,
    Context,
    dir_bytes,
    mapped_shm_bytes,
    prefix_bytes,
    proc_status,
    reset_peak_rss,
    rusage,
    s3_client,
)

__all__ = ["main", "probe"]


def _versions(distributions: Sequence[str]) -> dict[str, str]:
    versions = {}
    for name in distributions:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    torch = sys.modules.get("torch")
    if torch is not None:
        versions["torch"] = str(torch.__version__)  # the build too: +cpu, +cu130, ...
    return versions


def _adapter(name: str) -> types.ModuleType:
    if name not in PEERS:
        raise ValueError(f"unknown peer {name!r}; the peers are {', '.join(PEERS)}")
    return importlib.import_module(f"bench.peers.{PEERS[name].module}")


def probe(names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Import each peer's adapter here: ``{name: {"ok", "error", "versions", "shuffle"}}``."""
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        try:
            module = _adapter(name)
        except Exception as exc:  # any failure to import makes the peer unavailable here
            out[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "versions": {}}
            continue
        out[name] = {
            "ok": True,
            "error": None,
            "versions": _versions(module.DISTRIBUTIONS),
            "shuffle": module.SHUFFLE,
        }
    return out


def _context(spec: dict[str, Any], end_of_epoch: Any) -> Context:
    return Context(
        shards=list(spec["shards"]),
        target=spec["target"],
        endpoint_url=spec["endpoint_url"],
        region=spec["region"],
        seed=int(spec["seed"]),
        workers=int(spec["workers"]),
        batch_size=int(spec["batch_size"]),
        shuffle_buffer=int(spec["shuffle_buffer"]),
        scratch=Path(spec["scratch"]),
        end_of_epoch=end_of_epoch,
    )


class _Meter:
    """CPU, time and memory from :meth:`start` on."""

    def start(self) -> None:
        status = proc_status()
        self.import_peak = status.get("VmHWM", 0)
        self.rss_start = status.get("VmRSS", 0)
        self.peak_reset = reset_peak_rss()
        self.cpu0, self.children0 = rusage()
        self.t0 = time.perf_counter()

    def cpu(self) -> dict[str, Any]:
        own, children = rusage()
        return {
            "cpu_s": own - self.cpu0 + children - self.children0,
            "cpu_self_s": own - self.cpu0,
            "cpu_children_s": children - self.children0,
            "rss_start_bytes": self.rss_start,
            "import_peak_rss_bytes": self.import_peak,
            "peak_rss_reset": self.peak_reset,
        }


def _read(module: types.ModuleType, spec: dict[str, Any]) -> dict[str, Any]:
    meter = _Meter()
    end: dict[str, Any] = {}

    def end_of_epoch() -> None:
        if not end:
            end["t"] = time.perf_counter()
            end["peak_rss_bytes"] = proc_status().get("VmHWM", 0)
            end["shm_bytes"] = mapped_shm_bytes()
            end["cache_bytes"] = dir_bytes(Path(spec["scratch"]))

    ctx = _context(spec, end_of_epoch)
    keys: list[str] = []
    labels: list[int] = []
    nbytes = 0
    first: float | None = None
    meter.start()
    for sample in module.samples(ctx):
        if first is None:
            first = time.perf_counter() - meter.t0
        keys.append(sample.key)
        labels.append(sample.label)
        nbytes += sample.nbytes
    end_of_epoch()  # a no-op when the adapter called it before its teardown
    seconds = end["t"] - meter.t0
    return {
        "phase": "read",
        "samples": len(keys),
        "bytes": nbytes,
        "seconds": seconds,
        "samples_per_s": len(keys) / seconds if seconds > 0 else 0.0,
        "mb_per_s": nbytes / seconds / 1e6 if seconds > 0 else 0.0,
        "first_sample_s": first,
        "peak_rss_bytes": end["peak_rss_bytes"],
        "shm_bytes": end["shm_bytes"],
        "cache_bytes": end["cache_bytes"],
        **meter.cpu(),
        "keys": keys,
        "labels": labels,
    }


def _mix(module: types.ModuleType, spec: dict[str, Any]) -> dict[str, Any]:
    if not hasattr(module, "mix_samples"):
        raise ValueError(f"peer {spec['peer']!r} does not mix datasets here")
    mix = spec["mix"]
    ctx = _context(spec, lambda: None)
    convert_s = None
    if hasattr(module, "convert") and mix.get("convert", True):
        t0 = time.perf_counter()
        for source in mix["sources"]:
            module.convert(replace(ctx, shards=list(source["shards"]), target=source["target"]))
        convert_s = time.perf_counter() - t0
    meter = _Meter()
    sources: list[str] = []
    nbytes = 0
    first: float | None = None
    wanted = int(mix["samples"])
    meter.start()
    samples = module.mix_samples(ctx, mix["sources"])
    for name, sample in samples:
        if first is None:
            first = time.perf_counter() - meter.t0
        sources.append(name)
        nbytes += sample.nbytes
        if len(sources) == wanted:
            break
    seconds = time.perf_counter() - meter.t0
    peak = proc_status().get("VmHWM", 0)
    samples.close()
    return {
        "phase": "mix",
        "samples": len(sources),
        "bytes": nbytes,
        "seconds": seconds,
        "samples_per_s": len(sources) / seconds if seconds > 0 else 0.0,
        "mb_per_s": nbytes / seconds / 1e6 if seconds > 0 else 0.0,
        "first_sample_s": first,
        "peak_rss_bytes": peak,
        "convert_s": convert_s,
        **meter.cpu(),
        "sources": sources,
    }


def _convert(module: types.ModuleType, spec: dict[str, Any]) -> dict[str, Any]:
    meter = _Meter()
    ctx = _context(spec, lambda: None)
    meter.start()
    info = module.convert(ctx)
    seconds = time.perf_counter() - meter.t0
    peak = proc_status().get("VmHWM", 0)
    objects, size = prefix_bytes(s3_client(ctx.endpoint_url), ctx.target)
    return {
        "phase": "convert",
        "seconds": seconds,
        "peak_rss_bytes": peak,
        "output_url": ctx.target,
        "output_objects": objects,
        "output_bytes": size,
        **meter.cpu(),
        **info,
    }


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Run the phase the spec names and return its measurements."""
    t0 = time.perf_counter()
    module = _adapter(spec["peer"])
    import_s = time.perf_counter() - t0
    phase = spec["phase"]
    if phase == "read":
        result = _read(module, spec)
    elif phase == "mix":
        result = _mix(module, spec)
    elif phase == "convert":
        if not hasattr(module, "convert"):
            raise ValueError(f"peer {spec['peer']!r} has no conversion step")
        result = _convert(module, spec)
    else:
        raise ValueError(f"phase must be 'read', 'convert' or 'mix', got {phase!r}")
    result.update(
        peer=spec["peer"],
        import_s=import_s,
        shuffle=module.SHUFFLE,
        versions=_versions(module.DISTRIBUTIONS),
        python=sys.executable,
        pid=os.getpid(),
    )
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry; see the module docstring."""
    parser = argparse.ArgumentParser(prog="python -m bench.peers.run", description=__doc__)
    parser.add_argument("--probe", nargs="*", metavar="NAME", help="report which peers import")
    parser.add_argument("--spec", type=Path, help="the run's spec (JSON)")
    parser.add_argument("--out", type=Path, help="where to write the result (JSON)")
    args = parser.parse_args(argv)
    if args.probe is not None:
        # Tagged: the libraries may print to stdout while they import.
        print(PROBE_TAG + json.dumps(probe(args.probe or list(PEERS))), flush=True)
        return 0
    if args.spec is None or args.out is None:
        parser.error("give --probe, or both --spec and --out")
    result = run(json.loads(args.spec.read_text()))
    partial = args.out.with_name(args.out.name + ".partial")
    partial.write_text(json.dumps(result))
    partial.replace(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
