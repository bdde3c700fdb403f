"""HTTP against HTTPS: raw fetch on both transports, chunks of 1 and 16 MiB, the same server.

Run: ``python -m bench.tls`` (``--quick`` for a smoke run). The same objects (random
bytes: raw fetch does not parse them) are uploaded to two embedded S3 servers, moto in a
process of its own each: one on a plain port, one on a TLS port with a certificate made
at run time (:func:`asyncstream.testing.make_test_certificates`). Each row is the fetch
engine reading every chunk into the ring and straight back, K = 8 downloads in flight,
twice on one engine; the second pass counts (``bench.stream.raw_fetch``): MB/s and the
engine's CPU seconds per GB. Rows are interleaved and the best of ``--repeat`` is kept.

The server shares the 2 cores with the engine here, and TLS costs the server as much as
the client: the HTTPS rows also measure moto's encryption, which a remote store does on
its own machines.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from asyncstream import LocalS3
from asyncstream.testing import make_test_certificates

from ._run import arguments, header, report
from .stream import raw_fetch

MiB = 1 << 20


def upload(server: LocalS3, objects: int, size: int) -> str:
    client = server.client()
    client.create_bucket(Bucket="tls-bench")
    for i in range(objects):
        client.put_object(Bucket="tls-bench", Key=f"raw/{i:04d}.tar", Body=os.urandom(size))
    return "s3://tls-bench/raw/"


def main() -> None:
    args = arguments(__doc__ or "")
    objects, size = (4, 8 * MiB) if args.quick else (24, 16 * MiB)
    chunks = (MiB, 16 * MiB)
    rows: dict[tuple[str, str, int], dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        certs = make_test_certificates(Path(tmp))
        with (
            LocalS3(mode="process") as plain,
            LocalS3(mode="process", tls=certs.server, ca_bundle=certs.ca) as tls,
        ):
            servers = {"http": plain, "https": tls}
            urls = {scheme: upload(s, objects, size) for scheme, s in servers.items()}
            for _ in range(args.repeat):
                for chunk in chunks:
                    for transport in ("auto", "aiohttp"):
                        for scheme, server in servers.items():
                            got = raw_fetch(
                                urls[scheme], server.options(), chunk, 8, 8, transport=transport
                            )
                            key = (scheme, got["transport"], chunk)
                            if key not in rows or got["MB/s"] > rows[key]["MB/s"]:
                                rows[key] = got
    out = {**header(), "GB": objects * size / 1e9, "rows": {str(k): v for k, v in rows.items()}}
    lines = [
        f"{out['machine']}; {objects} objects of {size // MiB} MiB; K = 8; best of "
        f"{args.repeat}; {out['date']}.",
        "",
        "| chunk | transport | HTTP MB/s | HTTPS MB/s | HTTPS / HTTP "
        "| engine CPU-s per GB, HTTP | HTTPS |",
        "|---|---|---|---|---|---|---|",
    ]
    for chunk in chunks:
        for transport in ("direct", "aiohttp"):
            h, s = rows[("http", transport, chunk)], rows[("https", transport, chunk)]
            lines.append(
                f"| {chunk // MiB} MiB | {transport} | {h['MB/s']:.0f} | {s['MB/s']:.0f} "
                f"| {s['MB/s'] / h['MB/s']:.2f} | {h['engine_cpu_s_per_gb']:.2f} "
                f"| {s['engine_cpu_s_per_gb']:.2f} |"
            )
    report(out, "\n".join(lines), args.json)


if __name__ == "__main__":
    main()
