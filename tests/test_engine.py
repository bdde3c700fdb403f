"""The fetch engine against the real S3 server, through the fault-injecting proxy."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from _procs import alive, segments

from asyncstream import (
    AccessDeniedError,
    EngineError,
    LocalS3,
    NotFoundError,
    PermanentFetchError,
    S3Options,
    TransientFetchError,
    resolve_shards,
)
from asyncstream.engine._engine import Engine, EngineConfig
from asyncstream.engine._ring import Ring
from asyncstream.shards._urls import Shard
from asyncstream.stores._retry import RetryPolicy, Timeouts
from asyncstream.stores._s3store import S3Store
from asyncstream.stores._store import ChunkRequest
from asyncstream.testing import FaultPlan, FaultProxy, NetworkProfile

FAST_RETRY = RetryPolicy(max_attempts=12, base_delay=0.005, max_delay=0.05, deadline=60)
SHORT = Timeouts(connect=5, first_byte=5, stall=0.5, chunk=20)


def chunks_of(shards: list[Shard], chunk: int) -> list[ChunkRequest]:
    return [
        ChunkRequest(s.url, o, min(chunk, s.size - o), s.etag, o + chunk >= s.size)
        for s in shards
        for o in range(0, s.size, chunk)
    ]


def drain(engine: Engine, requests: list[ChunkRequest]) -> dict[str, bytes]:
    """Submit everything, read every chunk in order, return the bytes per shard."""
    engine.submit(requests)
    got: dict[str, bytearray] = {}
    for expected in requests:
        ready = engine.next()
        assert ready.request == expected
        got.setdefault(ready.request.url, bytearray()).extend(engine.view(ready))
        engine.release(ready.slot)
    return {url: bytes(data) for url, data in got.items()}


def shm_names() -> set[str]:
    """The rings still alive: held by a live process on this machine (they have no name:
    one nobody holds is gone), or named in /dev/shm."""
    return segments(("asyncstream",))


@pytest.fixture(scope="module")
def dataset(s3_server: LocalS3) -> dict[str, Any]:
    """100 shards of 200 to 330 KB in one bucket."""
    client = s3_server.client()
    bucket = "engine-dataset"
    client.create_bucket(Bucket=bucket)
    rng = __import__("random").Random(5)
    blobs = {}
    for i in range(100):
        data = rng.randbytes(200_000 + rng.randrange(130_000))
        key = f"shard-{i:03d}.tar"
        client.put_object(Bucket=bucket, Key=key, Body=data)
        blobs[f"s3://{bucket}/{key}"] = data
    return {"bucket": bucket, "blobs": blobs}


def config(endpoint: str, **kwargs: Any) -> EngineConfig:
    # One GET per chunk: these tests count requests, retries and hedges per chunk
    # (coalesced GETs are tested in test_coalesce.py).
    base: dict[str, Any] = {
        "coalesce_bytes": 0,
        "inflight": 8,
        "retry": FAST_RETRY,
        "timeouts": SHORT,
        "s3": S3Options(endpoint_url=endpoint).resolve(),
    }
    base.update(kwargs)
    return EngineConfig(**base)


def test_every_byte_once_in_order_under_10_percent_faults(
    s3_server: LocalS3, dataset: dict[str, Any], transport: str
) -> None:
    plan = FaultPlan(
        slowdown=0.02,
        internal_error=0.02,
        reset=0.02,
        truncate=0.02,
        stall=0.01,
        latency=0.01,
        latency_seconds=0.05,
        match=".tar",
    )
    with FaultProxy(s3_server.endpoint_url, faults=plan, seed=11) as proxy:
        options = S3Options(endpoint_url=proxy.endpoint_url).resolve()
        shards = resolve_shards(f"s3://{dataset['bucket']}/", options)
        requests = chunks_of(shards, 64 << 10)
        assert len(requests) > 400
        with Engine(
            config(proxy.endpoint_url, transport=transport), n_slots=12, slot_bytes=64 << 10
        ) as engine:
            got = drain(engine, requests)
            stats = engine.stats()
        injected = proxy.stats()
    assert got == dataset["blobs"]
    assert stats["transport"] == {"auto": "direct", "aiohttp": "aiohttp"}[transport]
    assert stats["chunks"] == len(requests)
    assert stats["shards"] == 100
    assert stats["bytes"] == sum(len(b) for b in dataset["blobs"].values())
    faults = sum(injected[k] for k in ("slowdown", "internal_error", "reset", "truncate", "stall"))
    assert faults >= 0.05 * len(requests)
    for kind in ("slowdown", "internal_error", "reset", "truncate", "stall"):
        assert injected[kind] > 0, kind
    assert stats["retries"]["slowdown"] >= 1
    assert stats["retries"]["server_error"] >= 1
    # A stall is cut short by the stall timeout (a retry) or, once the engine knows how
    # long chunks take, by a hedge that wins first.
    assert stats["retries"].get("stall", 0) + stats["hedge_wins"] >= 1
    # Every fault is retried, except one that hits either copy of a hedged chunk while
    # the other copy finishes it (a hedge that wins, or an original that beats its hedge
    # whose request then faulted): at most one such fault a hedged chunk.
    assert stats["retries_total"] + stats["hedged"] >= faults
    assert stats["inflight_peak"] <= 8
    assert stats["first_byte_s"]["p50"] > 0


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_modes_and_backpressure(proxy: FaultProxy, dataset: dict[str, Any], mode: str) -> None:
    options = S3Options(endpoint_url=proxy.endpoint_url).resolve()
    shards = resolve_shards(f"s3://{dataset['bucket']}/shard-{{000..009}}.tar", options)
    requests = chunks_of(shards, 100_000)
    with Engine(
        config(proxy.endpoint_url, inflight=8),
        n_slots=3,
        slot_bytes=100_000,
        mode=mode,  # type: ignore[arg-type]
    ) as engine:
        got = drain(engine, requests)
        stats = engine.stats()
    assert got == {s.url: dataset["blobs"][s.url] for s in shards}
    assert stats["inflight_peak"] <= 3  # no download without a free slot
    assert stats["retries_total"] == 0


def test_local_files(tmp_path: Path) -> None:
    blobs = {}
    for i in range(3):
        path = tmp_path / f"s{i}.tar"
        path.write_bytes(os.urandom(50_000 + i))
        blobs[path.as_uri()] = path.read_bytes()
    shards = resolve_shards(str(tmp_path))
    with Engine(EngineConfig(inflight=2), n_slots=3, slot_bytes=16_384) as engine:
        assert drain(engine, chunks_of(shards, 16_384)) == blobs


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_a_slot_released_untold_is_told_before_a_wait_blocks(tmp_path: Path, mode: str) -> None:
    """One slot: every chunk after the first needs the slot the previous one held. Given
    back without telling the engine, it is told before wait() blocks (else each wait would
    end in the wait timeout) or with the next submit."""
    path = tmp_path / "s.tar"
    path.write_bytes(os.urandom(5 * 4096))
    shards = resolve_shards(str(tmp_path))
    requests = chunks_of(shards, 4096)
    config = EngineConfig(inflight=1, hedge=False)
    with Engine(config, n_slots=1, slot_bytes=4096, mode=mode) as engine:
        got = bytearray()
        engine.submit(requests[:3])  # the second and third wait for the one slot
        for _ in range(3):
            ready = engine.next(timeout=10)
            got += engine.view(ready)
            engine.release(ready.slot, tell=False)
        for request in requests[3:]:  # released untold, then a submit that says it
            engine.submit([request])
            ready = engine.next(timeout=10)
            got += engine.view(ready)
            engine.release(ready.slot, tell=False)
        engine.flush()
        assert bytes(got) == path.read_bytes()
        assert engine.idle


def test_an_engines_first_chunk_is_read_in_parts(s3_server: LocalS3) -> None:
    """An engine's first chunk (a fresh stream's first sample waits for it) is read from
    S3 as four GETs at once; the chunks after it are one GET each, and a chunk under
    8 MiB is always read whole. The bytes are the object's either way."""
    client = s3_server.client()
    client.create_bucket(Bucket="alone")
    blob = os.urandom(24 << 20)
    client.put_object(Bucket="alone", Key="big.tar", Body=blob)
    for size, parts in ((8 << 20, 4), (4 << 20, 0)):
        requests = [
            ChunkRequest("s3://alone/big.tar", o, size, None, o + size >= len(blob), len(blob))
            for o in range(0, len(blob), size)
        ]
        with Engine(
            config(s3_server.endpoint_url, hedge=False), n_slots=3, slot_bytes=size
        ) as engine:
            got = drain(engine, requests)
            got.update(drain(engine, requests))  # the same engine again: each whole
            stats = engine.stats()
        assert got == {"s3://alone/big.tar": blob}
        assert stats["part_reads"] == parts
        assert stats["requests"] == 2 * len(requests)


