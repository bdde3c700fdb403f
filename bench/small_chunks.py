"""1 MiB chunks over the S3-like profile: raw fetch, K = 8, ring of 16 slots.

Run: ``python -m bench.small_chunks [--repeat 3]``. To compare with an older tree,
run this file from that tree's folder with it first on the path:
``cd OLD && PYTHONPATH=OLD python /path/to/bench/small_chunks.py`` (it only needs
``asyncstream.LocalS3``, ``bench._proxy.ProxyProcess`` and ``bench.stream.raw_fetch``,
which trees since the direct transport all have). Prints one JSON line: best and every
MB/s, the lowest engine CPU-s per GB, the transport.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from typing import Any

from asyncstream import LocalS3
from bench._proxy import ProxyProcess
from bench.stream import raw_fetch

MiB = 1 << 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="passes; the best counts")
    parser.add_argument(
        "--no-coalesce", action="store_true", help="a GET per chunk (coalesce_bytes=0)"
    )
    args = parser.parse_args()
    # Only when asked: older trees' raw_fetch lacks the option.
    more: dict[str, Any] = {"coalesce_bytes": 0} if args.no_coalesce else {}
    with LocalS3(mode="process") as server:
        client = server.client()
        client.create_bucket(Bucket="small-chunks")
        for i in range(8):
            body = os.urandom(16 * MiB)
            client.put_object(Bucket="small-chunks", Key=f"raw/{i:03d}.tar", Body=body)
        with ProxyProcess(server.endpoint_url, profile="s3-like") as proxy:
            options = dataclasses.replace(server.options(), endpoint_url=proxy.endpoint_url)
            got = [
                raw_fetch("s3://small-chunks/raw/", options, MiB, 8, 8, **more)
                for _ in range(args.repeat)
            ]
    print(
        json.dumps(
            {
                "MB/s": max(g["MB/s"] for g in got),
                "all": [round(g["MB/s"]) for g in got],
                "engine_cpu_s_per_gb": min(g["engine_cpu_s_per_gb"] for g in got),
                "transport": got[0]["transport"],
                "gets_per_pass": got[0].get("requests"),
                "chunks_per_pass": got[0].get("chunks"),
            }
        )
    )


if __name__ == "__main__":
    main()
