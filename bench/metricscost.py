"""``python -m bench.metricscost``: the CPU one metrics scrape costs the training process.

A stream reads the feed proxy's tiny shards (``bench.feed``'s, made once); its metrics are
exported in process (``export_prometheus(stream, port=0)``) and scraped ``--scrapes`` times
in a row by another process (as a Prometheus server scrapes), ``--batches`` times: this
process's CPU (``time.process_time``) per scrape is the collection and the HTTP answer.
Then ``stream.stats()`` in the reader's thread, ``--scrapes`` times: the engine round trip
that an exporter's reading asks of the reader at its next chunk. Each figure the median
over the batches.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from asyncstream import ShardStream, export_prometheus
from bench.feed import DEFAULT_DATA, tiny_shards

_CLIENT = """
import sys, urllib.request
for _ in range(int(sys.argv[2])):
    with urllib.request.urlopen(sys.argv[1], timeout=30) as response:
        response.read()
"""


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--tiny", type=int, default=20_000)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    args = parser.parse_args(argv)
    from prometheus_client import CollectorRegistry

    args.data.mkdir(parents=True, exist_ok=True)
    shards = tiny_shards(args.data, args.tiny)
    scrapes: list[float] = []
    trips: list[float] = []
    with ShardStream(str(shards), window=16, inflight=8, chunk_bytes=8 << 20, seed=0) as stream:
        export = export_prometheus(stream, port=0, registry=CollectorRegistry())
        samples = iter(stream)
        for _ in range(min(5000, args.tiny // 2)):  # mid-epoch: the engine and ring live
            next(samples)
        url = f"http://127.0.0.1:{export.port}/metrics"
        for _ in range(args.batches):
            started = time.process_time()
            subprocess.run([sys.executable, "-c", _CLIENT, url, str(args.scrapes)], check=True)
            scrapes.append((time.process_time() - started) / args.scrapes * 1e6)
            started = time.thread_time()
            for _ in range(args.scrapes):
                stream.stats()
            trips.append((time.thread_time() - started) / args.scrapes * 1e6)
        export.close()
    out = {"scrape_us": statistics.median(scrapes), "round_trip_us": statistics.median(trips)}
    print(
        f"one scrape (collection + HTTP answer): {out['scrape_us']:.0f} us of this process's "
        f"CPU ({', '.join(f'{v:.0f}' for v in scrapes)}); the reader's engine round trip: "
        f"{out['round_trip_us']:.0f} us ({', '.join(f'{v:.0f}' for v in trips)})"
    )
    return out


if __name__ == "__main__":
    main()
