"""``inflight="auto"`` (and ``prefetch="auto"``) against real servers: the concurrency
grows on a link where each GET waits for its first byte, shrinks when the store throttles,
and never touches the order (every sample once an epoch; a checkpoint taken under auto
resumes exactly under a fixed ``inflight``, and the reverse).

The tuner's decisions are unit-tested in ``tests/test_policies.py``; how good it is, is
the benchmark's (``python -m bench.autotune``): nothing here asserts a speed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from _servers import FAST_RETRY, SHORT, Dataset, assert_exact_epoch, upload_foreign

from asyncstream import FetchConfig, LocalS3, S3Options, ShardStream
from asyncstream._config import auto_range
from asyncstream.testing import FaultProxy, NetworkProfile, TestCertificates

START, MOST = auto_range(64 << 10)  # where auto starts and its ceiling: 32 and 64


@pytest.fixture(scope="module")
def data(s3_server: LocalS3, tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    """24 shards of about 0.8 MB: some 300 chunks of 64 KiB an epoch."""
    folder = tmp_path_factory.mktemp("autotune")
    return upload_foreign(
        s3_server.client(), "autotune", folder, 24, seed=31, jpg_bytes=(20_000, 50_000)
    )


@pytest.fixture
def slow_link(s3_server: LocalS3) -> Iterator[S3Options]:
    """The server behind 100 ms to the first byte of every response (no rate limit): the
    downloads in flight, not the bytes, bound the throughput."""
    profile = NetworkProfile(first_byte_latency=(0.1, 0.1))
    with FaultProxy(s3_server.endpoint_url, profile=profile) as proxy:
        yield S3Options(endpoint_url=proxy.endpoint_url).resolve()


@pytest.fixture
def slower_link(s3_server: LocalS3) -> Iterator[S3Options]:
    """500 ms to the first byte: auto's ceiling (64 GETs of 64 KiB) asks about 130 a
    second, which moto and the proxy answer with room to spare on two cores busy with the
    rest of the suite, so the link, not moto, is what more downloads overcome. (At 300
    ms, 64 read 1.2x to 1.7x of 32 on an idle machine, and under CI's load once less than
    the eighth a doubling must pay.)"""
    profile = NetworkProfile(first_byte_latency=(0.5, 0.5))
    with FaultProxy(s3_server.endpoint_url, profile=profile) as proxy:
        yield S3Options(endpoint_url=proxy.endpoint_url).resolve()


def _stream(
    data: Dataset, options: S3Options, inflight: int | str, coalesce: int = 0, **more: Any
) -> ShardStream:
    fetch = FetchConfig(
        inflight=inflight,  # type: ignore[arg-type]  # "auto" or a count
        chunk_bytes=64 << 10,
        coalesce_bytes=coalesce,  # 0: a GET per chunk: the round trips are what K hides
        hedge=False,
        retry=FAST_RETRY,
        timeouts=SHORT,
    )
    return ShardStream(
        data.prefix,
        s3=options,
        fetch=fetch,
        samples_per_shard=data.shards.counts,
        window=4,
        seed=7,
        **more,
    )


@pytest.mark.parametrize("coalesce", [0, 8 << 20], ids=["a-get-per-chunk", "coalesced"])
def test_auto_grows_concurrency_where_requests_wait_for_their_first_byte(
    data: Dataset, slower_link: S3Options, coalesce: int
) -> None:
    """Coalesced, no chunk waits to start (the downloads allowed take every chunk wanted,
    several a GET): a GET carrying several is what says more downloads would help.

    Epochs run until the tuner keeps a step, at most 8: a try that noise on a shared
    machine fails is tried again, smaller, a few windows later, as it would be in a job."""
    with _stream(data, slower_link, "auto", coalesce) as stream:
        for epoch in range(8):
            stream.set_epoch(epoch)
            assert_exact_epoch(list(stream), data)  # every sample once, whatever K does
            fetch = stream.stats()["fetch"]
            if fetch["autotune"]["kept"]:
                break
    assert fetch["concurrency_start"] == START
    assert fetch["concurrency_limit"] > START
    assert fetch["concurrency_limit_max"] <= fetch["autotune"]["ceiling"] == MOST
    assert fetch["autotune"]["kept"] >= 1


def test_a_fixed_inflight_does_not_move(data: Dataset, slow_link: S3Options) -> None:
    with _stream(data, slow_link, 3) as stream:
        assert_exact_epoch(list(stream), data)
        fetch = stream.stats()["fetch"]
    assert fetch["concurrency_limit"] == fetch["concurrency_limit_max"] == 3
    assert fetch["autotune"] is None


def test_auto_shrinks_concurrency_when_the_store_throttles(
    s3_server: LocalS3, data: Dataset
) -> None:
    """The proxy serves a quarter of auto's start (8 GETs) at once and answers the rest
    ``503 SlowDown``."""
    profile = NetworkProfile(first_byte_latency=(0.01, 0.02))
    with FaultProxy(s3_server.endpoint_url, profile=profile, capacity=START // 4) as proxy:
        options = S3Options(endpoint_url=proxy.endpoint_url).resolve()
        with _stream(data, options, "auto") as stream:
            assert_exact_epoch(list(stream), data)
            fetch = stream.stats()["fetch"]
        throttled = proxy.stats()["throttled"]
    assert throttled > 0
    assert fetch["retries"]["slowdown"] > 0
    assert fetch["throttle_cuts"] >= 1
    assert fetch["concurrency_limit_min"] <= START // 2
    assert fetch["concurrency_limit"] < START  # it settles below where it started


@pytest.mark.parametrize(("before", "after"), [("auto", 4), (4, "auto")])
def test_a_checkpoint_resumes_exactly_under_the_other_setting(
    data: Dataset, slow_link: S3Options, before: int | str, after: int | str
) -> None:
    with _stream(data, slow_link, 5) as stream:
        stream.set_epoch(1)
        reference = [s["__key__"] for s in stream]
    cut = len(reference) * 2 // 3
    with _stream(data, slow_link, before) as stream:
        stream.set_epoch(1)
        it = iter(stream)
        head = [next(it)["__key__"] for _ in range(cut)]
        state = stream.state_dict()
    with _stream(data, slow_link, after) as stream:
        stream.load_state_dict(state)
        tail = [s["__key__"] for s in stream]
    assert head + tail == reference


def test_auto_settings_are_checked() -> None:
    assert FetchConfig().inflight == "auto"  # the default
    fetch = FetchConfig(inflight="auto")  # 1 MiB GETs: from 32 to 64
    assert (fetch.inflight_start, fetch.inflight_max, fetch.prefetch_chunks) == (32, 64, 128)
    # the range is bytes in flight: 32 MiB at the start, within 8 and 32 downloads
    assert [auto_range(n << 20) for n in (1, 2, 4, 16)] == [(32, 64), (16, 32), (8, 16), (8, 16)]
    assert auto_range(64 << 10) == (32, 64)
    assert FetchConfig(inflight="auto", chunk_bytes=4 << 20).inflight_range() == (8, 16)
    assert FetchConfig(inflight="auto").inflight_range(4 << 20) == (8, 16)
    assert FetchConfig(inflight=5).inflight_range(4 << 20) == (5, 5)
    assert fetch.auto_prefetch
    assert FetchConfig(inflight="auto", prefetch=10).prefetch_chunks == 10
    assert not FetchConfig(inflight="auto", prefetch=10).auto_prefetch
    assert FetchConfig(inflight=4, prefetch="auto").auto_prefetch
    assert FetchConfig(inflight=4, prefetch="auto").prefetch_chunks == 8
    with pytest.raises(ValueError, match="inflight"):
        FetchConfig(inflight="fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="prefetch"):
        FetchConfig(prefetch="more")  # type: ignore[arg-type]


def _keys(batch: list[dict[str, Any]]) -> list[str]:
    return [sample["__key__"] for sample in batch]


def test_auto_over_https_in_dataloader_workers_resumes_under_a_fixed_inflight(
    data: Dataset, s3_tls_server: LocalS3, certs: TestCertificates
) -> None:
    """Each StatefulDataLoader worker's engine tunes its own K over HTTPS; the order is
    the one a fixed K gives, and a checkpoint taken under auto resumes under K = 4."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    options = S3Options(endpoint_url=s3_tls_server.endpoint_url, ca_bundle=certs.ca).resolve()

    def loader(stream: ShardStream) -> StatefulDataLoader:
        return StatefulDataLoader(stream, batch_size=8, num_workers=2, collate_fn=_keys)

    with _stream(data, options, 4) as stream:
        reference = [key for batch in loader(stream) for key in batch]
    with _stream(data, options, "auto") as stream:
        workers = StatefulDataLoader(stream, batch_size=None, num_workers=2)
        assert_exact_epoch(list(workers), data)  # the bytes of every sample, each once
    with _stream(data, options, "auto") as stream:
        first = loader(stream)
        it = iter(first)
        head = [key for _ in range(10) for key in next(it)]
        state = first.state_dict()
        del it, first
    with _stream(data, options, 4) as stream:
        resumed = loader(stream)
        resumed.load_state_dict(state)
        tail = [key for batch in resumed for key in batch]
    assert head + tail == reference


