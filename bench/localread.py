"""``python -m bench.localread``: a local read on the engine's loop against one in a thread.

What :class:`~asyncstream.stores._localstore.LocalStore` spends on a read of a file the page
cache holds, both ways it can read: on the event loop (``preadv2`` with ``RWF_NOWAIT``,
the default) and handed to the thread pool (the store's loop reads turned off, as on a
file system that refuses the flag). An asyncio loop reads ``--reads`` ranges of
``--mib`` MiB from one file (``--data``'s largest shard, read once beforehand so that it
is cached), ``--inflight`` at a time, into buffers of their own; the figure is the
process's CPU (and wall) time a read, each way in turn, ``--rounds`` times, medians.
``--cold``: the file is evicted from the page cache before each run and each range read
once, so that every read waits for the disk (the loop's way then tries the page cache
first, finds nothing, and reads in a thread).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import mmap
import os
import statistics
import time
from pathlib import Path
from typing import Any

DEFAULT = Path(os.environ.get("ASYNCSTREAM_BENCH_DATA", Path.home() / ".cache/asyncstream-bench"))


def _evict(path: Path) -> None:
    """Drop ``path`` from the page cache (``posix_fadvise``), so that reads go to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def measure(
    path: Path, mib: int, reads: int, inflight: int, inline: bool, cold: bool = False
) -> dict[str, float]:
    """CPU and wall microseconds a read, over ``reads`` reads of ``mib`` MiB; ``cold``:
    the file evicted first, and each range read once, in order (the disk's case)."""
    from asyncstream.stores._localstore import LocalStore
    from asyncstream.stores._store import ChunkRequest

    size = path.stat().st_size
    length = mib << 20
    if size < length:
        raise SystemExit(f"{path}: {size} bytes, less than one read of {mib} MiB")
    spots = size // length
    if cold:
        reads = min(reads, spots)
        _evict(path)
    store = LocalStore()
    store._inline = inline and store._inline
    buffers = mmap.mmap(-1, length * inflight)
    views = [memoryview(buffers)[i * length : (i + 1) * length] for i in range(inflight)]
    url = path.as_uri()

    async def run() -> None:
        free = list(range(inflight))
        gate = asyncio.Semaphore(inflight)

        async def one(i: int) -> None:
            async with gate:
                slot = free.pop()
                request = ChunkRequest(url, (i % spots) * length, length, None, False, size=size)
                await store.read_group(request, [views[slot]], None)
                free.append(slot)

        await asyncio.gather(*(one(i) for i in range(reads)))

    cpu, wall = time.process_time(), time.perf_counter()
    asyncio.run(run())
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    stats = store.stats()
    for view in views:
        view.release()
    buffers.close()
    return {
        "cpu_us_per_read": cpu / reads * 1e6,
        "wall_us_per_read": wall / reads * 1e6,
        "cached_reads": stats["cached_reads"],
        "thread_reads": stats["thread_reads"],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT / "real-4000", help="a folder")
    parser.add_argument("--mib", type=int, default=1, help="MiB a read")
    parser.add_argument("--reads", type=int, default=2000)
    parser.add_argument("--inflight", default="1,8", help="reads at a time, a run each")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--cold",
        action="store_true",
        help="evict the file before each run and read each range once (from the disk)",
    )
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    args = parser.parse_args(argv)
    path = max(args.data.rglob("*.tar*"), key=lambda p: p.stat().st_size)
    if not args.cold:
        path.read_bytes()  # into the page cache
    out: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "file": str(path),
        "mib": args.mib,
        "reads": args.reads,
        "cold": args.cold,
        "runs": {},
    }
    print(
        "| reads in flight | way | CPU us a read (rounds) | wall us a read |\n|---:|---|---|---:|"
    )
    for inflight in (int(n) for n in args.inflight.split(",")):
        for way in ("loop", "thread"):
            rows = [
                measure(path, args.mib, args.reads, inflight, way == "loop", args.cold)
                for _ in range(args.rounds)
            ]
            med = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
            out["runs"][f"{inflight}, {way}"] = {"median": med, "rounds": rows}
            spread = ", ".join(f"{r['cpu_us_per_read']:.0f}" for r in rows)
            print(
                f"| {inflight} | {way} | {med['cpu_us_per_read']:.0f} ({spread}) | "
                f"{med['wall_us_per_read']:.0f} |",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
