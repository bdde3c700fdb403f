"""``python -m bench.autotune``: ``inflight="auto"`` against a sweep of fixed K, two links.

The dataset (a packed folder, ``real-4000`` of ``~/.cache/asyncstream-bench`` by default)
is served by nginx (:class:`asyncstream.testing.Nginx`, path-style S3) pinned to a CPU of
its own, the reader on the others, over two links:

* ``fast``: loopback, no shaping (the reader's CPU binds);
* ``slow``: the S3-like link (:meth:`NetworkProfile.s3_like`: 20 to 50 ms to the first
  byte, 90 MB/s per connection), or the one ``--slow-latency`` / ``--slow-rate`` give.

Each setting (``inflight`` = each of ``--ks``, and ``"auto"`` with its default
``prefetch``) reads ``--epochs`` epochs without decode in a process of its own (engine
start-up and the tuner's learning included), every sample checked to come exactly once
per epoch; rounds alternate the order of the settings (forward, then backward) and each
figure is the median over ``--repeat`` rounds. Reported: MB/s of sample bytes over the
whole run (the tuner's learning included) and over its last epoch (the steady state, on
the engine kept from the epochs before) and over the second half of the epochs (the
steady state measured over more than one short epoch), and for auto the concurrency it
ended at and the most it reached; then auto against the best fixed K of each link, each
way (it must be within 5%). ``--render JSON`` prints the tables of a run's ``--json``
again.

Stream settings: the library's defaults (1 MiB blocks, window 64, the ring within
128 MiB), seed 0; ``--chunk-mib`` and ``--window`` set others (the sweeps before the
1 MiB default used 4 MiB chunks and window 16).
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ._run import arguments, header, report

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
DEFAULT = Path(os.environ.get("ASYNCSTREAM_BENCH_DATA", Path.home() / ".cache/asyncstream-bench"))
KS = (8, 16, 32, 64)
BUCKET = "bench"


def _child(spec: dict[str, Any]) -> dict[str, Any]:
    """In a process of its own: ``epochs`` epochs of the stream; bytes, seconds, the
    engine's concurrency at the end, and whether every sample came once per epoch."""
    from asyncstream import S3Options, ShardStream
    from asyncstream.testing._nginx import CREDENTIALS

    options = S3Options(
        endpoint_url=spec["endpoint"], credentials=CREDENTIALS, addressing_style="path"
    )
    nbytes = 0
    exact = True
    began = time.perf_counter()
    epochs: list[float] = []  # MB/s of each epoch
    with ShardStream(spec["url"], s3=options, **spec["stream"]) as stream:
        for epoch in range(spec["epochs"]):
            stream.set_epoch(epoch)
            keys = []
            at, before = time.perf_counter(), nbytes
            for sample in stream:
                keys.append(sample["__key__"])
                nbytes += sum(len(v) for k, v in sample.items() if isinstance(v, bytes))
            epochs.append((nbytes - before) / (time.perf_counter() - at) / 1e6)
            exact = exact and len(keys) == len(set(keys)) == spec["samples"]
        seconds = time.perf_counter() - began
        fetch = stream.stats()["fetch"]
    return {
        "epochs_mb_per_s": epochs,
        "mb_per_s": nbytes / seconds / 1e6,
        "seconds": seconds,
        "bytes": nbytes,
        "exact": exact,
        "concurrency_limit": fetch["concurrency_limit"],
        "concurrency_limit_max": fetch.get("concurrency_limit_max"),
        "inflight_mean": fetch["inflight_mean"],
        "autotune": fetch.get("autotune"),
    }


def _run(spec: dict[str, Any], work: Path) -> dict[str, Any]:
    (work / "spec.json").write_text(json.dumps(spec))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    subprocess.run(
        [sys.executable, "-m", "bench.autotune", "--child", str(work / "spec.json")],
        check=True,
        cwd=ROOT,
        env=env,
        timeout=900,
    )
    result: dict[str, Any] = json.loads((work / "out.json").read_text())
    if not result["exact"]:
        raise RuntimeError(f"{spec['stream']}: not every sample exactly once per epoch")
    return result


def _place(data: Path, root: Path) -> tuple[str, int]:
    """The dataset's files under nginx's root as bucket ``bench`` (hard links where the
    file system allows); its URL and its samples per epoch."""
    target = root / BUCKET / data.name
    target.mkdir(parents=True)
    for path in data.iterdir():
        if path.is_file():
            try:
                os.link(path, target / path.name)
            except OSError:
                target.joinpath(path.name).write_bytes(path.read_bytes())
    samples = int(json.loads((data / "asyncstream.json").read_text())["samples"])
    return f"s3://{BUCKET}/{data.name}/", samples


