"""Stores against each other: the fetch engine reading the same bytes from each store's
emulator, and the gs:// store's direct transport against a ``requests`` client.

Run: ``python -m bench.stores --stores gs,az,web,s3`` (``--quick`` for a smoke run;
``--profile s3-like`` puts the fault proxy, in a process of its own, with 20 to 50 ms to
the first byte and 90 MB/s per connection, in front of every server: the same link for
each store). The same objects (random bytes: raw fetch does not parse them) are uploaded
to each store's local server, each in a process of its own: ``gs``, fake-gcs-server (Go,
:class:`asyncstream.testing.GCSEmulator`); ``web``, :class:`asyncstream.testing.WebServer`
over a folder (``http://`` URLs, named by a brace pattern: the web has no listing);
``az``, Azurite (Node.js, :class:`asyncstream.testing.Azurite`, in memory); ``s3``, moto
(:class:`asyncstream.LocalS3` in process mode). Each ``engine`` row is the
fetch engine reading every chunk into the ring and straight back, K = 8 downloads in
flight, twice on one engine; the second pass counts: MB/s and the engine's CPU seconds per
GB (the client's alone), and the server's CPU seconds per GB (from ``/proc``, over both
passes). The ``requests`` row (``gs`` only) reads the same ranges with the client the
blocking half (and google-cloud-storage's downloads) use, 8 threads with a
``requests.Session`` each, every body then copied into a buffer as a ring slot would need:
what a store built on a synchronous SDK would spend. Rows are interleaved and the best of
``--repeat`` is kept.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from asyncstream import LocalS3, S3Options, configure_store, resolve_shards
from asyncstream.engine._engine import Engine, EngineConfig
from asyncstream.stores._registry import make_store
from asyncstream.stores._store import ChunkRequest, StoreSetup
from asyncstream.testing import Azurite, GCSEmulator

from ._proxy import ProxyProcess
from ._run import arguments, header, report

MB = 1e6
MiB = 1 << 20
INFLIGHT, WINDOW = 8, 8


def cpu_seconds(pid: int | None) -> float:
    """CPU seconds used so far by process ``pid`` (0 for None)."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Served:
    """A store's server with the objects: their prefix, how to reach it, its pid."""

    url: str
    options: S3Options
    pid: int | None
    endpoint: str


# A WebServer in a process of its own (its CPU apart from the benchmark's), until stdin closes.
_WEB = (
    "import sys\n"
    "from asyncstream.testing import WebServer\n"
    "server = WebServer(sys.argv[1]).start()\n"
    "print(server.url, flush=True)\n"
    "sys.stdin.read()\n"
    "server.close()\n"
)


@contextlib.contextmanager
def _linked(endpoint: str, profile: str) -> Iterator[str]:
    """``endpoint``, or the fault proxy in front of it with the link ``profile``."""
    if profile == "loopback":
        yield endpoint
    else:
        with ProxyProcess(endpoint, profile=profile) as proxy:
            yield proxy.endpoint_url


