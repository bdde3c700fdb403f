"""HTTP against HTTPS: raw fetch on both transports, chunks of 1 and 16 MiB, the same server.

Run: ``python -m bench.tls`` (``--quick`` for a smoke run; ``--server s3rver`` for the
second S3 implementation; ``--server nginx`` for the store off the reader's cores). The
same objects (random bytes: raw fetch does not parse them) are uploaded to two servers of
the same software, each in a process of its own: one on a plain port, one on a TLS port
with a certificate made at run time (:func:`asyncstream.testing.make_test_certificates`).
The software is moto (the embedded server, Python) or s3rver (Node.js, from npm:
:class:`asyncstream.testing.S3rver`), whose TLS is OpenSSL driven from C++, so its own
cost per byte is far lower than moto's; or nginx, one process serving both ports.
Each row is the fetch engine reading every chunk into the ring and straight back, K = 8
downloads in flight, twice on one engine; the second pass counts
(``bench.stream.raw_fetch``): MB/s and the engine's CPU seconds per GB. Rows are
interleaved and the best of ``--repeat`` is kept.

The server shares the cores with the engine here, and TLS costs the server as much as the
client: the HTTPS rows also measure the server's encryption, which a remote store does on
its own machines. Not so with ``--server nginx`` (:class:`asyncstream.testing.Nginx`, C,
path-style S3 from files): one nginx serves both ports, pinned to a CPU of its own while
this process and the engines it starts run on the others (as ``python -m bench
--profile nginx`` pins them), and over ``--network s3-like`` it makes the link itself (its
first-byte delay and per-connection rate, no proxy), so both rows cost the reader's cores
only the reader's work. The engine's CPU seconds per GB are the client's alone; the server's
(read from ``/proc``, over both passes) show what the server spends on the same bytes.

``--rcvlowat`` measures each row twice, interleaved: with the engine's receive mark (the
default: the kernel wakes the reader for 1 MiB of a body at a time, ``SO_RCVLOWAT``; see
``asyncstream.stores._httpconn.receive_from``) and without (``ASYNCSTREAM_RCVLOWAT=0``
in the engines' environment), a ``mark`` column telling them apart.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from asyncstream import LocalS3, S3Options
from asyncstream.testing import FaultProxy, NetworkProfile, make_test_certificates

from ._run import arguments, header, report
from .stream import raw_fetch

MiB = 1 << 20
CHUNKS = (MiB, 16 * MiB)


Server = Literal["moto", "s3rver", "nginx"]
Network = Literal["loopback", "s3-like"]


@dataclass
class _Endpoint:
    """What one scheme's rows read: the S3 options, the URL, and the pid whose CPU counts
    as the server's (None where the server side runs in this process)."""

    options: S3Options
    url: str
    pid: int | None


def _server(kind: Server, folder: Path, tls: tuple[str, str] | None, ca: str | None) -> Any:
    if kind == "moto":
        return LocalS3(mode="process", tls=tls, ca_bundle=ca)
    from asyncstream.testing import S3rver

    folder.mkdir()
    return S3rver(folder, tls=tls, ca_bundle=ca)


