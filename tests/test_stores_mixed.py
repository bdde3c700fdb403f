"""One stream mixing sources in four stores at once: S3 (moto), Google Cloud Storage
(fake-gcs-server), Azure Blob (Azurite) and a web server over HTTPS, each source's shards
written by other tools than ``pack``. Every sample of every source once, with its bytes,
each store named in the statistics, a checkpoint that resumes exactly, and the disk
cache serving a second epoch from all four."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from asyncstream import CacheConfig, LocalS3, ShardStream, Source, configure_store
from asyncstream.stores._registry import make_store
from asyncstream.stores._store import StoreSetup
from asyncstream.testing import Azurite, GCSEmulator, TestCertificates, WebServer
from tests._foreign import ForeignShards, write_foreign_shards

STORES = ("s3", "gs", "az", "web")


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ForeignShards]:
    """Three small foreign shards per store, each store's keys of their own prefix."""
    root = tmp_path_factory.mktemp("mixed")
    return {
        store: write_foreign_shards(
            root / store, 3, seed=11 + i, samples=(6, 12), jpg_bytes=(100, 2000), prefix=store
        )
        for i, store in enumerate(STORES)
    }


@pytest.fixture(scope="module")
def sources(
    datasets: dict[str, ForeignShards],
    s3_server: LocalS3,
    gcs_emulator: GCSEmulator,
    azurite: Azurite,
    web_servers: dict[str, WebServer],
    web_data: Any,
) -> Iterator[list[Source]]:
    """Each dataset in its store; the sources of one stream over all four."""
    shards = {store: sorted(data.folder.glob("*.tar")) for store, data in datasets.items()}
    client = s3_server.client()
    client.create_bucket(Bucket="mixed")
    for path in shards["s3"]:
        client.put_object(Bucket="mixed", Key=f"s3/{path.name}", Body=path.read_bytes())
    gcs_emulator.create_bucket("mixed")
    azurite.create_container("mixed")
    configure_store("gs", **gcs_emulator.settings())
    configure_store("az", **azurite.settings())
    try:
        for scheme in ("gs", "az"):
            store = make_store(scheme, StoreSetup())
            for path in shards[scheme]:
                store.write(f"{scheme}://mixed/{scheme}/{path.name}", path.read_bytes())
            store.close()
        served = Path(web_data.root) / "mixed"
        served.mkdir(exist_ok=True)
        for path in shards["web"]:
            (served / path.name).write_bytes(path.read_bytes())
        web = web_servers["https"].url
        urls = {
            "s3": "s3://mixed/s3/",
            "gs": "gs://mixed/gs/",
            "az": "az://mixed/az/",
            "web": f"{web}/mixed/web-{{00000..00002}}.tar",
        }
        # Each source's own size a share: every sample once an epoch.
        yield [
            Source(
                urls[store],
                name=store,
                samples=sum(datasets[store].counts),
                samples_per_shard=datasets[store].counts,
                s3=s3_server.options() if store == "s3" else None,
            )
            for store in STORES
        ]
    finally:
        configure_store("gs")
        configure_store("az")


def _expected(datasets: dict[str, ForeignShards]) -> dict[tuple[str, str], bytes]:
    """(source, key) -> the sample's jpg bytes, as webdataset reads the same shards."""
    from tests._wds import wds_samples

    return {
        (store, sample["__key__"]): sample["jpg"]
        for store, data in datasets.items()
        for path in sorted(data.folder.glob("*.tar"))
        for sample in wds_samples(path.read_bytes(), path.name)
    }


@pytest.fixture
def stores_configured(
    gcs_emulator: GCSEmulator, azurite: Azurite, certs: TestCertificates
) -> Iterator[None]:
    configure_store("gs", **gcs_emulator.settings())
    configure_store("az", **azurite.settings())
    configure_store("https", ca_bundle=certs.ca)  # the web server's test CA
    yield
    for scheme in ("gs", "az", "https"):
        configure_store(scheme)


