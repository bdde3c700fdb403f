"""``python -m bench.firstsample``: time to the first sample from a fresh process.

What a training script pays before its first step: a fresh Python process, with torch
already imported (a training script has it), imports the reader, opens the dataset and
draws its first sample. Each system runs in a process of its own, in interleaved rounds,
and each figure is the median over ``--rounds``:

* ``asyncstream``: ``ShardStream(urls, samples_per_shard=counts)`` over the shards named
  one by one (no listing, no index to read), then ``next(iter(stream))``;
* ``naive``: what anyone writes first (:mod:`bench.peers.naive`): boto3's ``get_object`` of
  the first shard in the seeded order, read with ``tarfile`` up to its first sample (on
  local files, ``tarfile.open`` of the path).

Two sources: local files, and the embedded S3 server (moto in a process of its own) behind
a fault proxy with the S3-like profile (20 to 50 ms to the first byte, 90 MB/s), so each
request costs what it costs against a real store. ``--baseline REV`` runs git revision
``REV``'s ``asyncstream`` (``git archive``) in the same rounds, as ``asyncstream@REV``.

Reported: ``import_s`` (the reader's import), ``open_s`` (the constructor, or the client
and the request), ``first_sample_s`` (from before the import to the first sample: the sum).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
DEFAULT = Path(os.environ.get("ASYNCSTREAM_BENCH_DATA", Path.home() / ".cache/asyncstream-bench"))
SHARDS = 12
SEED = 0


def _child(spec: dict[str, Any]) -> dict[str, Any]:
    """In the fresh process: torch first (not timed), then the system's first sample."""
    import torch  # noqa: F401  # a training script has it imported already

    began = time.perf_counter()
    if spec["system"] == "naive":
        import boto3

        imported = time.perf_counter()
        first = random.Random(SEED).sample(spec["urls"], len(spec["urls"]))[0]
        if spec["endpoint"] is None:
            source: Any = open(first, "rb")  # noqa: SIM115  # closed below
        else:
            client = boto3.client("s3", endpoint_url=spec["endpoint"])
            bucket, key = first[len("s3://") :].split("/", 1)
            source = client.get_object(Bucket=bucket, Key=key)["Body"]
        opened = time.perf_counter()
        with tarfile.open(fileobj=source, mode="r|") as archive:
            member = archive.next()
            assert member is not None
            handle = archive.extractfile(member)
            assert handle is not None
            handle.read()
        source.close()
        key_of_first = member.name.split(".", 1)[0]
    else:
        from asyncstream import ShardStream

        imported = time.perf_counter()
        stream = ShardStream(
            spec["urls"],
            samples_per_shard=spec["counts"],
            endpoint_url=spec["endpoint"],
            seed=SEED,
            index_cache=False,
        )
        opened = time.perf_counter()
        key_of_first = next(iter(stream))["__key__"]
    done = time.perf_counter()
    if spec["system"] != "naive":
        stream.close()
    return {
        "import_s": imported - began,
        "open_s": opened - imported,
        "first_sample_s": done - began,
        "key": key_of_first,
    }


def measure(
    local: list[str],
    counts: list[int],
    s3: tuple[list[str], str] | None,
    *,
    rounds: int,
    sources: dict[str, Path],
    env: dict[str, str],
) -> dict[str, Any]:
    """Every system from every source, ``rounds`` interleaved rounds; medians.

    Args:
        local: the shards' paths.
        counts: their samples.
        s3: the same shards' URLs on the server, and the endpoint to reach them, or None.
        rounds: rounds (each system once per round, the order turned every other round).
        sources: the ``asyncstream`` trees to measure, by name (``asyncstream`` for this
            tree; ``asyncstream@REV`` for a baseline).
        env: the children's environment (credentials for the server).
    """
    from ._run import run_child  # the parent's side only: the child runs as a script

    places: list[tuple[str, list[str], str | None]] = [("local files", local, None)]
    if s3 is not None:
        places.append(("S3-like", s3[0], s3[1]))
    out: dict[str, Any] = {}
    for place, urls, endpoint in places:
        systems = [*sources, "naive"]
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in systems}
        for round_ in range(rounds):
            for name in systems if round_ % 2 == 0 else reversed(systems):
                spec = {
                    "system": "naive" if name == "naive" else "asyncstream",
                    "urls": urls,
                    "counts": counts,
                    "endpoint": endpoint,
                }
                runs[name].append(run_child(HERE, spec, sources.get(name, ROOT), env))
        out[place] = {
            name: {
                key: statistics.median(r[key] for r in rows)
                for key in ("import_s", "open_s", "first_sample_s")
            }
            for name, rows in runs.items()
        }
    return out