def test_404_fails_fast_naming_the_key(
    proxy: FaultProxy, dataset: dict[str, Any], transport: str
) -> None:
    url = f"s3://{dataset['bucket']}/missing.tar"
    with Engine(
        config(proxy.endpoint_url, transport=transport), n_slots=2, slot_bytes=1024
    ) as engine:
        engine.submit([ChunkRequest(url, 0, 100)])
        with pytest.raises(NotFoundError) as info:
            engine.next()
        assert url in str(info.value)
        assert engine.stats()["retries_total"] == 0


def test_403_fails_fast_naming_the_key(
    proxy: FaultProxy, dataset: dict[str, Any], transport: str
) -> None:
    url = f"s3://{dataset['bucket']}/shard-000.tar"
    proxy.inject("status", status=403, match="shard-000.tar")
    with Engine(
        config(proxy.endpoint_url, transport=transport), n_slots=2, slot_bytes=1024
    ) as engine:
        engine.submit([ChunkRequest(url, 0, 100)])
        with pytest.raises(AccessDeniedError) as info:
            engine.next()
        assert url in str(info.value)
        assert engine.stats()["retries_total"] == 0


def test_bad_credentials_fail_fast(aws_env: dict[str, str], transport: str) -> None:
    with LocalS3(mode="process", require_auth=True) as server:
        url = "s3://some-bucket/shard.tar"
        with Engine(
            config(server.endpoint_url, transport=transport), n_slots=2, slot_bytes=1024
        ) as engine:
            engine.submit([ChunkRequest(url, 0, 100)])
            with pytest.raises(AccessDeniedError) as info:
                engine.next()
            assert url in str(info.value)
            assert aws_env["AWS_SECRET_ACCESS_KEY"] not in str(info.value)
            assert engine.stats()["retries_total"] == 0