@contextlib.contextmanager
def _endpoints(
    kind: Server, network: Network, folder: Path, objects: int, size: int
) -> Iterator[dict[str, _Endpoint]]:
    """``{"http": ..., "https": ...}``. On loopback, a plain and a TLS server of ``kind``,
    each holding the objects. Over the S3-like network, one plain server behind two fault
    proxies with :meth:`NetworkProfile.s3_like` (20 to 50 ms to first byte, 90 MB/s per
    connection): a plain one and one that speaks TLS to the engine."""
    certs = make_test_certificates(folder)
    if kind == "nginx":
        with _nginx(network, folder, certs.server, certs.ca, objects, size) as ends:
            yield ends
        return
    with contextlib.ExitStack() as stack:
        plain = stack.enter_context(_server(kind, folder / "plain", None, None))
        url = upload(plain, objects, size)
        if network == "loopback":
            tls = stack.enter_context(_server(kind, folder / "tls", certs.server, certs.ca))
            upload(tls, objects, size)
            yield {
                "http": _Endpoint(plain.options(), url, plain.pid),
                "https": _Endpoint(tls.options(), url, tls.pid),
            }
            return
        profile = NetworkProfile.s3_like()
        http = stack.enter_context(FaultProxy(plain.endpoint_url, profile=profile))
        https = stack.enter_context(
            FaultProxy(plain.endpoint_url, profile=profile, tls=certs.server)
        )
        options = plain.options()
        yield {
            "http": _Endpoint(replace(options, endpoint_url=http.endpoint_url), url, None),
            "https": _Endpoint(
                replace(options, endpoint_url=https.endpoint_url, ca_bundle=certs.ca), url, None
            ),
        }


@contextlib.contextmanager
def _nginx(
    network: Network, folder: Path, tls: tuple[str, str], ca: str, objects: int, size: int
) -> Iterator[dict[str, _Endpoint]]:
    """One nginx serving the objects from files on a plain and a TLS port, pinned to the
    last CPU, this process (and every engine it starts) to the others meanwhile."""
    from asyncstream.testing import Nginx

    from ._nginx import _cpus

    raw = folder / "root" / "tls-bench" / "raw"
    raw.mkdir(parents=True)
    for i in range(objects):
        (raw / f"{i:04d}.tar").write_bytes(os.urandom(size))
    profile = NetworkProfile.s3_like() if network == "s3-like" else None
    server_cpu, reader_cpus = _cpus()
    before = os.sched_getaffinity(0)
    with Nginx(folder / "root", tls=tls, ca_bundle=ca, profile=profile, cpu=server_cpu) as nginx:
        os.sched_setaffinity(0, reader_cpus)
        try:
            url = "s3://tls-bench/raw/"
            yield {
                "http": _Endpoint(nginx.options(), url, nginx.pid),
                "https": _Endpoint(nginx.options(https=True), url, nginx.pid),
            }
        finally:
            os.sched_setaffinity(0, before)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def upload(server: Any, objects: int, size: int) -> str:
    client = server.client()
    client.create_bucket(Bucket="tls-bench")
    for i in range(objects):
        client.put_object(Bucket="tls-bench", Key=f"raw/{i:04d}.tar", Body=os.urandom(size))
    return "s3://tls-bench/raw/"


