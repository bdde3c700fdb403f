"""``python -m bench.samplecost``: a ShardStream's CPU per sample in the consumer, before and after.

Reads one dataset with ``ShardStream(url, window=16, inflight=8, chunk_bytes=8 MiB,
seed=0)`` (``--defaults``: the library's, ``ShardStream(url, seed=0)``), without decode,
for ``--epochs`` epochs of one stream (the engine kept), and reports the epochs after the
first: the consumer process's CPU per sample (``time.process_time``; the fetch engine
runs in a process of its own and is reported apart), samples/s, the time the garbage
collector took and the consumer's minor page faults per sample. The default dataset is the feed
proxy's (``python -m bench.feed --parts proxy`` makes it: 20,000 samples of a 32 x 32 JPEG,
a class and a JSON line, in 8 MiB shards), where what the stream adds per sample shows.

``--many`` reads instead 16,000 generated photographs (about 107 kB each) in 16 MiB
shards, 106 of them, made once (:func:`bench.feed.real_shards`): over 64 shards, so that
the default window's 64 lanes are open, as in a real dataset's epoch (``real-4000``'s 7
shards open 7), and with the library's 1 MiB blocks a lane empties every 9 samples or so:
what the stream pays per block and per lane shows.

``--steps`` also times the consumer's steps in process (``time.thread_time`` around
each of :data:`STEPS`, those the revision has; nested steps count in their callers too,
and each timing adds about 1 µs to its call): µs a sample, calls an epoch and µs a call,
medians over the rounds. The rest of the figures of a run with ``--steps`` carry that
overhead: compare them with another ``--steps`` run only.

``--webdataset`` adds webdataset's own plain iteration of the same local shards (the
``iter`` path; it reads the files in its process, so its CPU is compared with the
consumer's and the engine's together).

Two paths (``--paths``): ``iter``, plain iteration (a dict of ``bytes`` per sample), and
``take``, ``iter_views().take(256, sink)`` with a sink that keeps nothing (the records
handed out of the ring in bulk, as the DALI loader's producer takes them).

``--s3`` reads the same shards from the embedded S3 server too (moto in a child process,
over loopback). ``--baseline REV`` runs git revision ``REV``'s ``asyncstream`` (``git
archive`` into a temporary folder) in the same rounds, alternately with today's: each side
is a fresh process per round, and each figure the median over ``--rounds`` rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
DEFAULT = Path(os.environ.get("ASYNCSTREAM_BENCH_DATA", Path.home() / ".cache/asyncstream-bench"))
SETTINGS = {"window": 16, "inflight": 8, "chunk_bytes": 8 << 20, "seed": 0}
STEPS = {
    # what an epoch does per block of a lane, per run of draws, per ranking
    "serve a need (open, refill, close; prefetch)": "asyncstream.stream._run:EpochRun._serve",
    "load a chunk": "asyncstream.stream._lanes:ChunkReader.load",
    "index a chunk (the tar reader)": "asyncstream.shards._tar:ShardReader.records",
    "wait for a chunk": "asyncstream.engine._engine:Engine.wait",
    "ask for chunks": "asyncstream.engine._engine:Engine.submit",
    "prefetch": "asyncstream.stream._run:EpochRun._prefetch",
    "rank the chunks to prefetch": "asyncstream.stream._run:soonest",
    "the lanes' places (per run of draws)": "asyncstream.stream._run:lane_places",
    "the shuffle's need": "asyncstream.order._shuffle:WindowShuffle.need",
    "a run of draws": "asyncstream.order._shuffle:WindowShuffle.draw_many",
}


def _time_steps() -> dict[str, list[float]]:
    """Wrap each of :data:`STEPS` this revision has with a timer: ``{step: [seconds,
    calls]}``, cumulative."""
    import importlib

    spent: dict[str, list[float]] = {}
    for step, where in STEPS.items():
        module_name, _, path = where.partition(":")
        owner: Any = importlib.import_module(module_name)
        *parents, name = path.split(".")
        for parent in parents:
            owner = getattr(owner, parent, None)
        if owner is None or not hasattr(owner, name):
            continue
        spent[step] = cell = [0.0, 0.0]
        setattr(owner, name, _timed(getattr(owner, name), cell))
    return spent


def _timed(function: Any, cell: list[float]) -> Any:
    clock = time.thread_time

    def timed(*args: Any, **kwargs: Any) -> Any:
        began = clock()
        try:
            return function(*args, **kwargs)
        finally:
            cell[0] += clock() - began
            cell[1] += 1

    return timed


def _drain(stream: Any, path: str) -> int:
    """One epoch of ``stream`` by ``path``; the samples read."""
    if path == "iter":
        return sum(1 for _ in stream)

    def sink(_view: memoryview, _url: str, _record: Any) -> bool:
        return True

    samples, views = 0, stream.iter_views()
    while taken := views.take(256, sink):
        samples += taken
    return samples


def measure(
    url: str,
    endpoint: str | None,
    epochs: int,
    path: str = "iter",
    defaults: bool = False,
    steps: bool = False,
) -> dict[str, Any]:
    """Run in the child: the stream's figures over ``epochs`` epochs, first one apart."""
    import gc
    import resource

    spent = _time_steps() if steps else {}

    from asyncstream import S3Options, ShardStream

    kwargs: dict[str, Any] = {"seed": 0} if defaults else dict(SETTINGS)
    if endpoint is not None:
        from asyncstream.testing._local import LOCAL_CREDENTIALS

        kwargs["s3"] = S3Options(endpoint_url=endpoint, credentials=LOCAL_CREDENTIALS)
    collecting = [0.0, 0.0]  # when the running collection began, seconds collecting

    def timer(phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            collecting[0] = time.process_time()
        else:
            collecting[1] += time.process_time() - collecting[0]

    gc.callbacks.append(timer)
    rows = []
    with ShardStream(url, index_cache=False, **kwargs) as stream:
        seen = 0.0
        for epoch in range(epochs):
            stream.set_epoch(epoch)
            for cell in spent.values():
                cell[:] = [0.0, 0.0]
            collecting[1] = 0.0
            cpu0, wall0 = time.process_time(), time.perf_counter()
            faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            samples = _drain(stream, path)
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0
            # The engine's CPU is cumulative, and a new epoch's statistics have none
            # until it runs: this epoch's is the difference from the last epoch's end.
            total = float(stream.stats()["fetch"]["cpu_s"])
            engine, seen = total - seen, total
            rows.append(
                {
                    "samples": samples,
                    "consumer_us_per_sample": cpu / samples * 1e6,
                    "gc_us_per_sample": collecting[1] / samples * 1e6,
                    "engine_us_per_sample": engine / samples * 1e6,
                    "minor_faults_per_sample": faults / samples,
                    "samples/s": samples / wall,
                    **{
                        f"step: {step}": [
                            seconds / samples * 1e6,
                            calls,
                            seconds / calls * 1e6 if calls else 0.0,
                        ]
                        for step, (seconds, calls) in spent.items()
                    },
                }
            )
    return _medians(rows[1:] or rows)


def _medians(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over ``rows`` (a step's three figures each apart; a step
    only some rows have, over those)."""
    keys = dict.fromkeys(key for row in rows for key in row)
    out: dict[str, Any] = {}
    for key in keys:
        values = [row[key] for row in rows if key in row]
        if isinstance(values[0], list):
            out[key] = [statistics.median(v[i] for v in values) for i in range(len(values[0]))]
        else:
            out[key] = statistics.median(values)
    return out


def measure_webdataset(url: str, epochs: int) -> dict[str, Any]:
    """Run in the child: webdataset's own plain iteration over the same local shards
    (``WebDataset(urls, shardshuffle=False)``, a dict of ``bytes`` per sample, in order),
    its figures as :func:`measure`'s; it reads the files in this process, so its CPU
    holds what the fetch engine's does for asyncstream."""
    import glob
    import resource

    import webdataset

    urls = sorted(glob.glob(os.path.join(url, "*.tar")))
    rows = []
    for _ in range(epochs):
        cpu0, wall0 = time.process_time(), time.perf_counter()
        faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        samples = sum(1 for _ in webdataset.WebDataset(urls, shardshuffle=False, empty_check=False))
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0
        rows.append(
            {
                "samples": samples,
                "consumer_us_per_sample": cpu / samples * 1e6,
                "gc_us_per_sample": 0.0,
                "engine_us_per_sample": 0.0,
                "minor_faults_per_sample": faults / samples,
                "samples/s": samples / wall,
            }
        )
    steady = rows[1:] or rows
    return {key: statistics.median(r[key] for r in steady) for key in steady[0]}


def _side(
    source: Path,
    url: str,
    endpoint: str | None,
    epochs: int,
    path: str,
    defaults: bool,
    peer: str | None = None,
    steps: bool = False,
) -> dict[str, Any]:
    """One fresh process reading with the ``asyncstream`` found in ``source`` (or, with
    ``peer``, with that library)."""
    from bench._run import run_child

    config: dict[str, Any] = {"url": url, "endpoint": endpoint, "epochs": epochs, "path": path}
    if defaults:
        config["defaults"] = True
    if peer:
        config["peer"] = peer
    if steps:
        config["steps"] = True
    return run_child(HERE, config, source)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=str(DEFAULT / "tiny-20000"), help="a local folder")
    parser.add_argument("--s3", action="store_true", help="also from the embedded S3 server")
    parser.add_argument("--baseline", help="a git revision to compare with, in the same rounds")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--paths", default="iter,take", help="iter, take or both")
    parser.add_argument(
        "--webdataset",
        action="store_true",
        help="also webdataset's own plain iteration over the same local shards (iter only)",
    )
    parser.add_argument(
        "--defaults",
        action="store_true",
        help="the library's defaults (ShardStream(url, seed=0)) instead of the settings above",
    )
    parser.add_argument(
        "--many",
        action="store_true",
        help="16,000 generated photographs in 16 MiB shards (64 lanes open), made once, "
        "instead of --url",
    )
    parser.add_argument(
        "--steps", action="store_true", help="also time the consumer's steps in process"
    )
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.many and not args.child:
        from bench.feed import real_shards

        args.url = str(real_shards(DEFAULT, 16000, 16))
    if args.child:
        config = json.loads(args.child)
        if config.get("peer") == "webdataset":
            print(json.dumps(measure_webdataset(config["url"], config["epochs"])))
            return
        figures = measure(
            config["url"],
            config["endpoint"],
            config["epochs"],
            config["path"],
            config.get("defaults", False),
            config.get("steps", False),
        )
        print(json.dumps(figures))
        return
    out: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "settings": "defaults" if args.defaults else SETTINGS,
        "url": args.url,
    }
    with tempfile.TemporaryDirectory() as tmp, _server(args.s3) as server:
        sides = {"after": ROOT}
        if args.baseline:
            from bench._run import baseline_tree

            sides = {"before": baseline_tree(args.baseline, Path(tmp)), **sides}
        sources = [("local files", args.url, None)]
        if server is not None:
            sources.append(("S3, loopback", _upload(server, Path(args.url)), server.endpoint_url))
        for name, url, endpoint in sources:
            out[name] = {}
            for path in args.paths.split(","):
                here = dict(sides)
                if args.webdataset and path == "iter" and endpoint is None:
                    here["webdataset"] = ROOT
                runs: dict[str, list[dict[str, Any]]] = {side: [] for side in here}
                for round_ in range(args.rounds):
                    order = list(here) if round_ % 2 == 0 else list(reversed(here))
                    for side in order:
                        peer = "webdataset" if side == "webdataset" else None
                        runs[side].append(
                            _side(
                                here[side],
                                url,
                                endpoint,
                                args.epochs,
                                path,
                                args.defaults,
                                peer,
                                args.steps and peer is None,
                            )
                        )
                        print(f"{name}, {path}, round {round_}, {side}: {runs[side][-1]}")
                out[name][path] = {side: _medians(rows) for side, rows in runs.items()}
    print(render(out))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