def test_stall_is_abandoned_and_retried(
    proxy: FaultProxy, dataset: dict[str, Any], transport: str
) -> None:
    url = f"s3://{dataset['bucket']}/shard-001.tar"
    proxy.inject("stall", match="shard-001.tar")  # one hour, unless abandoned
    size = len(dataset["blobs"][url])
    with Engine(
        config(proxy.endpoint_url, transport=transport), n_slots=2, slot_bytes=size
    ) as engine:
        got = drain(engine, [ChunkRequest(url, 0, size)])
        stats = engine.stats()
    assert got[url] == dataset["blobs"][url]
    # The injected stall lasts an hour: the bytes came from the one retry that replaced it.
    assert stats["retries"] == {"stall": 1}


def test_a_body_slower_than_the_first_byte_timeout_is_not_cut(
    s3_server: LocalS3, dataset: dict[str, Any], transport: str
) -> None:
    """``first_byte`` bounds the wait for the response's head, not the whole exchange: a
    body that takes several times that long to arrive (paced by the proxy) is read whole,
    with no retry."""
    url = f"s3://{dataset['bucket']}/shard-005.tar"
    size = len(dataset["blobs"][url])
    profile = NetworkProfile(bandwidth_bytes_per_s=size / 1.5)  # the body takes ~1.5 s
    timeouts = Timeouts(connect=5, first_byte=0.4, stall=5, chunk=60)
    with (
        FaultProxy(s3_server.endpoint_url, profile=profile) as proxy,
        Engine(
            config(proxy.endpoint_url, timeouts=timeouts, transport=transport),
            n_slots=2,
            slot_bytes=size,
        ) as engine,
    ):
        got = drain(engine, [ChunkRequest(url, 0, size)])
        stats = engine.stats()
    assert got[url] == dataset["blobs"][url]
    assert stats["retries_total"] == 0