def test_the_default_reads_foreign_shards_over_https_in_workers_as_webdataset_does(
    data: Dataset, s3_tls_server: LocalS3, certs: TestCertificates
) -> None:
    """``inflight`` left unset (auto, the default), over HTTPS, in two StatefulDataLoader
    workers: the shards ``tarfile`` and ``webdataset.TarWriter`` wrote give, each once,
    the samples webdataset's own reader takes from the same bytes."""
    from _wds import wds_samples
    from torchdata.stateful_dataloader import StatefulDataLoader

    options = S3Options(endpoint_url=s3_tls_server.endpoint_url, ca_bundle=certs.ca).resolve()
    fetch = FetchConfig(chunk_bytes=64 << 10, retry=FAST_RETRY, timeouts=SHORT)
    with ShardStream(
        data.prefix, s3=options, fetch=fetch, samples_per_shard=data.shards.counts, seed=5
    ) as stream:
        assert stream._settings.engine_config(0).auto  # nothing set: the engine finds K
        got = [
            {k: v if k.startswith("__") else bytes(v) for k, v in s.items() if k != "__url__"}
            for s in StatefulDataLoader(stream, batch_size=None, num_workers=2)
        ]
    theirs = [s for url, blob in sorted(data.blobs.items()) for s in wds_samples(blob, url)]
    key = "__key__"
    assert sorted(got, key=lambda s: s[key]) == sorted(theirs, key=lambda s: s[key])
    assert len({s[key] for s in got}) == len(got) == sum(data.shards.counts)