def test_one_stream_reads_four_stores_at_once(
    sources: list[Source], datasets: dict[str, ForeignShards], stores_configured: None
) -> None:
    with ShardStream(sources, window=4, seed=3, inflight=4) as stream:
        got = [(s["__source__"], s["__key__"], bytes(s["jpg"])) for s in stream]
        fetch = stream.stats()["fetch"]
    expected = _expected(datasets)
    assert len(got) == len(expected)  # each once
    assert {(source, key): jpg for source, key, jpg in got} == expected
    assert {source for source, _, _ in got[: len(got) // 2]} == set(STORES)  # mixed throughout
    # Each store's own statistics, named by its scheme.
    assert sorted(s["scheme"] for s in fetch["stores"]) == ["az", "gs", "https", "s3"]
    own = {s["scheme"]: s for s in fetch["stores"]}
    assert own["az"]["store"] == "azure-blob"
    assert "Google Cloud Storage" in own["gs"]["store"]
    assert all(s["connections_opened"] >= 1 for s in fetch["stores"])


def test_a_mixed_stream_of_four_stores_resumes_exactly(
    sources: list[Source], stores_configured: None
) -> None:
    with ShardStream(sources, window=4, seed=9, inflight=4) as stream:
        it = iter(stream)
        head = [(s["__source__"], s["__key__"]) for s in (next(it) for _ in range(17))]
        state = json.loads(json.dumps(stream.state_dict()))
        rest = [(s["__source__"], s["__key__"]) for s in it]
    with ShardStream(sources, window=4, seed=9, inflight=4) as stream:
        stream.load_state_dict(state)
        resumed = [(s["__source__"], s["__key__"]) for s in stream]
    assert resumed == rest
    assert len(set(head + rest)) == len(head) + len(rest)


def test_dataloader_workers_read_four_stores_and_resume_exactly(
    sources: list[Source], datasets: dict[str, ForeignShards], stores_configured: None
) -> None:
    """Two StatefulDataLoader workers, each with its own engine reaching all four stores
    (the stores' settings reach the workers' engines too): saved mid-epoch, resumed by a
    new loader, every sample once."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    from tests._resume_child import keys

    def loader(stream: ShardStream) -> StatefulDataLoader:
        return StatefulDataLoader(stream, batch_size=4, num_workers=2, collate_fn=keys)

    with ShardStream(sources, window=4, seed=2, inflight=2) as stream:
        first = loader(stream)
        it = iter(first)
        head = [k for _ in range(5) for k in next(it)]
        state = json.loads(json.dumps(first.state_dict()))
        rest = [k for batch in it for k in batch]
        del it, first
    with ShardStream(sources, window=4, seed=2, inflight=2) as stream:
        again = loader(stream)
        again.load_state_dict(state)
        resumed = [k for batch in again for k in batch]
        del again
    assert resumed == rest
    assert sorted(head + rest) == sorted(key for _, key in _expected(datasets))


def test_the_disk_cache_serves_a_second_epoch_from_four_stores(
    sources: list[Source], stores_configured: None, tmp_path: Path
) -> None:
    cache = CacheConfig(path=tmp_path / "cache")
    epochs = []
    for _ in range(2):
        with ShardStream(sources, window=4, seed=5, inflight=4, cache=cache) as stream:
            keys = [(s["__source__"], s["__key__"]) for s in stream]
            stores = {s["scheme"]: s["cache"] for s in stream.stats()["fetch"]["stores"]}
        epochs.append((keys, stores))
    (cold, cold_cache), (warm, warm_cache) = epochs
    assert warm == cold
    assert set(cold_cache) == {"az", "gs", "https", "s3"}
    assert all(c["hits"] == 0 and c["misses"] > 0 for c in cold_cache.values())
    assert all(warm_cache[s]["misses"] == 0 for s in warm_cache)
    assert all(warm_cache[s]["hits"] == cold_cache[s]["misses"] for s in warm_cache)
