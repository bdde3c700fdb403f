"""Metrics export: Prometheus (a real scrape endpoint, in process and in the multiprocess
directory mode with ShardLoader workers) and OpenTelemetry (an in-memory reader), each
checked against the readers' own ``stats()`` for the epochs they read. No timing is
asserted: only that what the endpoint says adds up to what was read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from asyncstream import (
    LocalS3,
    ShardStream,
    export_opentelemetry,
    export_prometheus,
)
from asyncstream.metrics._names import FAMILIES, readings
from asyncstream.metrics._tally import Tally
from asyncstream.testing import Fault, FaultProxy
from tests._foreign import ForeignShards, write_foreign_shards

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
HERE = Path(__file__).parent
COUNTS = [23, 31, 17, 29]
# No hedges: a hedged chunk is asked twice, and these tests compare counts exactly.
STREAM: dict[str, Any] = {
    "window": 3,
    "inflight": 2,
    "chunk_bytes": 16 << 10,
    "seed": 7,
    "hedge": False,
    "samples_per_shard": COUNTS,
}


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> ForeignShards:
    return write_foreign_shards(tmp_path_factory.mktemp("metrics"), 0, counts=COUNTS)


@pytest.fixture
def url(s3_server: LocalS3, bucket: str, shards: ForeignShards) -> str:
    client = s3_server.client()
    for path in sorted(shards.folder.glob("*.tar")):
        client.put_object(Bucket=bucket, Key=f"d/{path.name}", Body=path.read_bytes())
    return f"s3://{bucket}/d/"


def scrape(port: int) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """GET the endpoint; each sample's value by name and labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        return parse(response.read().decode())


