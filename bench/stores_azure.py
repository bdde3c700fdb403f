"""The Azure Blob store against the S3 store, and its read client against the SDK's.

Run: ``python -m bench.stores_azure`` (``--quick`` for a small run, ``--json PATH`` for
every figure). Starts Azurite (in memory, ``asyncstream.testing.Azurite``) and moto
(``LocalS3``) on loopback and puts the same random blobs on both.

Figures, best of ``--repeat`` (interleaved):
  * **engine**: MB/s and CPU seconds per GB of the fetch engine's process reading every
    chunk of the blobs into its ring (``Engine``, K = ``--inflight``): the Azure store
    from Azurite, the S3 store from moto;
  * **client**: the same ranged reads in this process, K at once into K buffers, by the
    Azure store's own client (the direct transport the engine uses) and by the SDK's
    ``azure.storage.blob.aio`` client (``download_blob(offset, length).readinto``):
    the choice the store made, measured.

Servers and client share the 2 cores: MB/s is bounded by the servers (Azurite is
Node.js, moto Python); CPU seconds per GB is the client's own cost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable
from typing import IO, Any, cast

from asyncstream import LocalS3
from asyncstream.engine._engine import Engine, EngineConfig
from asyncstream.shards._urls import Shard
from asyncstream.stores._azure import AzureConfig
from asyncstream.stores._azurestore import AzureStore
from asyncstream.stores._registry import configure_store, make_store
from asyncstream.stores._store import ChunkRequest, StoreSetup
from asyncstream.testing import Azurite

from .fetch import requests_for

MB = 1e6


def make_data(azurite: Azurite, s3: LocalS3, blobs: int, blob_bytes: int) -> tuple[str, str]:
    """The same random blobs in Azurite's ``bench`` container and moto's ``bench`` bucket."""
    from azure.storage.blob import BlobServiceClient

    settings = azurite.settings()
    service = BlobServiceClient(
        azurite.endpoint_url,
        credential={"account_name": settings["account"], "account_key": settings["key"]},
    )
    container = service.get_container_client("bench")
    container.create_container()
    client = s3.client()
    client.create_bucket(Bucket="bench")
    rng = random.Random(0)
    for i in range(blobs):
        data = rng.randbytes(blob_bytes)
        container.upload_blob(f"raw/blob-{i:04d}", data, max_concurrency=4)
        client.put_object(Bucket="bench", Key=f"raw/blob-{i:04d}", Body=data)
    service.close()
    return "az://bench/raw/", "s3://bench/raw/"


def run_engine(
    name: str, config: EngineConfig, shards: list[Shard], chunk: int, inflight: int
) -> dict[str, Any]:
    requests = requests_for(shards, chunk)
    total = sum(r.length for r in requests)
    with Engine(config, n_slots=inflight + 2, slot_bytes=chunk) as engine:
        cpu0 = engine.stats()["cpu_s"]  # after start-up (imports)
        start = time.perf_counter()
        engine.submit(requests)
        for _ in requests:
            engine.release(engine.next().slot)
        elapsed = time.perf_counter() - start
        stats = engine.stats()
    return {
        "row": f"engine: {name}",
        "MB/s": total / elapsed / MB,
        "cpu_s_per_GB": (stats["cpu_s"] - cpu0) / (total / 1e9),
        "bytes": total,
        "requests": stats["requests"],
        "connections_opened": stats.get("connections_opened"),
        "retries": stats["retries_total"],
    }


class _Into:
    """A writable stream over a buffer (what the SDK's ``readinto`` writes to)."""

    def __init__(self, view: memoryview) -> None:
        self.view, self.at = view, 0

    def write(self, data: bytes) -> int:
        self.view[self.at : self.at + len(data)] = data
        self.at += len(data)
        return len(data)

    def writable(self) -> bool:
        return True


async def _clients(
    name: str,
    read: Callable[[ChunkRequest, memoryview], Awaitable[None]],
    requests: list[ChunkRequest],
    chunk: int,
    inflight: int,
) -> dict[str, Any]:
    free: asyncio.Queue[memoryview] = asyncio.Queue()
    for _ in range(inflight):
        free.put_nowait(memoryview(bytearray(chunk)))

    async def one(request: ChunkRequest) -> None:
        view = await free.get()
        try:
            await read(request, view)
        finally:
            free.put_nowait(view)

    total = sum(r.length for r in requests)
    cpu0, start = time.process_time(), time.perf_counter()
    await asyncio.gather(*(one(r) for r in requests))
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu0
    return {
        "row": f"client: {name}",
        "MB/s": total / elapsed / MB,
        "cpu_s_per_GB": cpu / (total / 1e9),
        "bytes": total,
    }


async def _direct(
    config: AzureConfig, requests: list[ChunkRequest], chunk: int, k: int
) -> dict[str, Any]:
    store = AzureStore(config, connections=k)
    await store.open()

    async def read(request: ChunkRequest, view: memoryview) -> None:
        await store.read_into(request, view)

    try:
        await read(requests[0], memoryview(bytearray(chunk)))  # the SAS made, as in the engine
        return await _clients("Azure store's direct transport", read, requests, chunk, k)
    finally:
        await store.aclose()
        store.close()


async def _sdk(
    azurite: Azurite, requests: list[ChunkRequest], chunk: int, k: int
) -> dict[str, Any]:
    from azure.core import MatchConditions
    from azure.storage.blob.aio import BlobServiceClient

    settings = azurite.settings()
    credential = {"account_name": settings["account"], "account_key": settings["key"]}
    async with BlobServiceClient(azurite.endpoint_url, credential=credential) as service:

        async def read(request: ChunkRequest, view: memoryview) -> None:
            container, _, key = request.url.removeprefix("az://").partition("/")
            blob = service.get_blob_client(container, key)
            download = await blob.download_blob(
                offset=request.offset,
                length=request.length,
                max_concurrency=1,
                etag=request.etag,
                match_condition=MatchConditions.IfNotModified,
            )
            await download.readinto(cast(IO[bytes], _Into(view[: request.length])))

        await read(requests[0], memoryview(bytearray(chunk)))  # the connection pool warm
        return await _clients("SDK azure.storage.blob.aio", read, requests, chunk, k)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blobs", type=int, default=16)
    parser.add_argument("--blob-mib", type=int, default=16)
    parser.add_argument("--chunk-mib", type=int, default=8)
    parser.add_argument("--inflight", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="4 blobs of 4 MiB, once")
    parser.add_argument("--json", help="write every figure here")
    args = parser.parse_args()
    if args.quick:
        args.blobs, args.blob_mib, args.chunk_mib, args.repeat = 4, 4, 1, 1
    import uvloop

    chunk, k = args.chunk_mib << 20, args.inflight
    rows: dict[str, list[dict[str, Any]]] = {}
    with Azurite(in_memory=True) as azurite, LocalS3() as s3:
        az_url, s3_url = make_data(azurite, s3, args.blobs, args.blob_mib << 20)
        configure_store("az", **azurite.settings())
        store = make_store("az", StoreSetup())
        az_shards = store.list(az_url)
        store.close()
        s3_shards = make_store("s3", StoreSetup(options=s3.options())).list(s3_url)
        az_requests = requests_for(az_shards, chunk)
        config = AzureConfig.resolve(azurite.settings(), {})
        for _ in range(args.repeat):
            for row in (
                run_engine("Azure store, Azurite", EngineConfig(inflight=k), az_shards, chunk, k),
                run_engine(
                    "S3 store, moto", EngineConfig(inflight=k, s3=s3.options()), s3_shards, chunk, k
                ),
                uvloop.run(_direct(config, az_requests, chunk, k)),
                uvloop.run(_sdk(azurite, az_requests, chunk, k)),
            ):
                rows.setdefault(row["row"], []).append(row)
        configure_store("az")
    best = [max(found, key=lambda r: r["MB/s"]) for found in rows.values()]
    size = args.blobs * args.blob_mib
    print(
        f"{args.blobs} blobs of {args.blob_mib} MiB ({size} MiB), {args.chunk_mib} MiB chunks, "
        f"K = {k}, best of {args.repeat}\n"
    )
    print("| reader | MB/s | CPU s/GB |\n|---|---:|---:|")
    for row in best:
        print(f"| {row['row']} | {row['MB/s']:.0f} | {row['cpu_s_per_GB']:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
