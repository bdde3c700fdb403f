"""asyncstream's loader, one epoch without decode, in a process of its own.

The harness runs ``python -m bench.loader CONFIG_JSON OUT_JSON`` so that asyncstream is
measured as the peers are (:mod:`bench.peers`): its own interpreter, its own CPU and
peak memory. It reads one epoch of a :class:`~asyncstream.ShardStream` from the start
of the process (engine start-up included), and writes the same figures a peer does:
samples, seconds, samples/s, MB/s, time to first sample, CPU seconds (this process and
its engine), peak RSS (this process plus its engine), shared memory (the ring), and the
emitted keys and labels (for shuffle quality), under the keys of a peer's read result
(``bench/peers/run.py``).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any


def _status(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def read_epoch(config: dict[str, Any]) -> dict[str, Any]:
    """One epoch; ``config``: url, endpoint_url, stream (keyword arguments of ShardStream),
    epochs (default 1: the first epoch, start-up included, as the peers are measured; with
    more, the last one is measured, on the engine kept from the epochs before: the steady
    state of training, as raw fetch's second pass is)."""
    from asyncstream import S3Options, ShardStream

    rss_start = _status("VmRSS")
    started = time.perf_counter()  # as for the peers: from the dataset's construction

    # Credentials come from the environment (the standard AWS chain), never the config.
    options = S3Options(endpoint_url=config.get("endpoint_url"))
    epochs = int(config.get("epochs", 1))
    cpu0 = time.process_time()
    before: dict[str, Any] = {}
    with ShardStream(config["url"], s3=options, **config.get("stream", {})) as stream:
        for epoch in range(epochs):
            keys: list[str] = []
            labels: list[int] = []
            nbytes = 0
            first = None
            if epoch:
                before = stream.stats().get("fetch", {})
                stream.set_epoch(epoch)
                started, cpu0 = time.perf_counter(), time.process_time()
            for sample in stream:
                if first is None:
                    first = time.perf_counter() - started
                keys.append(sample["__key__"])
                labels.append(int(sample["cls"]))
                nbytes += len(sample["jpg"]) + len(sample["cls"])
            seconds = time.perf_counter() - started
        fetch = stream.stats().get("fetch", {})
        ring = stream.ring_bytes
    cpu = time.process_time() - cpu0

    def delta(name: str) -> float:
        return float(fetch.get(name, 0)) - float(before.get(name, 0))

    return {
        "phase": "read",
        "epochs": epochs,
        "samples": len(keys),
        "bytes": nbytes,
        "seconds": seconds,
        "samples_per_s": len(keys) / seconds,
        "mb_per_s": nbytes / seconds / 1e6,
        "first_sample_s": first,
        "cpu_s": cpu + delta("cpu_s"),
        "peak_rss_bytes": _status("VmHWM") + int(fetch.get("max_rss_bytes", 0)),
        "rss_start_bytes": rss_start,
        "shm_bytes": ring,
        # Counters of the measured epoch (the engine's add up over its life).
        "retries": int(delta("retries_total")),
        "hedged": int(delta("hedged")),
        "hedge_wins": int(delta("hedge_wins")),
        "throttle_cuts": int(delta("throttle_cuts")),
        "chunks": int(delta("chunks")),
        "requests": int(delta("requests")),
        "fetch": fetch,
        "keys": keys,
        "labels": labels,
        "settings": config.get("stream", {}),
    }


def main() -> None:
    config = json.loads(Path(sys.argv[1]).read_text())
    Path(sys.argv[2]).write_text(json.dumps(read_epoch(config)))


if __name__ == "__main__":
    main()