@contextlib.contextmanager
def _link(root: Path, profile: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """nginx on ``profile``, pinned to the last CPU, this process (and the readers it
    starts) to the others while the block runs."""
    from asyncstream.testing import Nginx

    cpus = sorted(os.sched_getaffinity(0))
    server_cpu, readers = (cpus[-1], set(cpus[:-1])) if len(cpus) > 1 else (cpus[0], set(cpus))
    before = os.sched_getaffinity(0)
    with Nginx(root, profile=profile, cpu=server_cpu) as nginx:
        os.sched_setaffinity(0, readers)
        try:
            yield nginx.url, {"server_cpus": sorted(nginx.cpus()), "reader_cpus": sorted(readers)}
        finally:
            os.sched_setaffinity(0, before)


def sweep(
    url: str,
    samples: int,
    endpoint: str,
    settings: list[Any],
    *,
    rounds: int,
    epochs: int,
    stream_settings: dict[str, Any],
) -> dict[str, Any]:
    """Every setting ``rounds`` times, the order turned every other round; medians."""
    runs: dict[str, list[dict[str, Any]]] = {str(k): [] for k in settings}
    with tempfile.TemporaryDirectory(prefix="autotune-") as tmp:
        for r in range(rounds):
            for k in settings if r % 2 == 0 else reversed(settings):
                stream = {**stream_settings, "inflight": k}
                spec = {
                    "url": url,
                    "endpoint": endpoint,
                    "stream": stream,
                    "epochs": epochs,
                    "samples": samples,
                    "out": str(Path(tmp) / "out.json"),
                }
                result = _run(spec, Path(tmp))
                runs[str(k)].append(result)
                print(
                    f"  inflight={k}: {result['mb_per_s']:.0f} MB/s, last epoch "
                    f"{result['epochs_mb_per_s'][-1]:.0f}, K at the end "
                    f"{result['concurrency_limit']}",
                    flush=True,
                )
    out: dict[str, Any] = {}
    for k, rows in runs.items():
        out[k] = {
            "mb_per_s": statistics.median(r["mb_per_s"] for r in rows),
            "mb_per_s_runs": [r["mb_per_s"] for r in rows],
            "epochs_mb_per_s_runs": [r["epochs_mb_per_s"] for r in rows],
            "last_epoch_mb_per_s": statistics.median(r["epochs_mb_per_s"][-1] for r in rows),
            "inflight_mean": statistics.median(r["inflight_mean"] for r in rows),
        }
        if k == "auto":
            out[k]["concurrency_end"] = [r["concurrency_limit"] for r in rows]
            out[k]["concurrency_max"] = [r["concurrency_limit_max"] for r in rows]
            out[k]["autotune"] = [r["autotune"] for r in rows]
    return judged(out)


def steady(epochs: list[float]) -> float:
    """MB/s over the second half of a run's epochs (the same bytes each: the harmonic mean
    of their rates); the last epoch alone where a run has one. Epochs of a fast link are
    a quarter of a second, so one epoch is mostly noise; half the run is less so."""
    half = epochs[len(epochs) // 2 :]
    return len(half) / sum(1.0 / r for r in half)


def judged(rows: dict[str, Any]) -> dict[str, Any]:
    """The rows with their steady figures, and auto against the best fixed K on each
    figure: the whole run, the last epoch, the second half of the epochs (steady)."""
    for row in rows.values():
        runs = row.get("epochs_mb_per_s_runs")
        if runs:
            row["steady_mb_per_s_runs"] = [steady(e) for e in runs]
            row["steady_mb_per_s"] = statistics.median(row["steady_mb_per_s_runs"])
    verdicts: dict[str, Any] = {}
    for figure in ("mb_per_s", "last_epoch_mb_per_s", "steady_mb_per_s"):
        fixed = {k: v[figure] for k, v in rows.items() if k != "auto" and figure in v}
        if not fixed or figure not in rows["auto"]:
            continue
        best = max(fixed, key=fixed.__getitem__)
        verdicts[figure] = {
            "best_fixed": int(best),
            "auto_over_best": rows["auto"][figure] / fixed[best],
        }
    return {
        "rows": rows,
        **verdicts["mb_per_s"],
        "last_epoch": verdicts["last_epoch_mb_per_s"],
        **({"steady": verdicts["steady_mb_per_s"]} if "steady_mb_per_s" in verdicts else {}),
    }


def render(out: dict[str, Any]) -> str:
    lines = [
        f"{out['machine']}; {out['date']}; {out['dataset']}; {out['epochs']} epochs a run, "
        f"median of {out['repeat']} rounds; nginx on CPU {out['pinning']['server_cpus']}, "
        f"readers on {out['pinning']['reader_cpus']}.",
        "",
        "| link | inflight | MB/s, whole run (median) | runs | MB/s, last epoch (median) "
        "| MB/s, second half (median) | downloads in flight, mean |",
        "|---|---|---|---|---|---|---|",
    ]
    for link, data in out["links"].items():
        for k, row in data["rows"].items():
            runs = ", ".join(f"{v:.0f}" for v in row["mb_per_s_runs"])
            extra = ""
            if k == "auto":
                extra = f" (K at the end {row['concurrency_end']}, most {row['concurrency_max']})"
            half = f"{row['steady_mb_per_s']:.0f}" if "steady_mb_per_s" in row else ""
            lines.append(
                f"| {link} | {k} | {row['mb_per_s']:.0f} | {runs} | "
                f"{row['last_epoch_mb_per_s']:.0f} | {half} | {row['inflight_mean']:.1f}{extra} |"
            )
    lines.append("")
    for link, data in out["links"].items():
        figures = [("whole run", data), ("last epoch", data["last_epoch"])]
        if "steady" in data:
            figures.append(("second half", data["steady"]))
        for what, verdict in figures:
            within = "within 5%" if verdict["auto_over_best"] >= 0.95 else "NOT within 5%"
            lines.append(
                f"- {link}, {what}: best fixed K = {verdict['best_fixed']}; auto / best = "
                f"**{verdict['auto_over_best']:.3f}** ({within})"
            )
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        spec = json.loads(Path(sys.argv[2]).read_text())
        Path(spec["out"]).write_text(json.dumps(_child(spec)))
        return
    if len(sys.argv) == 3 and sys.argv[1] == "--render":  # a run's JSON, tables again
        saved = json.loads(Path(sys.argv[2]).read_text())
        for link in saved["links"].values():
            link.update(judged(link["rows"]))
        print(render(saved))
        return

    def more(parser: Any) -> None:
        parser.add_argument(
            "--data", default=str(DEFAULT / "real-4000"), help="a packed dataset folder"
        )
        parser.add_argument("--epochs", type=int, default=2, help="epochs a run")
        parser.add_argument("--ks", default=",".join(map(str, KS)), help="fixed K to sweep")
        parser.add_argument("--links", default="fast,slow", help="links to measure")
        parser.add_argument(
            "--slow-latency",
            default="0.020,0.050",
            help="the slow link's first byte delay, low,high seconds",
        )
        parser.add_argument(
            "--slow-rate", type=float, default=90e6, help="the slow link's bytes/s a connection"
        )
        parser.add_argument("--chunk-mib", type=float, help="chunk_bytes in MiB (default 1)")
        parser.add_argument("--window", type=int, help="shards open (default 64)")

    args = arguments(__doc__, more)
    from asyncstream.testing import NetworkProfile

    ks: list[Any] = [int(k) for k in args.ks.split(",")]
    epochs = args.epochs
    rounds = args.repeat
    if args.quick:
        ks, epochs, rounds = [2, 8], 1, 1
    low, high = (float(v) for v in args.slow_latency.split(","))
    profiles = {
        "fast": NetworkProfile(),
        "slow": NetworkProfile(
            first_byte_latency=(low, high), bandwidth_bytes_per_s=args.slow_rate
        ),
    }
    settings: dict[str, Any] = {"seed": 0}
    if args.chunk_mib:
        settings["chunk_bytes"] = int(args.chunk_mib * (1 << 20))
    if args.window:
        settings["window"] = args.window
    data = Path(args.data)
    if args.quick and not data.exists():
        raise SystemExit(f"{data}: no dataset (see bench/RESULTS.md for how to make one)")
    out: dict[str, Any] = {
        **header(),
        "dataset": f"{data.name}",
        "epochs": epochs,
        "repeat": rounds,
        "settings": settings,
        "profiles": {
            name: {"first_byte_s": list(p.first_byte_latency), "rate": p.bandwidth_bytes_per_s}
            for name, p in profiles.items()
        },
        "links": {},
    }
    with tempfile.TemporaryDirectory(prefix="autotune-root-") as tmp:
        url, samples = _place(data, Path(tmp))
        for name in args.links.split(","):
            print(f"{name} link:", flush=True)
            with _link(Path(tmp), profiles[name]) as (endpoint, pinning):
                out["pinning"] = pinning
                out["links"][name] = sweep(
                    url,
                    samples,
                    endpoint,
                    [*ks, "auto"],
                    rounds=rounds,
                    epochs=epochs,
                    stream_settings=settings,
                )
    report(out, render(out), args.json)


if __name__ == "__main__":
    main()
