"""Scrape a multiprocess Prometheus export during epochs read by ShardLoader workers:
``python tests/_metrics_child.py SPEC OUT``, run with ``PROMETHEUS_MULTIPROC_DIR`` set
(prometheus_client reads it when first imported, so the test starts a fresh process).

SPEC (JSON): ``url``, ``endpoint_url``, ``stream`` (ShardStream keyword arguments),
``workers``, ``epochs``. Each epoch is read through a ShardLoader whose dataset yields each
sample's key and, at the end of a worker's share, that worker's ``stats()``; the export's
endpoint is scraped (an HTTP GET) after the first few samples and after each epoch. OUT
gets the keys read, the workers' stats and the scrapes' text.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from collections.abc import Iterator
from typing import Any

from torch.utils.data import IterableDataset

from asyncstream import ShardLoader, ShardStream, export_prometheus


class KeysThenStats(IterableDataset[Any]):
    """Each sample's key, then the worker's stream statistics at the end of its share."""

    def __init__(self, stream: ShardStream) -> None:
        self.stream = stream

    def __iter__(self) -> Iterator[Any]:
        for sample in self.stream:
            yield sample["__key__"]
        yield {"stats": self.stream.stats()}


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        return str(response.read().decode())


def main(spec_path: str, out_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    out: dict[str, Any] = {"epochs": []}
    stream = ShardStream(spec["url"], endpoint_url=spec["endpoint_url"], **spec["stream"])
    with stream, export_prometheus(stream, port=0, interval=0.05) as export:
        assert export.port is not None
        loader = ShardLoader(KeysThenStats(stream), batch_size=None, num_workers=spec["workers"])
        for _ in range(spec["epochs"]):
            epoch: dict[str, Any] = {"keys": [], "stats": [], "during": None}
            for item in loader:
                if isinstance(item, dict):
                    epoch["stats"].append(item["stats"])
                    continue
                epoch["keys"].append(item)
                if len(epoch["keys"]) == 10:
                    epoch["during"] = scrape(export.port)  # mid-epoch
            epoch["after"] = scrape(export.port)
            out["epochs"].append(epoch)
        out["multiprocess"] = export.multiprocess
        del loader
    with open(out_path, "w") as f:
        json.dump(out, f, default=str)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
