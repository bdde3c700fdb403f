"""Runs inside a private mount namespace whose /dev/shm is a 64 MiB tmpfs
(``tests/test_small_shm.py``): the container default of Docker, and of Kubernetes without
a memory volume. Prints one JSON report on stdout.

* ``shm_bytes``: the size of /dev/shm here (64 MiB);
* ``posix_returncode``: a 160 MiB POSIX segment written in full, in a child of its own
  (the old way: it dies of SIGBUS past 64 MiB);
* ``ring``: an engine process filling a 160 MiB ring (five 32 MiB chunks of a file) and
  the consumer checking every byte;
* ``loader``: ``DALIImageLoader`` on the CPU with 4 ``StatefulDataLoader`` workers, whose
  rings and batch buffers together pass 64 MiB: images, the node's ring bytes, the batch
  buffers mapped, and the errors;
* ``left``: the rings and batch buffers of these processes still alive afterwards.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from _procs import segments

POSIX_FILL = """
import sys
from multiprocessing.shared_memory import SharedMemory
shm = SharedMemory(create=True, size=int(sys.argv[1]))
try:
    shm.buf[:] = b"\\x01" * len(shm.buf)  # tmpfs takes the size, then SIGBUS past its end
finally:
    shm.close()
    shm.unlink()
"""


def posix_fill(nbytes: int) -> int:
    """The exit status of a child writing a POSIX segment of ``nbytes`` in full."""
    return subprocess.run(
        [sys.executable, "-c", POSIX_FILL, str(nbytes)], capture_output=True, check=False
    ).returncode


def fill_ring(path: Path, chunk: int) -> dict[str, Any]:
    """An engine process reads ``path`` in chunks of ``chunk`` bytes into a ring with a
    slot for each: the whole ring written, by the engine; every byte checked here."""
    from asyncstream.engine._engine import Engine, EngineConfig
    from asyncstream.stores._store import ChunkRequest

    data = path.read_bytes()
    n = len(data) // chunk
    with Engine(EngineConfig(inflight=n, hedge=False), n_slots=n, slot_bytes=chunk) as engine:
        ids = engine.submit([ChunkRequest(path.as_uri(), i * chunk, chunk) for i in range(n)])
        readies = [engine.wait(rid) for rid in ids]  # all held at once: every slot full
        same = all(
            bytes(engine.view(r)) == data[i * chunk : (i + 1) * chunk]
            for i, r in enumerate(readies)
        )
        for ready in readies:
            engine.release(ready.slot)
        return {"nbytes": engine.ring.nbytes, "same": same, "engine": engine.pid}


def run_loader(folder: Path) -> dict[str, Any]:
    """One pass of DALIImageLoader with 4 workers over ``folder``."""
    from asyncstream import ShardStream
    from dali_ops import DALIImageLoader, PipelineSettings

    settings = PipelineSettings(image_size=32, num_threads=2, seed=7)
    # 4 MiB blocks (the shards' size): 36 MiB a worker, 144 MiB over the four
    stream = ShardStream(str(folder), window=4, inflight=2, chunk_bytes=4 << 20, seed=0)
    ring_bytes = stream.node_ring_bytes(4, check=False)
    images, pids = 0, set()
    with DALIImageLoader(stream, 16, device="cpu", workers=4, settings=settings) as loader:
        for batch, labels in loader:
            assert batch.shape[0] == labels.shape[0]
            images += batch.shape[0]
            pids |= {p.pid for p in multiprocessing.active_children() if p.pid is not None}
        stats = loader.stats()
    return {
        "images": images,
        "node_ring_bytes": ring_bytes,
        "batch_buffers_bytes": stats["batch_buffers_bytes"],
        "worker_pids": sorted(pids),
    }


def main() -> None:
    config = json.loads(sys.argv[1])  # "parts": a subset of the three (default all)
    st = os.statvfs("/dev/shm")
    report: dict[str, Any] = {"shm_bytes": st.f_blocks * st.f_frsize}
    parts = config.get("parts", ["posix", "ring", "loader"])
    if "posix" in parts:
        report["posix_returncode"] = posix_fill(config["ring_bytes"])
    if "ring" in parts:
        report["ring"] = fill_ring(Path(config["file"]), config["chunk"])
    if "loader" in parts:
        report["loader"] = run_loader(Path(config["shards"]))
    pids = {os.getpid(), report.get("ring", {}).get("engine", 0)}
    pids |= set(report.get("loader", {}).get("worker_pids", []))
    prefixes = tuple(f"asyncstream{kind}-{pid}-" for pid in pids for kind in ("", "-batch"))
    report["left"] = sorted(segments(prefixes))
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