def test_retries_run_out_with_a_clear_error(
    proxy: FaultProxy, dataset: dict[str, Any], transport: str
) -> None:
    url = f"s3://{dataset['bucket']}/shard-002.tar"
    proxy.inject("slowdown", count=3, match="shard-002.tar")
    policy = RetryPolicy(max_attempts=3, base_delay=0.001, max_delay=0.01)
    with Engine(
        config(proxy.endpoint_url, retry=policy, transport=transport), n_slots=2, slot_bytes=1024
    ) as engine:
        engine.submit([ChunkRequest(url, 0, 100)])
        with pytest.raises(TransientFetchError) as info:
            engine.next()
    message = str(info.value)
    assert url in message
    assert "3 failed attempts" in message
    assert "slowdown" in message


def test_object_replaced_mid_epoch(
    s3_server: LocalS3, bucket: str, s3_client: Any, transport: str
) -> None:
    s3_client.put_object(Bucket=bucket, Key="x.tar", Body=b"a" * 5000)
    options = S3Options(endpoint_url=s3_server.endpoint_url).resolve()
    (shard,) = resolve_shards(f"s3://{bucket}/x.tar", options)
    s3_client.put_object(Bucket=bucket, Key="x.tar", Body=b"b" * 5000)
    with Engine(
        config(s3_server.endpoint_url, transport=transport), n_slots=2, slot_bytes=4096
    ) as engine:
        engine.submit(chunks_of([shard], 4096))
        with pytest.raises(PermanentFetchError, match="changed since it was listed") as info:
            engine.next()
    assert shard.url in str(info.value)


def test_chunk_larger_than_slot_is_refused(proxy: FaultProxy, dataset: dict[str, Any]) -> None:
    url = f"s3://{dataset['bucket']}/shard-003.tar"
    with Engine(config(proxy.endpoint_url), n_slots=2, slot_bytes=1024) as engine:
        engine.submit([ChunkRequest(url, 0, 5000)])
        with pytest.raises(EngineError, match="does not fit a slot"):
            engine.next()


def test_sigkill_of_the_engine_is_noticed_by_its_pipe_not_a_timeout(
    proxy: FaultProxy, dataset: dict[str, Any]
) -> None:
    url = f"s3://{dataset['bucket']}/shard-004.tar"
    proxy.inject("stall", match="shard-004.tar")
    engine = Engine(
        config(proxy.endpoint_url, timeouts=Timeouts(stall=600)), n_slots=2, slot_bytes=1 << 20
    )
    try:
        engine.submit([ChunkRequest(url, 0, 1000)])
        assert engine.pid is not None
        os.kill(engine.pid, signal.SIGKILL)
        # The download stalls for an hour and its stall timeout is 10 minutes: only the end
        # of the engine's pipe can end this wait, and the error names the signal.
        with pytest.raises(EngineError, match="killed by signal 9"):
            engine.next()
    finally:
        engine.close()
    assert engine.ring.name not in shm_names()


_CONSUMER = textwrap.dedent(
    """
    import sys, time
    from asyncstream.engine._engine import Engine, EngineConfig
    from asyncstream.stores._store import ChunkRequest
    if __name__ == "__main__":
        engine = Engine(EngineConfig(), n_slots=2, slot_bytes=4096)
        print(engine.ring.name, engine.pid, flush=True)
        time.sleep(600)
    """
)


def test_sigkill_of_the_consumer_stops_the_engine_and_frees_shm(tmp_path: Path) -> None:
    script = tmp_path / "consumer.py"
    script.write_text(_CONSUMER)
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, proc.communicate()[1]
        name, pid_text = line.split()
        engine_pid = int(pid_text)
        assert name in shm_names()
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (alive(engine_pid) or name in shm_names()):
            time.sleep(0.05)
        assert not alive(engine_pid)
        assert name not in shm_names()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        assert proc.stdout is not None
        assert proc.stderr is not None
        proc.stdout.close()
        proc.stderr.close()


