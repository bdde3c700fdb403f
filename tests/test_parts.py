"""A block larger than one GET (``FetchConfig.chunk_bytes`` below the stream's block):
the engine reads each slot in parts at once, each retried on its own
(``asyncstream/engine/_parts.py``). Counted at a real proxy, on shards that ``pack`` did
not write."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from asyncstream import (
    CacheConfig,
    FetchConfig,
    LocalS3,
    OrderConfig,
    S3Options,
    ShardStream,
    resolve_shards,
)
from asyncstream.engine._engine import Engine, EngineConfig
from asyncstream.testing import FaultPlan, FaultProxy
from tests._foreign import ForeignShards, write_foreign_shards
from tests._servers import FAST_RETRY, SHORT
from tests.test_engine import chunks_of, drain

BLOCK = 32 << 10  # the slot
PART = 8 << 10  # the GET


@pytest.fixture(scope="module")
def shards(s3_server: LocalS3, tmp_path_factory: pytest.TempPathFactory) -> ForeignShards:
    data = write_foreign_shards(tmp_path_factory.mktemp("parts"), 4, seed=8)
    client = s3_server.client()
    client.create_bucket(Bucket="parts")
    for path in sorted(data.folder.glob("*.tar")):
        client.put_object(Bucket="parts", Key=f"p/{path.name}", Body=path.read_bytes())
    return data


def blobs(data: ForeignShards) -> dict[str, bytes]:
    return {f"s3://parts/p/{p.name}": p.read_bytes() for p in sorted(data.folder.glob("*.tar"))}


def shard_ranges(proxy: FaultProxy) -> list[tuple[int, int]]:
    """The byte ranges of the shard GETs the proxy saw, in order."""
    found = []
    for method, path, header, _ in proxy.ranged_requests():
        if method == "GET" and path.endswith(".tar"):
            assert header is not None
            match = re.fullmatch(r"bytes=(\d+)-(\d+)", header)
            assert match is not None
            found.append((int(match[1]), int(match[2]) + 1))
    return found


def engine(proxy: FaultProxy, *, request_bytes: int | None = PART) -> Engine:
    config = EngineConfig(
        inflight=4,
        retry=FAST_RETRY,
        timeouts=SHORT,
        s3=S3Options(endpoint_url=proxy.endpoint_url).resolve(),
        hedge=False,
        coalesce_bytes=0,
        request_bytes=request_bytes,
    )
    return Engine(config, n_slots=6, slot_bytes=BLOCK)


def test_a_slot_larger_than_a_get_is_read_in_parts(
    shards: ForeignShards, proxy: FaultProxy
) -> None:
    listed = resolve_shards("s3://parts/p/", S3Options(endpoint_url=proxy.endpoint_url))
    requests = chunks_of(listed, BLOCK)
    before = len(shard_ranges(proxy))
    with engine(proxy) as e:
        got = drain(e, requests)
        stats = e.stats()
    assert got == blobs(shards)
    assert stats["chunks"] == len(requests)
    ranges = shard_ranges(proxy)[before:]
    assert all(stop - start <= PART for start, stop in ranges)
    assert len(ranges) == sum(-(-r.length // PART) for r in requests)
    assert stats["retries_total"] == 0


def test_without_request_bytes_a_slot_is_one_get(shards: ForeignShards, proxy: FaultProxy) -> None:
    listed = resolve_shards("s3://parts/p/", S3Options(endpoint_url=proxy.endpoint_url))
    requests = chunks_of(listed, BLOCK)
    before = len(shard_ranges(proxy))
    with engine(proxy, request_bytes=None) as e:
        assert drain(e, requests) == blobs(shards)
    assert len(shard_ranges(proxy)) - before == len(requests)


def test_a_failed_part_is_read_again_alone(shards: ForeignShards, proxy: FaultProxy) -> None:
    """One part's connection is reset mid-body: the retry asks for that part only, and
    the parts already whole are not fetched twice."""
    listed = resolve_shards("s3://parts/p/", S3Options(endpoint_url=proxy.endpoint_url))
    request = chunks_of(listed[:1], BLOCK)[0]
    assert request.length == BLOCK  # four parts
    before = len(shard_ranges(proxy))
    with engine(proxy) as e:
        proxy.inject("reset", after_bytes=PART // 2, match=".tar")
        got = drain(e, [request])
        stats = e.stats()
    assert got[request.url] == blobs(shards)[request.url][:BLOCK]
    assert stats["retries_total"] == 1
    ranges = shard_ranges(proxy)[before:]
    assert len(ranges) == 4 + 1
    assert len(set(ranges)) == 4  # one range asked twice, the others once


def test_a_stream_of_blocks_read_in_parts_is_exact_under_faults(
    shards: ForeignShards, s3_server: LocalS3
) -> None:
    """10% of the GETs fail (throttled, reset, cut short): every sample once, in the order
    of the same stream read a block per GET."""
    index = {"samples_per_shard": shards.counts}

    def epoch(endpoint: str, chunk: int) -> list[str]:
        with ShardStream(
            "s3://parts/p/",
            s3=S3Options(endpoint_url=endpoint),
            order=OrderConfig(seed=3, window=3, block_bytes=BLOCK),
            fetch=FetchConfig(
                chunk_bytes=chunk, inflight=4, retry=FAST_RETRY, timeouts=SHORT, hedge=False
            ),
            **index,  # type: ignore[arg-type]
        ) as stream:
            return [s["__key__"] for s in stream]

    whole = epoch(s3_server.endpoint_url, BLOCK)
    plan = FaultPlan(slowdown=0.04, reset=0.03, truncate=0.03, match=".tar")
    with FaultProxy(s3_server.endpoint_url, faults=plan, seed=5) as faulty:
        parts = epoch(faulty.endpoint_url, PART)
        counts = faulty.stats()
        injected = sum(counts.get(kind, 0) for kind in ("slowdown", "reset", "truncate"))
    assert parts == whole
    assert sorted(parts) == sorted(shards.keys)
    assert injected > 0


def test_blocks_read_in_parts_over_https(
    shards: ForeignShards, s3_tls_server: LocalS3, s3_server: LocalS3
) -> None:
    """The same blocks in parts over HTTPS (the direct transport's TLS path): the same
    order as the stream of a GET a block over HTTP."""

    def epoch(options: S3Options, chunk: int) -> tuple[list[str], dict[str, int]]:
        with ShardStream(
            "s3://parts/p/",
            s3=options,
            samples_per_shard=shards.counts,
            order=OrderConfig(seed=6, window=3, block_bytes=BLOCK),
            fetch=FetchConfig(chunk_bytes=chunk, inflight=4, hedge=False, coalesce_bytes=0),
        ) as stream:
            keys = [s["__key__"] for s in stream]
            fetch = stream.stats()["fetch"]
        return keys, fetch

    whole, whole_fetch = epoch(s3_server.options(), BLOCK)
    parts, parts_fetch = epoch(s3_tls_server.options(), PART)
    assert parts == whole
    assert sorted(parts) == sorted(shards.keys)
    assert parts_fetch["tls"] is True
    assert whole_fetch["part_reads"] == 0
    assert parts_fetch["part_reads"] > parts_fetch["chunks"]  # blocks of several GETs


def test_blocks_read_in_parts_are_cached_whole(
    shards: ForeignShards, proxy: FaultProxy, tmp_path: Path
) -> None:
    """The cache sits above the parts: the first epoch keeps whole blocks, the second is
    served from them without a GET."""

    def epoch() -> tuple[list[str], int, dict[str, int]]:
        before = len(shard_ranges(proxy))
        with ShardStream(
            "s3://parts/p/",
            s3=S3Options(endpoint_url=proxy.endpoint_url),
            samples_per_shard=shards.counts,
            order=OrderConfig(seed=1, window=2, block_bytes=BLOCK),
            fetch=FetchConfig(chunk_bytes=PART, inflight=2, hedge=False),
            cache=CacheConfig(path=tmp_path / "cache"),
        ) as stream:
            keys = [s["__key__"] for s in stream]
            cache = stream.stats()["fetch"]["cache"]
        return keys, len(shard_ranges(proxy)) - before, cache

    cold, cold_gets, cold_cache = epoch()
    warm, warm_gets, warm_cache = epoch()
    assert cold == warm
    assert sorted(cold) == sorted(shards.keys)
    assert cold_gets > cold_cache["misses"]  # blocks of several parts each
    assert cold_cache["hits"] == 0
    assert warm_gets == 0
    assert warm_cache["hits"] == cold_cache["misses"]