def measure(
    objects: int,
    size: int,
    repeat: int,
    server: Server = "moto",
    network: Network = "loopback",
    marks: tuple[str, ...] = ("on",),
) -> dict[str, Any]:
    """Every row (HTTP and HTTPS, both transports, 1 and 16 MiB chunks; with the receive
    mark ``"on"`` and ``"off"``, as ``marks`` asks), best of ``repeat``, interleaved:
    ``{"rows": [...]}``, one dict a row."""
    best: dict[tuple[str, str, int, str], dict[str, Any]] = {}
    with (
        tempfile.TemporaryDirectory() as tmp,
        _endpoints(server, network, Path(tmp), objects, size) as endpoints,
    ):
        for _ in range(repeat):
            for chunk in CHUNKS:
                for transport in ("auto", "aiohttp"):
                    for scheme, end in endpoints.items():
                        for mark in marks:
                            got = _fetch(end, chunk, transport, mark, objects * size)
                            key = (scheme, got["transport"], chunk, mark)
                            if key not in best or got["MB/s"] > best[key]["MB/s"]:
                                best[key] = got
    rows = []
    for chunk in CHUNKS:
        for transport in ("direct", "aiohttp"):
            for mark in marks:
                h, s = (
                    best[("http", transport, chunk, mark)],
                    best[("https", transport, chunk, mark)],
                )
                rows.append(
                    {
                        "chunk_mib": chunk // MiB,
                        "transport": transport,
                        "mark": mark,
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
        "network": network,
        "objects": objects,
        "object_mib": size // MiB,
        "repeat": repeat,
        "rows": rows,
    }


def _fetch(
    end: _Endpoint, chunk: int, transport: Literal["auto", "aiohttp"], mark: str, nbytes: int
) -> dict[str, Any]:
    """One raw fetch of ``end``'s objects, its engine with the receive mark ``mark``."""
    saved = os.environ.get("ASYNCSTREAM_RCVLOWAT")
    if mark == "off":
        os.environ["ASYNCSTREAM_RCVLOWAT"] = "0"  # read by the engine process at its start
    else:
        os.environ.pop("ASYNCSTREAM_RCVLOWAT", None)
    try:
        before = None if end.pid is None else _cpu_seconds(end.pid)
        got = raw_fetch(end.url, end.options, chunk, 8, 8, transport=transport)
        got["server_cpu_s_per_gb"] = None  # unknown: the proxies run here
        if end.pid is not None and before is not None:
            # Both passes of raw_fetch move the same bytes.
            spent = _cpu_seconds(end.pid) - before
            got["server_cpu_s_per_gb"] = spent / (2 * nbytes / 1e9)
        return got
    finally:
        if saved is None:
            os.environ.pop("ASYNCSTREAM_RCVLOWAT", None)
        else:
            os.environ["ASYNCSTREAM_RCVLOWAT"] = saved


def table(result: dict[str, Any]) -> list[str]:
    """The Markdown table of :func:`measure`'s rows."""
    lines = [
        "| chunk | transport | mark | HTTP MB/s | HTTPS MB/s | HTTPS / HTTP "
        "| engine CPU-s per GB, HTTP | HTTPS | server CPU-s per GB, HTTP | HTTPS |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['chunk_mib']} MiB | {r['transport']} | {r.get('mark', 'on')} "
            f"| {r['http_mb_per_s']:.0f} "
            f"| {r['https_mb_per_s']:.0f} | {r['https_mb_per_s'] / r['http_mb_per_s']:.2f} "
            f"| {r['http_cpu_s_per_gb']:.2f} | {r['https_cpu_s_per_gb']:.2f} "
            f"| {_cpu(r['http_server_cpu_s_per_gb'])} | {_cpu(r['https_server_cpu_s_per_gb'])} |"
        )
    return lines


def _cpu(seconds_per_gb: float | None) -> str:
    return "n/a" if seconds_per_gb is None else f"{seconds_per_gb:.2f}"


def main() -> None:
    def more(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--server",
            choices=("moto", "s3rver", "nginx"),
            default="moto",
            help="the S3 software (nginx: path-style from files, pinned to a CPU of its own)",
        )
        parser.add_argument(
            "--network",
            choices=("loopback", "s3-like"),
            default="loopback",
            help="loopback: a plain and a TLS server, unshaped; s3-like: one plain server "
            "behind a plain and a TLS proxy with the S3-like profile (nginx: its own "
            "first-byte delay and rate on both ports, no proxy)",
        )
        parser.add_argument(
            "--rcvlowat",
            action="store_true",
            help="each row with the engine's receive mark and without (ASYNCSTREAM_RCVLOWAT=0)",
        )

    args = arguments(__doc__ or "", more)
    objects, size = (4, 8 * MiB) if args.quick else (24, 16 * MiB)
    marks = ("on", "off") if args.rcvlowat else ("on",)
    result = measure(objects, size, args.repeat, args.server, args.network, marks)
    out = {**header(), **result}
    lines = [
        f"{out['machine']}; {args.server}, {args.network}; {objects} objects of "
        f"{size // MiB} MiB; K = 8; best of {args.repeat}; {out['date']}.",
        "",
        *table(result),
    ]
    report(out, "\n".join(lines), args.json)


if __name__ == "__main__":
    main()