def test_the_engine_process_holds_its_ring_and_nothing_else(tmp_path: Path) -> None:
    """The ring reaches the engine as one descriptor (no name to find others by): the
    engine process holds that segment, none of the consumer's other rings, and lets go
    with it."""
    shard = tmp_path / "a.tar"
    shard.write_bytes(bytes(range(256)) * 32)
    with (
        Ring.create(1, 4096, tag="other") as other,
        Engine(EngineConfig(), n_slots=2, slot_bytes=4096) as engine,
    ):
        assert engine.pid is not None
        ready = engine.wait(engine.submit([ChunkRequest(shard.as_uri(), 0, 4096)])[0])
        assert bytes(engine.view(ready)) == shard.read_bytes()[:4096]
        engine.release(ready.slot)
        assert segments(("asyncstream", "other"), {engine.pid}) == {engine.ring.name}
        assert other.name in segments(("other",), {os.getpid()})
        fds = os.listdir(f"/proc/{engine.pid}/fd")
        links = [os.readlink(f"/proc/{engine.pid}/fd/{fd}") for fd in fds]
        held = {link for link in links if "memfd:" in link}
        assert held == {f"/memfd:{engine.ring.name} (deleted)"}  # one segment, its ring
        pid = engine.pid
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.ring.name not in shm_names()


def test_close_is_idempotent_and_refuses_reuse(tmp_path: Path) -> None:
    engine = Engine(EngineConfig(), n_slots=1, slot_bytes=1024, mode="thread")
    name = engine.ring.name
    engine.close()
    engine.close()
    assert name not in shm_names()
    with pytest.raises(EngineError, match="closed"):
        engine.submit([])


def test_bytes_checksum_matches(proxy: FaultProxy, dataset: dict[str, Any], transport: str) -> None:
    """The digest of the streamed bytes equals the source's (large single chunks)."""
    options = S3Options(endpoint_url=proxy.endpoint_url).resolve()
    shards = resolve_shards(f"s3://{dataset['bucket']}/shard-{{010..013}}.tar", options)
    biggest = max(s.size for s in shards)
    with Engine(
        config(proxy.endpoint_url, transport=transport), n_slots=2, slot_bytes=biggest
    ) as engine:
        got = drain(engine, chunks_of(shards, biggest))
    for url, data in got.items():
        assert hashlib.sha256(data).digest() == hashlib.sha256(dataset["blobs"][url]).digest()


# -- adaptive concurrency and hedged requests -------------------------------------------


def _throttled_run(
    s3_server: LocalS3, dataset: dict[str, Any], *, adaptive: bool
) -> tuple[dict[str, bytes], dict[str, Any], dict[str, int]]:
    """Every shard through a proxy that serves 2 GETs at once, with the engine asking for 8:
    40 shards in 64 KiB chunks (about 160 requests, enough for the counts to settle)."""
    profile = NetworkProfile(first_byte_latency=(0.01, 0.02))
    with FaultProxy(s3_server.endpoint_url, profile=profile, capacity=2) as proxy:
        options = S3Options(endpoint_url=proxy.endpoint_url).resolve()
        shards = resolve_shards(f"s3://{dataset['bucket']}/", options)[:40]
        requests = chunks_of(shards, 64 << 10)
        cfg = config(proxy.endpoint_url, adaptive=adaptive, hedge=False)
        with Engine(cfg, n_slots=10, slot_bytes=1 << 20) as engine:
            got = drain(engine, requests)
            stats = engine.stats()
            if adaptive:  # throttling stops: the limit grows back to inflight
                proxy.capacity = None
                drain(
                    engine,
                    chunks_of(resolve_shards(f"s3://{dataset['bucket']}/", options), 1 << 20),
                )
                stats["after"] = engine.stats()
        counts = proxy.stats()
    return got, stats, counts


def test_throttling_cuts_concurrency_and_it_grows_back(
    s3_server: LocalS3, dataset: dict[str, Any]
) -> None:
    got, stats, counts = _throttled_run(s3_server, dataset, adaptive=True)
    assert got == {url: dataset["blobs"][url] for url in got}
    assert len(got) == 40
    assert counts["throttled"] > 0
    assert stats["throttle_cuts"] >= 1
    assert stats["concurrency_limit_min"] <= 4
    after = stats["after"]
    assert after["concurrency_limit"] == 8  # 100 chunks unthrottled: back to inflight
    assert after["throttle_cuts"] == stats["throttle_cuts"]