@contextlib.contextmanager
def _web_server(root: Path) -> Iterator[tuple[str, int]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _WEB, str(root)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().decode().strip()
        if not url.startswith("http://"):
            raise RuntimeError("the web server process did not start")
        yield url, proc.pid
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


@contextlib.contextmanager
def serve(store: str, objects: int, size: int, profile: str = "loopback") -> Iterator[Served]:
    """The store's server holding ``objects`` random objects (gs:// configured for it),
    reached through the link ``profile``."""
    if store == "gs":
        with GCSEmulator() as gcs:
            gcs.create_bucket("stores-bench")
            configure_store("gs", **gcs.settings())
            try:
                blobs = make_store("gs", StoreSetup())
                for i in range(objects):
                    blobs.write(f"gs://stores-bench/raw/{i:04d}.tar", os.urandom(size))
                with _linked(gcs.endpoint_url, profile) as endpoint:
                    configure_store("gs", **{**gcs.settings(), "endpoint": endpoint})
                    yield Served("gs://stores-bench/raw/", S3Options(), gcs.pid, endpoint)
            finally:
                configure_store("gs")
    elif store == "az":
        with Azurite(in_memory=True) as azurite:
            azurite.create_container("stores-bench")
            configure_store("az", **azurite.settings())
            try:
                blobs = make_store("az", StoreSetup())
                for i in range(objects):
                    blobs.write(f"az://stores-bench/raw/{i:04d}.tar", os.urandom(size))
                blobs.close()
                origin, _, account = azurite.endpoint_url.rpartition("/")
                with _linked(origin, profile) as endpoint:
                    configure_store("az", **azurite.settings(endpoint=f"{endpoint}/{account}"))
                    yield Served("az://stores-bench/raw/", S3Options(), azurite.pid, endpoint)
            finally:
                configure_store("az")
    elif store == "web":
        with tempfile.TemporaryDirectory(prefix="stores-bench-") as root:
            (Path(root) / "raw").mkdir()
            for i in range(objects):
                (Path(root) / "raw" / f"{i:04d}.tar").write_bytes(os.urandom(size))
            with _web_server(Path(root)) as (url, pid), _linked(url, profile) as endpoint:
                pattern = f"{endpoint}/raw/{{0000..{objects - 1:04d}}}.tar"
                yield Served(pattern, S3Options(), pid, endpoint)
    elif store == "s3":
        with LocalS3(mode="process") as s3:
            client = s3.client()
            client.create_bucket(Bucket="stores-bench")
            for i in range(objects):
                body = os.urandom(size)
                client.put_object(Bucket="stores-bench", Key=f"raw/{i:04d}.tar", Body=body)
            with _linked(s3.endpoint_url, profile) as endpoint:
                options = S3Options(
                    endpoint_url=endpoint, credentials=s3.options().credentials
                ).resolve()
                yield Served("s3://stores-bench/raw/", options, s3.pid, endpoint)
    else:
        raise ValueError(f"unknown store {store!r}: expected gs, az, web or s3")


def _requests_of(url: str, options: S3Options, chunk: int) -> list[ChunkRequest]:
    return [
        ChunkRequest(s.url, o, min(chunk, s.size - o), s.etag, o + chunk >= s.size, s.size)
        for s in resolve_shards(url, options)
        for o in range(0, s.size, chunk)
    ]


def engine_pass(url: str, options: S3Options, chunk: int, pid: int | None) -> dict[str, Any]:
    """Every chunk into the ring and straight back, twice on one engine; the second
    pass counts."""
    requests = _requests_of(url, options, chunk)
    total = sum(r.length for r in requests)
    server0 = cpu_seconds(pid)
    config = EngineConfig(inflight=INFLIGHT, s3=options)
    with Engine(config, n_slots=WINDOW + INFLIGHT, slot_bytes=chunk) as engine:
        for _ in range(2):  # the first pass boots the engine, as a stream's first epoch does
            before = engine.stats()
            start = time.perf_counter()
            engine.submit(requests)
            for _ in requests:
                engine.release(engine.next().slot)
            elapsed = time.perf_counter() - start
            stats = engine.stats()
    return {
        "MB/s": total / elapsed / MB,
        "client_cpu_s_per_gb": (stats["cpu_s"] - before["cpu_s"]) / (total / 1e9),
        "server_cpu_s_per_gb": (cpu_seconds(pid) - server0) / (2 * total / 1e9),
        "transport": stats.get("transport", ""),
    }


def requests_pass(url: str, endpoint: str, chunk: int, pid: int | None) -> dict[str, Any]:
    """The same ranges on ``requests`` (8 threads, a session each), each body copied into
    a slot-sized buffer; the second of two passes counts."""
    import threading

    import requests as http

    ranges = _requests_of(url, S3Options(), chunk)
    total = sum(r.length for r in ranges)
    local = threading.local()

    def read(request: ChunkRequest) -> None:
        session = getattr(local, "session", None) or http.Session()
        local.session = session
        bucket, _, name = request.url[len("gs://") :].partition("/")
        answer = session.get(
            f"{endpoint}/download/storage/v1/b/{bucket}/o/{quote(name, safe='')}",
            params={"alt": "media", "ifGenerationMatch": request.etag},
            headers={"Range": f"bytes={request.offset}-{request.offset + request.length - 1}"},
            timeout=60,
        )
        slot = getattr(local, "slot", None) or bytearray(chunk)
        local.slot = slot
        slot[: len(answer.content)] = answer.content

    server0 = cpu_seconds(pid)
    with ThreadPoolExecutor(INFLIGHT) as pool:
        for _ in range(2):
            cpu0 = time.process_time()
            start = time.perf_counter()
            list(pool.map(read, ranges))
            elapsed = time.perf_counter() - start
            cpu = time.process_time() - cpu0
    return {
        "MB/s": total / elapsed / MB,
        "client_cpu_s_per_gb": cpu / (total / 1e9),
        "server_cpu_s_per_gb": (cpu_seconds(pid) - server0) / (2 * total / 1e9),
        "transport": "requests",
    }


def measure(
    stores: list[str], objects: int, size: int, repeat: int, profile: str = "loopback"
) -> dict[str, Any]:
    """Every row, best of ``repeat``, interleaved: ``{"rows": [...]}``."""
    best: dict[tuple[str, str, int], dict[str, Any]] = {}
    with contextlib.ExitStack() as stack:
        served = {
            store: stack.enter_context(serve(store, objects, size, profile)) for store in stores
        }
        for _ in range(repeat):
            for chunk in (MiB, 16 * MiB):
                for store, at in served.items():
                    rows = [("engine", engine_pass(at.url, at.options, chunk, at.pid))]
                    if store == "gs":
                        rows.append(("requests", requests_pass(at.url, at.endpoint, chunk, at.pid)))
                    for client, figures in rows:
                        key = (store, client, chunk)
                        if key not in best or figures["MB/s"] > best[key]["MB/s"]:
                            best[key] = {
                                "store": store,
                                "client": client,
                                "chunk_MiB": chunk // MiB,
                                **figures,
                            }
    return {"rows": sorted(best.values(), key=lambda r: (r["chunk_MiB"], r["store"]))}


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table."""
    lines = [
        "| store (server) | client | chunk | MB/s | client CPU-s per GB | server CPU-s per GB |",
        "|---|---|---:|---:|---:|---:|",
    ]
    names = {
        "gs": "gs (fake-gcs-server)",
        "az": "az (Azurite)",
        "web": "http (WebServer)",
        "s3": "s3 (moto)",
    }
    for r in rows:
        lines.append(
            f"| {names[r['store']]} | {r['client']} ({r['transport']}) | {r['chunk_MiB']} MiB | "
            f"{r['MB/s']:.0f} | {r['client_cpu_s_per_gb']:.2f} | {r['server_cpu_s_per_gb']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    def more(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--stores",
            default="gs,az,web,s3",
            help="comma-separated: gs (emulator), az (Azurite), web (WebServer), s3 (moto)",
        )
        parser.add_argument(
            "--profile", default="loopback", choices=["loopback", "s3-like"], help="the link"
        )

    args = arguments(__doc__ or "", more)
    objects, size = (4, 16 * MiB) if args.quick else (16, 16 * MiB)
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    out = {**header(), "objects": objects, "object_bytes": size, "profile": args.profile}
    out.update(measure(stores, objects, size, 1 if args.quick else args.repeat, args.profile))
    text = (
        f"{out['date']}, {out['machine']}, {objects} objects of {size // MiB} MiB, "
        f"link: {args.profile}\n\n"
    )
    report(out, text + table(out["rows"]), args.json)


if __name__ == "__main__":
    main()
