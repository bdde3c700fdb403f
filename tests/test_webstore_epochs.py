"""Web shard URLs end to end (asyncstream/stores/_webstore.py): an epoch over HTTPS through
the fault proxy's TLS listener, a resume in a fresh process, and webdataset's own reading
of the same URLs as the oracle."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from _servers_web import WebData
from torchdata.stateful_dataloader import StatefulDataLoader

from asyncstream import FetchConfig, ShardStream, configure_store
from asyncstream.testing import FaultPlan, FaultProxy, TestCertificates, WebServer
from tests._resume_child import keys, record_epochs
from tests.test_resume import run_child
from tests.test_webstore import FAST, assert_exact, read_all


def test_exact_epoch_over_https_through_the_fault_proxy(
    web: WebServer, web_data: WebData, certs: TestCertificates
) -> None:
    """The proxy's TLS listener in front of the web server: 10% of the GETs fail, TLS
    connections are reset and cut short, every sample arrives once."""
    plan = FaultPlan(slowdown=0.04, reset=0.03, truncate=0.03, match=".tar")
    fetch = FetchConfig(
        inflight=4, chunk_bytes=4 << 10, coalesce_bytes=0, retry=FAST.retry, timeouts=FAST.timeouts
    )
    configure_store("https", ca_bundle=certs.ca)
    try:
        with FaultProxy(web.url, faults=plan, seed=3, tls=certs.server) as proxy:
            samples = read_all(web_data.pattern(proxy.endpoint_url), web_data, fetch=fetch)
            stats = proxy.stats()
    finally:
        configure_store("https")
    assert_exact(samples, web_data)
    assert stats["slowdown"] + stats["reset"] + stats["truncate"] > 0


def test_resume_in_a_fresh_process(web: WebServer, web_data: WebData, tmp_path: Path) -> None:
    """A StatefulDataLoader over web shards saved mid-epoch, resumed in a fresh process:
    the batches that follow, to the end of the next epoch, are the uninterrupted run's."""
    stream_kwargs: dict[str, Any] = {
        "samples_per_shard": web_data.counts,
        "window": 3,
        "inflight": 2,
        "chunk_bytes": 16 << 10,
        "seed": 11,
    }
    url = web_data.pattern(web.url)
    loader_kwargs = {"batch_size": 5, "num_workers": 0}
    with ShardStream(url, **stream_kwargs) as stream:
        loader = StatefulDataLoader(stream, collate_fn=keys, **loader_kwargs)
        epochs, states = record_epochs(stream, loader)
        del loader
    assert sorted(k for b in epochs[0] for k in b) == sorted(web_data.samples)
    points = [(0, len(epochs[0]) // 2)]
    spec = {
        "folder": url,
        "stream": stream_kwargs,
        "loader": loader_kwargs,
        "epochs": 2,
        "saves": [{"epoch": e, "state": json.loads(states[e][j - 1])} for e, j in points],
    }
    resumed = run_child(tmp_path, spec)
    for (e, j), got in zip(points, resumed, strict=True):
        assert got == epochs[e][j:] + [b for later in epochs[e + 1 :] for b in later]


@pytest.mark.skipif(shutil.which("curl") is None, reason="webdataset reads http URLs with curl")
def test_webdataset_reads_the_same_urls_alike(web: WebServer, web_data: WebData) -> None:
    """webdataset's own reader (curl pipes) over the same URL list: the same samples."""
    import webdataset as wds

    urls = web_data.urls(web.url)
    theirs = {
        s["__key__"]: {k: v for k, v in s.items() if not k.startswith("__")}
        for s in wds.WebDataset(urls, shardshuffle=False, empty_check=False)
    }
    ours = {
        s["__key__"]: {k: bytes(v) for k, v in s.items() if not k.startswith("__")}
        for s in read_all(urls, web_data)
    }
    assert ours == theirs == web_data.samples


def test_the_disk_cache_serves_a_second_stream(
    web: WebServer, web_data: WebData, tmp_path: Path
) -> None:
    """Web shards are cached as S3's are: a second stream reads none of them again."""
    url = web_data.pattern(web.url)
    assert_exact(read_all(url, web_data, cache_dir=tmp_path / "cache"), web_data)
    first = len([r for r in web.requests() if r.method == "GET" and r.path.endswith(".tar")])
    with ShardStream(
        url, samples_per_shard=web_data.counts, fetch=FAST, window=3, cache_dir=tmp_path / "cache"
    ) as stream:
        assert_exact(list(stream), web_data)
        cache = stream.stats()["fetch"]["cache"]
    again = len([r for r in web.requests() if r.method == "GET" and r.path.endswith(".tar")])
    assert first > 0
    assert again == first
    assert cache["hits"] > 0
    assert cache["misses"] == 0