def test_adaptive_concurrency_gets_fewer_rejections(
    s3_server: LocalS3, dataset: dict[str, Any]
) -> None:
    _, fixed, fixed_counts = _throttled_run(s3_server, dataset, adaptive=False)
    _, _adaptive, adaptive_counts = _throttled_run(s3_server, dataset, adaptive=True)
    assert fixed["throttle_cuts"] == 0
    assert fixed["concurrency_limit_min"] == 8
    # With 8 asked for and 2 served, a fixed limit keeps being refused; AIMD settles near 2.
    assert adaptive_counts["throttled"] < 0.5 * fixed_counts["throttled"]


def test_a_slow_request_is_hedged_and_the_hedge_wins(
    proxy: FaultProxy, dataset: dict[str, Any], transport: str
) -> None:
    options = S3Options(endpoint_url=proxy.endpoint_url).resolve()
    shards = resolve_shards(f"s3://{dataset['bucket']}/", options)
    requests = chunks_of(shards[:60], 1 << 20)
    slow = requests[40]
    # The 41st request answers 20 s late: far past any timeout that would retry it first.
    proxy.inject("latency", seconds=20, match=slow.url.rsplit("/", 1)[1])
    # A hedge only after 10 times the predicted time: on a loaded machine (CI), chunks 2 to
    # 3 times slower than predicted spent the 5% budget before the slow one came.
    cfg = config(
        proxy.endpoint_url,
        timeouts=Timeouts(first_byte=60, stall=60, chunk=120),
        transport=transport,
        hedge_factor=10.0,
    )
    with Engine(cfg, n_slots=10, slot_bytes=1 << 20) as engine:
        got = drain(engine, requests)
        stats = engine.stats()
    assert got == {url: dataset["blobs"][url] for url in got}
    assert len(got) == 60
    assert stats["hedged"] >= 1
    assert stats["hedge_wins"] >= 1
    assert stats["hedged"] <= 0.05 * len(requests) + 1  # the budget
    assert stats["retries_total"] == 0  # hedged, not timed out and retried
    assert stats["inflight"] == 0


def test_hedging_off_waits_for_the_slow_request(proxy: FaultProxy, dataset: dict[str, Any]) -> None:
    options = S3Options(endpoint_url=proxy.endpoint_url).resolve()
    shards = resolve_shards(f"s3://{dataset['bucket']}/", options)
    requests = chunks_of(shards[:30], 1 << 20)
    proxy.inject("latency", seconds=1.5, match=requests[25].url.rsplit("/", 1)[1])
    cfg = config(proxy.endpoint_url, hedge=False)
    with Engine(cfg, n_slots=10, slot_bytes=1 << 20) as engine:
        got = drain(engine, requests)
        stats = engine.stats()
    assert len(got) == 30
    assert stats["hedged"] == 0
    assert stats["chunk_s"]["max"] >= 1.5


def test_the_direct_transport_is_for_endpoints_without_a_proxy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)

    def transport(endpoint: str | None) -> str:
        store = S3Store(S3Options(endpoint_url=endpoint), timeouts=SHORT)
        return str(store.stats()["transport"])

    assert transport("http://127.0.0.1:9000") == "direct"
    assert transport("https://minio.cluster.local:9000") == "direct"  # TLS too
    assert transport(None) == "direct"  # AWS itself
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.example:3128")
    assert transport("http://minio.cluster.local:9000") == "aiohttp"  # botocore's proxy path
    assert transport("https://minio.cluster.local:9000") == "direct"
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    assert transport("https://minio.cluster.local:9000") == "aiohttp"
    monkeypatch.setenv("NO_PROXY", "minio.cluster.local")
    assert transport("http://minio.cluster.local:9000") == "direct"
    with pytest.raises(ValueError, match="transport"):
        EngineConfig(transport="curl")  # type: ignore[arg-type]
