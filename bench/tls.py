"""HTTP against HTTPS: raw fetch on both transports, chunks of 1 and 16 MiB, the same server.

Run: ``python -m bench.tls`` (``--quick`` for a smoke run; ``--server s3rver`` for the
second S3 implementation). The same objects (random bytes: raw fetch does not parse them)
are uploaded to two servers of the same software, each in a process of its own: one on a
plain port, one on a TLS port with a certificate made at run time
(:func:`asyncstream.testing.make_test_certificates`). The software is moto (the embedded
server, Python) or s3rver (Node.js, from npm, as the tests run it: ``tests/_s3rver.py``),
whose TLS is OpenSSL driven from C++, so its own cost per byte is far lower than moto's.
Each row is the fetch engine reading every chunk into the ring and straight back, K = 8
downloads in flight, twice on one engine; the second pass counts
(``bench.stream.raw_fetch``): MB/s and the engine's CPU seconds per GB. Rows are
interleaved and the best of ``--repeat`` is kept.

The server shares the cores with the engine here, and TLS costs the server as much as the
client: the HTTPS rows also measure the server's encryption, which a remote store does on
its own machines. The engine's CPU seconds per GB are the client's alone; the server's
(read from ``/proc``, over both passes) show what the server spends on the same bytes.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from asyncstream import LocalS3
from asyncstream.testing import make_test_certificates

from ._run import arguments, header, report
from .stream import raw_fetch

MiB = 1 << 20
CHUNKS = (MiB, 16 * MiB)


Server = Literal["moto", "s3rver"]


@contextlib.contextmanager
def _servers(kind: Server, folder: Path) -> Iterator[dict[str, Any]]:
    """A plain and a TLS server of ``kind``: ``{"http": ..., "https": ...}``."""
    certs = make_test_certificates(folder)
    with contextlib.ExitStack() as stack:
        if kind == "moto":
            plain: Any = stack.enter_context(LocalS3(mode="process"))
            tls: Any = stack.enter_context(
                LocalS3(mode="process", tls=certs.server, ca_bundle=certs.ca)
            )
        else:
            # Test support, not installed: run from the repository, as bench is.
            from tests._s3rver import S3rver

            (folder / "plain").mkdir()
            (folder / "tls").mkdir()
            plain = stack.enter_context(S3rver(folder / "plain"))
            tls = stack.enter_context(S3rver(folder / "tls", tls=certs.server, ca_bundle=certs.ca))
        yield {"http": plain, "https": tls}


def _cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``)."""
    assert pid is not None, "the server runs in a process of its own"
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def upload(server: Any, objects: int, size: int) -> str:
    client = server.client()
    client.create_bucket(Bucket="tls-bench")
    for i in range(objects):
        client.put_object(Bucket="tls-bench", Key=f"raw/{i:04d}.tar", Body=os.urandom(size))
    return "s3://tls-bench/raw/"


def measure(objects: int, size: int, repeat: int, server: Server = "moto") -> dict[str, Any]:
    """Every row (HTTP and HTTPS, both transports, 1 and 16 MiB chunks), best of ``repeat``,
    interleaved: ``{"rows": [...]}``, one dict a row."""
    best: dict[tuple[str, str, int], dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp, _servers(server, Path(tmp)) as servers:
        urls = {scheme: upload(s, objects, size) for scheme, s in servers.items()}
        for _ in range(repeat):
            for chunk in CHUNKS:
                for transport in ("auto", "aiohttp"):
                    for scheme, s3 in servers.items():
                        before = _cpu_seconds(s3.pid)
                        got = raw_fetch(
                            urls[scheme], s3.options(), chunk, 8, 8, transport=transport
                        )
                        # Both passes of raw_fetch move the same bytes.
                        spent = _cpu_seconds(s3.pid) - before
                        got["server_cpu_s_per_gb"] = spent / (2 * objects * size / 1e9)
                        key = (scheme, got["transport"], chunk)
                        if key not in best or got["MB/s"] > best[key]["MB/s"]:
                            best[key] = got
    rows = []
    for chunk in CHUNKS:
        for transport in ("direct", "aiohttp"):
            h, s = best[("http", transport, chunk)], best[("https", transport, chunk)]
            rows.append(
                {
                    "chunk_mib": chunk // MiB,
                    "transport": transport,
                    "http_mb_per_s": h["MB/s"],
                    "https_mb_per_s": s["MB/s"],
                    "http_cpu_s_per_gb": h["engine_cpu_s_per_gb"],
                    "https_cpu_s_per_gb": s["engine_cpu_s_per_gb"],
                    "http_server_cpu_s_per_gb": h["server_cpu_s_per_gb"],
                    "https_server_cpu_s_per_gb": s["server_cpu_s_per_gb"],
                }
            )
    return {
        "server": server,
        "objects": objects,
        "object_mib": size // MiB,
        "repeat": repeat,
        "rows": rows,
    }


def table(result: dict[str, Any]) -> list[str]:
    """The Markdown table of :func:`measure`'s rows."""
    lines = [
        "| chunk | transport | HTTP MB/s | HTTPS MB/s | HTTPS / HTTP "
        "| engine CPU-s per GB, HTTP | HTTPS | server CPU-s per GB, HTTP | HTTPS |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['chunk_mib']} MiB | {r['transport']} | {r['http_mb_per_s']:.0f} "
            f"| {r['https_mb_per_s']:.0f} | {r['https_mb_per_s'] / r['http_mb_per_s']:.2f} "
            f"| {r['http_cpu_s_per_gb']:.2f} | {r['https_cpu_s_per_gb']:.2f} "
            f"| {r['http_server_cpu_s_per_gb']:.2f} | {r['https_server_cpu_s_per_gb']:.2f} |"
        )
    return lines


def main() -> None:
    def more(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--server", choices=("moto", "s3rver"), default="moto", help="the S3 software"
        )

    args = arguments(__doc__ or "", more)
    objects, size = (4, 8 * MiB) if args.quick else (24, 16 * MiB)
    result = measure(objects, size, args.repeat, args.server)
    out = {**header(), **result}
    lines = [
        f"{out['machine']}; {args.server}; {objects} objects of {size // MiB} MiB; K = 8; best of "
        f"{args.repeat}; {out['date']}.",
        "",
        *table(result),
    ]
    report(out, "\n".join(lines), args.json)


if __name__ == "__main__":
    main()