def parse(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(sorted(sample.labels.items()))
            out.setdefault(sample.name, {})[labels] = sample.value
    return out


def total(scraped: dict[str, dict[Any, float]], name: str, **where: str) -> float:
    """The sum of ``name``'s series whose labels include ``where``."""
    return sum(
        value
        for labels, value in scraped.get(name, {}).items()
        if all(dict(labels).get(k) == v for k, v in where.items())
    )


def test_a_scrape_in_process_is_what_the_stream_read(
    s3_server: LocalS3, url: str, proxy: FaultProxy
) -> None:
    from tests._servers import FAST_RETRY

    proxy.inject(Fault.SLOWDOWN, count=2, match=".tar")
    proxy.inject(Fault.INTERNAL_ERROR, count=1, match=".tar")
    with ShardStream(url, endpoint_url=proxy.endpoint_url, retry=FAST_RETRY, **STREAM) as stream:
        with export_prometheus(stream, port=0) as export:
            assert export.port
            assert not export.multiprocess
            before = scrape(export.port)  # before any iteration: no engine yet
            assert total(before, "asyncstream_samples_total") == 0
            read = 0
            for epoch in range(2):
                for n, _ in enumerate(stream, 1):
                    read += 1
                    if n == 40:
                        during = scrape(export.port)
                        assert total(during, "asyncstream_samples_total") == read
                after = scrape(export.port)
                stats = stream.stats()
                fetch = stats["fetch"]
                assert total(after, "asyncstream_samples_total") == read == 100 * (epoch + 1)
                assert total(after, "asyncstream_epoch") == epoch
                for name, key in [
                    ("asyncstream_fetch_bytes_total", "bytes"),
                    ("asyncstream_fetch_requests_total", "requests"),
                    ("asyncstream_fetch_chunks_total", "chunks"),
                    ("asyncstream_fetch_hedges_total", "hedged"),
                    ("asyncstream_fetch_throttle_cuts_total", "throttle_cuts"),
                ]:
                    assert total(after, name, rank="0", worker="0") == fetch[key], name
                retries = {
                    dict(labels)["cause"]: value
                    for labels, value in after["asyncstream_fetch_retries_total"].items()
                }
                assert retries == fetch["retries"]
                assert sum(retries.values()) == 3
                store = fetch["stores"][0]
                assert (
                    total(after, "asyncstream_store_connections_opened_total", store="s3")
                    == store["connections_opened"]
                )
                assert after["asyncstream_ring_slots"]
                assert 0 <= total(after, "asyncstream_stall_share") <= 1
        # closed: unregistered, the port no longer served
        with pytest.raises(OSError, match=r"[Rr]efused"):
            scrape(export.port)


def test_shard_loader_workers_add_up_in_the_multiprocess_directory(
    s3_server: LocalS3, url: str, tmp_path: Path
) -> None:
    prom_dir = tmp_path / "prom"
    prom_dir.mkdir()
    spec = {
        "url": url,
        "endpoint_url": s3_server.endpoint_url,
        "stream": STREAM,
        "workers": 2,
        "epochs": 2,
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(prom_dir)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE.parent), env.get("PYTHONPATH")]))
    subprocess.run(
        [
            sys.executable,
            str(HERE / "_metrics_child.py"),
            str(tmp_path / "spec.json"),
            str(tmp_path / "out.json"),
        ],
        check=True,
        env=env,
        timeout=300,
    )
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["multiprocess"]
    samples = bytes_ = requests = chunks = 0.0
    for epoch in out["epochs"]:
        assert len(epoch["keys"]) == len(set(epoch["keys"])) == 100
        assert len(epoch["stats"]) == 2  # one per worker
        during = parse(epoch["during"])
        assert total(during, "asyncstream_samples_total") <= samples + 100
        after = parse(epoch["after"])
        samples += sum(stats["samples"] for stats in epoch["stats"])
        assert total(after, "asyncstream_samples_total") == samples
        # Each epoch's workers are new processes (not persistent), each with a new
        # engine: the totals are the sum of every worker's engine, epoch after epoch.
        bytes_ += sum(stats["fetch"]["bytes"] for stats in epoch["stats"])
        requests += sum(stats["fetch"]["requests"] for stats in epoch["stats"])
        chunks += sum(stats["fetch"]["chunks"] for stats in epoch["stats"])
        assert total(after, "asyncstream_fetch_bytes_total") == bytes_
        assert total(after, "asyncstream_fetch_requests_total") == requests
        assert total(after, "asyncstream_fetch_chunks_total") == chunks
        workers = {dict(labels)["worker"] for labels in after["asyncstream_samples_total"]}
        assert workers == {"0", "1"}
        for worker in ("0", "1"):
            assert total(after, "asyncstream_fetch_bytes_total", worker=worker) > 0
    assert samples == 200


def test_opentelemetry_in_memory_reader_sees_what_the_stream_read(
    url: str, s3_server: LocalS3, tmp_path: Path
) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    cache = {"cache_dir": str(tmp_path / "cache")}
    with ShardStream(url, endpoint_url=s3_server.endpoint_url, **STREAM, **cache) as stream:
        export = export_opentelemetry(stream, meter_provider=provider)
        for _ in range(2):  # the second epoch from the cache
            assert sum(1 for _ in stream) == 100
        stats = stream.stats()
        points = observed(reader)
        export.close()
        assert observed(reader) == {}  # closed: observes nothing
    fetch = stats["fetch"]
    assert points["asyncstream_samples"] == {(("rank", "0"), ("worker", "0")): 200}
    assert sum(points["asyncstream_fetch_bytes"].values()) == fetch["bytes"]
    assert sum(points["asyncstream_fetch_requests"].values()) == fetch["requests"]
    cached = fetch["stores"][0]["cache"]
    assert cached["hits"] > 0
    store = (("rank", "0"), ("store", "s3"), ("worker", "0"))
    assert points["asyncstream_cache_hits"] == {store: cached["hits"]}
    assert points["asyncstream_cache_misses"] == {store: cached["misses"]}
    provider.shutdown()