def shards_of(folder: Path, n: int = SHARDS) -> tuple[list[Path], list[int]]:
    """The first ``n`` tar shards of ``folder`` and their samples (counted here)."""
    from asyncstream.shards._compressed import count_samples

    paths = sorted(folder.glob("*.tar"))[:n]
    if len(paths) < n:
        raise SystemExit(f"{folder} holds {len(paths)} tar shards; {n} are needed")
    counts = []
    for path in paths:
        with open(path, "rb") as f:
            counts.append(count_samples(f, str(path), path.stat().st_size))
    return paths, counts


def render(out: dict[str, Any]) -> str:
    """The figures as a Markdown table."""
    lines = [
        "| from | system | import s | open s | first sample s |",
        "|---|---|---:|---:|---:|",
    ]
    for place in ("local files", "S3-like"):
        for name, r in out.get(place, {}).items():
            lines.append(
                f"| {place} | {name} | {r['import_s']:.2f} | {r['open_s']:.2f} "
                f"| {r['first_sample_s']:.2f} |"
            )
    return "\n".join(lines)


def run(
    folder: Path, *, rounds: int, baseline: str | None, s3: bool, shards: int = SHARDS
) -> dict[str, Any]:
    """The whole measurement on ``folder``'s first ``shards`` shards (see the module)."""
    from asyncstream import LocalS3
    from asyncstream.testing import FaultProxy, NetworkProfile
    from asyncstream.testing._local import LOCAL_CREDENTIALS

    from ._run import baseline_tree, precompile

    paths, counts = shards_of(folder, shards)
    env = dict(os.environ)
    env["AWS_ACCESS_KEY_ID"] = LOCAL_CREDENTIALS.access_key_id
    env["AWS_SECRET_ACCESS_KEY"] = LOCAL_CREDENTIALS.secret_access_key
    env.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    out: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "shards": len(paths),
        "samples": sum(counts),
        "rounds": rounds,
    }
    with tempfile.TemporaryDirectory() as tmp:
        sources = {"asyncstream": ROOT}
        if baseline:
            sources[f"asyncstream@{baseline}"] = baseline_tree(baseline, Path(tmp))
        precompile(*sources.values())  # each tree's bytecode, as an install writes it
        local = [str(p) for p in paths]
        if not s3:
            out["results"] = measure(local, counts, None, rounds=rounds, sources=sources, env=env)
            return out
        with LocalS3(mode="process") as server:
            client = server.client()
            client.create_bucket(Bucket="firstsample")
            for path in paths:
                client.put_object(Bucket="firstsample", Key=path.name, Body=path.read_bytes())
            urls = [f"s3://firstsample/{p.name}" for p in paths]
            with FaultProxy(server.endpoint_url, profile=NetworkProfile.s3_like()) as proxy:
                out["results"] = measure(
                    local,
                    counts,
                    (urls, proxy.endpoint_url),
                    rounds=rounds,
                    sources=sources,
                    env=env,
                )
    return out


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(DEFAULT / "real-20000"), help="a folder of shards")
    parser.add_argument("--shards", type=int, default=SHARDS)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", help="a git revision to compare with, in the same rounds")
    parser.add_argument("--no-s3", action="store_true", help="local files only")
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(json.loads(args.child))))
        return None
    out = run(
        Path(args.data),
        rounds=args.rounds,
        baseline=args.baseline,
        s3=not args.no_s3,
        shards=args.shards,
    )
    print(f"{out['machine']}; {out['shards']} shards, {out['samples']} samples; {out['date']}.")
    print(render(out["results"]))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