class _server:
    """The embedded S3 server while the rounds run, or nothing."""

    def __init__(self, wanted: bool) -> None:
        self.wanted = wanted
        self.server: Any = None

    def __enter__(self) -> Any:
        if self.wanted:
            from asyncstream import LocalS3

            self.server = LocalS3(mode="process").__enter__()
        return self.server

    def __exit__(self, *exc: object) -> None:
        if self.server is not None:
            self.server.__exit__(*exc)


def _upload(server: Any, folder: Path) -> str:
    client = server.client()
    client.create_bucket(Bucket="samplecost")
    for path in sorted(folder.iterdir()):
        if path.suffix in (".tar", ".json"):
            client.put_object(Bucket="samplecost", Key=f"d/{path.name}", Body=path.read_bytes())
    return "s3://samplecost/d/"


def render(out: dict[str, Any]) -> str:
    lines = [
        f"{out['machine']}; {out['url']}; {out['date']}.",
        "",
        "| from | path | side | consumer µs/sample | of it, GC | minor faults/sample "
        "| engine µs/sample | samples/s |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for name in ("local files", "S3, loopback"):
        for path, sides in out.get(name, {}).items():
            for side, r in sides.items():
                lines.append(
                    f"| {name} | {path} | {side} | {r['consumer_us_per_sample']:.1f} | "
                    f"{r['gc_us_per_sample']:.1f} | {r.get('minor_faults_per_sample', 0):.2f} | "
                    f"{r['engine_us_per_sample']:.1f} | "
                    f"{r['samples/s']:,.0f} |"
                )
    steps = [
        (name, path, side, key.removeprefix("step: "), figures)
        for name in ("local files", "S3, loopback")
        for path, sides in out.get(name, {}).items()
        for side, r in sides.items()
        for key, figures in r.items()
        if key.startswith("step: ")
    ]
    if steps:
        lines += [
            "",
            "| from | path | side | step | µs/sample | calls/epoch | µs/call |",
            "|---|---|---|---|---:|---:|---:|",
        ]
        lines += [
            f"| {name} | {path} | {side} | {step} | {us:.2f} | {calls:,.0f} | {per:.1f} |"
            for name, path, side, step, (us, calls, per) in steps
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
