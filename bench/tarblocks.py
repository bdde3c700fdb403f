"""``python -m bench.tarblocks``: the tar reader's cost at a block's edge.

:class:`~asyncstream.shards._tar.ShardReader` alone over the shards of a packed folder
(``--data``, by default ``bench.feed``'s realistic one: ``python -m bench.feed --parts
real`` makes it) read into memory, fed as the ring hands them in blocks of each size of
``--blocks`` (MiB; by default 1, the default block, and 16), each size in a fresh process,
``--repeat`` passes over every shard, the fastest counted. Reported: the reader's CPU per
sample, members read by the general parser, and the CPU a block's edge costs: the
difference from the largest size, over the extra blocks. ``--writer webdataset`` reads the
same samples as ``webdataset.TarWriter`` writes them (a PAX header before every member).
``--baseline REV`` runs revision ``REV``'s reader beside this tree's, the sides' order
turned every other round; medians over ``--rounds``.

A block's edge cuts a member; the reader keeps that member's bytes until the next block
completes it. With the walk native and no decode, that is what a small block costs the
reader over a large one; what it costs the stream besides (the engine's messages, the
prefetch) is ``python -m bench.localring``'s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
DEFAULT = Path(os.environ.get("ASYNCSTREAM_BENCH_DATA", Path.home() / ".cache/asyncstream-bench"))


def measure(data: str, block: int, repeat: int) -> dict[str, float]:
    """Run in the child: the fastest of ``repeat`` passes over the folder's shards."""
    from asyncstream.shards._tar import ShardReader

    shards = [(p.name, p.read_bytes()) for p in sorted(Path(data).glob("*.tar"))]
    if not shards:
        raise SystemExit(f"{data}: no .tar shard")
    best = float("inf")
    for _ in range(repeat):
        samples = general = blocks = 0
        cpu0 = time.process_time()
        for name, body in shards:
            reader = ShardReader(name, len(body))
            view = memoryview(body)
            for offset in range(0, len(body), block):
                final = offset + block >= len(body)
                samples += len(reader.records(view[offset : offset + block], offset, final=final))
                blocks += 1
            general += reader.general_members
        best = min(best, time.process_time() - cpu0)
    return {"cpu_s": best, "samples": samples, "blocks": blocks, "general": general}


def rewritten(data: Path) -> Path:
    """The samples of ``data``'s shards written again by ``webdataset.TarWriter``, shard
    for shard, into the folder beside it named with ``-wds`` (made once)."""
    import tarfile

    import webdataset

    out = data.with_name(data.name + "-wds")
    if out.is_dir():
        return out
    tmp = data.with_name(data.name + "-wds.tmp")
    tmp.mkdir(exist_ok=True)
    for shard in sorted(data.glob("*.tar")):
        with (
            tarfile.open(shard) as tar,
            webdataset.TarWriter(str(tmp / shard.name)) as sink,
        ):
            sample: dict[str, object] = {}
            for info in tar:
                key, _, ext = info.name.partition(".")
                if sample and sample["__key__"] != key:
                    sink.write(sample)
                    sample = {}
                extracted = tar.extractfile(info)
                if extracted is not None:
                    sample["__key__"] = key
                    sample[ext] = extracted.read()
            if sample:
                sink.write(sample)
    tmp.rename(out)
    return out


def main() -> None:
    sys.path.insert(0, str(ROOT))
    from bench._run import rounds_arguments, side_by_side

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(DEFAULT / "real-4000"), help="a packed folder")
    parser.add_argument("--blocks", default="1,16", help="block sizes in MiB, comma-separated")
    parser.add_argument("--repeat", type=int, default=5, help="passes a run, the fastest kept")
    parser.add_argument(
        "--writer",
        choices=["as-is", "webdataset"],
        default="as-is",
        help="the shards of --data as they are, or the same samples written by "
        "webdataset.TarWriter (a PAX header before every member) into DATA-wds, once",
    )
    args = rounds_arguments(parser, lambda c: measure(c["data"], c["block"], c["repeat"]))
    if args.writer == "webdataset":
        args.data = str(rewritten(Path(args.data)))
    sizes = sorted(int(b) for b in args.blocks.split(","))
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "data": args.data, "runs": {}}
    configs = {
        str(mib): {"data": args.data, "block": mib << 20, "repeat": args.repeat} for mib in sizes
    }
    sides, named = side_by_side(HERE, configs, args.baseline, args.rounds)
    runs = {(side, int(mib)): rows for (side, mib), rows in named.items()}
    print(
        "| side | block | CPU us a sample (rounds) | general members | CPU us a block's edge |"
        "\n|---|---:|---|---:|---:|"
    )
    for side in sides:
        largest = runs[(side, sizes[-1])]
        for mib in sizes:
            rows = runs[(side, mib)]
            per = [r["cpu_s"] / r["samples"] * 1e6 for r in rows]
            # each round's edge cost against the same round's largest block
            edges = [
                (r["cpu_s"] - big["cpu_s"]) / (r["blocks"] - big["blocks"]) * 1e6
                for r, big in zip(rows, largest, strict=True)
                if r["blocks"] > big["blocks"]
            ]
            edge = statistics.median(edges) if edges else None
            out["runs"][f"{side}, {mib} MiB"] = {
                "us_per_sample": statistics.median(per),
                "us_per_edge": edge,
                "rounds": rows,
            }
            spread = ", ".join(f"{p:.2f}" for p in per)
            print(
                f"| {side} | {mib} MiB | {statistics.median(per):.2f} ({spread}) | "
                f"{rows[0]['general']} | {'-' if edge is None else f'{edge:.1f}'} |"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