def observed(reader: Any) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Every data point the reader collects now, by instrument and attributes."""
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data is not None else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    labels = tuple(sorted((k, str(v)) for k, v in point.attributes.items()))
                    out.setdefault(metric.name, {})[labels] = point.value
    return {name: points for name, points in out.items() if points}


def test_totals_only_grow_across_epochs_and_engines() -> None:
    tally = Tally()
    reader = (("rank", "0"), ("worker", "0"))

    def feed(iteration: int, samples: int, fetched: int) -> dict[str, float]:
        stats = {
            "iteration": iteration,
            "epoch": 0,
            "samples": samples,
            "fetch": {"bytes": fetched},
        }
        (reading,) = readings(stats)
        return {p.family: p.value for p in tally.update(reader, reading.items, reading.era)}

    assert feed(1, 10, 100) == {
        "asyncstream_samples": 10,
        "asyncstream_epoch": 0,
        "asyncstream_fetch_bytes": 100,
    }
    assert feed(1, 30, 300)["asyncstream_samples"] == 30
    # a new iteration: its samples start again; the engine (kept) goes on
    assert feed(2, 50, 350) == {
        "asyncstream_samples": 80,
        "asyncstream_epoch": 0,
        "asyncstream_fetch_bytes": 350,
    }
    # a new engine starts again at 0: its bytes add to the total
    assert feed(3, 5, 40)["asyncstream_fetch_bytes"] == 390


def test_every_family_follows_the_naming_conventions() -> None:
    for name, family in FAMILIES.items():
        assert name.startswith("asyncstream_")
        assert name == name.lower()
        assert not name.endswith("_total")  # exposed with _total for counters
        if family.unit == "s":
            assert name.endswith("_seconds") or name.endswith("_seconds_total")
        if family.unit == "By":
            assert name.endswith("_bytes")
    assert Counter(f.kind for f in FAMILIES.values())["counter"] > 10


def test_one_export_per_registry(url: str, s3_server: LocalS3) -> None:
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    with ShardStream(url, endpoint_url=s3_server.endpoint_url, **STREAM) as stream:
        export = export_prometheus(stream, registry=registry)
        with pytest.raises(ValueError, match="already serves"):
            export_prometheus(stream, registry=registry)
        export.close()
        export_prometheus(stream, registry=registry).close()  # free again once closed


def test_export_refuses_what_it_cannot_read() -> None:
    with pytest.raises(TypeError, match="ShardStream"):
        export_prometheus(object())
    with pytest.raises(ValueError, match="interval"):
        export_prometheus(object(), interval=0)


def test_a_dali_loader_is_scraped_with_its_own_counters(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry

    from asyncstream import pack
    from asyncstream.testing import generate_imagefolder
    from dali_ops import DALIImageLoader, PipelineSettings

    generate_imagefolder(tmp_path / "images", 40, 4, seed=0, workers=1)
    pack(tmp_path / "images", str(tmp_path / "shards"), shard_samples=10, shard_bytes=None)
    stream = ShardStream(str(tmp_path / "shards"), window=3, inflight=2, seed=0)
    settings = PipelineSettings(image_size=32, num_threads=1, seed=7)
    with DALIImageLoader(stream, 8, device="cpu", settings=settings) as loader:
        export = export_prometheus(loader, port=0, registry=CollectorRegistry())
        images = sum(int(labels.shape[0]) for _, labels in loader)
        stats = loader.stats()
        assert export.port is not None
        scraped = scrape(export.port)
        export.close()
    assert images == 40
    assert total(scraped, "asyncstream_loader_images_total", worker="main") == images
    assert total(scraped, "asyncstream_loader_batches_total") == stats["batches"] == 5
    fetched = stats["stream"]["fetch"]
    assert total(scraped, "asyncstream_fetch_bytes_total", worker="main") == fetched["bytes"]
    stages = {dict(labels)["stage"] for labels in scraped["asyncstream_loader_stage_seconds_total"]}
    assert stages == {"decode_wait", "feed_wait", "feed", "probe"}
