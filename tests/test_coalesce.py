"""One GET for consecutive chunks of an object (``EngineConfig.coalesce_bytes``).

Each chunk still has its slot and is handed over the moment it is whole; a failed GET is
taken up again from the first chunk not yet whole. Counted at a real proxy, on shards
that ``pack`` did not write.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from asyncstream import (
    FetchConfig,
    LocalS3,
    NotFoundError,
    S3Options,
    ShardStream,
    resolve_shards,
)
from asyncstream.engine._engine import Engine, EngineConfig
from asyncstream.stores._errors import ChunkFailure
from asyncstream.stores._localstore import LocalStore
from asyncstream.stores._store import ChunkRequest
from asyncstream.testing import FaultProxy
from tests._foreign import ForeignShards, write_foreign_shards
from tests._servers import FAST_RETRY, SHORT
from tests.test_engine import chunks_of, drain

CHUNK = 16 << 10


@pytest.fixture(scope="module")
def shards(s3_server: LocalS3, tmp_path_factory: pytest.TempPathFactory) -> ForeignShards:
    data = write_foreign_shards(tmp_path_factory.mktemp("coalesce"), 6, seed=4)
    client = s3_server.client()
    client.create_bucket(Bucket="coalesce")
    for path in sorted(data.folder.glob("*.tar")):
        client.put_object(Bucket="coalesce", Key=f"c/{path.name}", Body=path.read_bytes())
    return data


def blobs(data: ForeignShards) -> dict[str, bytes]:
    return {
        f"s3://coalesce/c/{path.name}": path.read_bytes()
        for path in sorted(data.folder.glob("*.tar"))
    }


def shard_gets(proxy: FaultProxy) -> int:
    return sum(1 for method, path, _ in proxy.requests() if method == "GET" and ".tar" in path)


def engine(proxy: FaultProxy, transport: str, coalesce: int = 4 * CHUNK) -> Engine:
    config = EngineConfig(
        inflight=4,
        retry=FAST_RETRY,
        timeouts=SHORT,
        s3=S3Options(endpoint_url=proxy.endpoint_url).resolve(),
        transport=transport,  # type: ignore[arg-type]
        coalesce_bytes=coalesce,
        hedge=False,
    )
    return Engine(config, n_slots=12, slot_bytes=CHUNK)


def test_consecutive_chunks_share_a_get(
    shards: ForeignShards, proxy: FaultProxy, transport: str
) -> None:
    listed = resolve_shards("s3://coalesce/c/", S3Options(endpoint_url=proxy.endpoint_url))
    requests = chunks_of(listed, CHUNK)
    before = shard_gets(proxy)
    with engine(proxy, transport) as e:
        got = drain(e, requests)
        stats = e.stats()
    assert got == blobs(shards)
    assert stats["chunks"] == len(requests)
    gets = shard_gets(proxy) - before
    # At most 4 chunks a GET, and never across objects.
    assert sum(-(-len(range(0, s.size, CHUNK)) // 4) for s in listed) <= gets < len(requests)
    # The engine counts the same GETs, and the chunks that rode on another's.
    assert stats["requests"] == gets
    assert stats["coalesced_chunks"] == len(requests) - gets


def test_interleaved_chunks_still_coalesce(shards: ForeignShards, proxy: FaultProxy) -> None:
    """A stream's prefetch interleaves its shards: a chunk's successor is a few behind it."""
    listed = resolve_shards("s3://coalesce/c/", S3Options(endpoint_url=proxy.endpoint_url))
    a, b = chunks_of(listed[:1], CHUNK), chunks_of(listed[1:2], CHUNK)
    requests = [r for pair in zip(a, b, strict=False) for r in pair]
    requests += a[len(b) :] + b[len(a) :]
    before = shard_gets(proxy)
    with engine(proxy, "auto") as e:
        got = drain(e, requests)
    expected = blobs(shards)
    assert got == {url: expected[url] for url in got}
    assert shard_gets(proxy) - before < len(requests) / 2


def test_groups_share_the_free_slots_so_every_connection_works(
    s3_server: LocalS3, shards: ForeignShards, proxy: FaultProxy, transport: str
) -> None:
    """One object of 12 chunks, 12 free slots, K = 4, groups of up to 8 chunks allowed:
    4 GETs of 3 chunks, not one of 8 and one of 4 (two connections idle, each GET at one
    connection's speed)."""
    body = bytes(range(256)) * (12 * CHUNK // 256)
    s3_server.client().put_object(Bucket="coalesce", Key="fair/x.tar", Body=body)
    (shard,) = resolve_shards("s3://coalesce/fair/", S3Options(endpoint_url=proxy.endpoint_url))
    requests = chunks_of([shard], CHUNK)
    assert len(requests) == 12
    before = shard_gets(proxy)
    with engine(proxy, transport, coalesce=8 * CHUNK) as e:
        assert e.ring.n_slots == 12
        got = drain(e, requests)
        stats = e.stats()
    assert got == {shard.url: body}
    # Every slot was free when the 12 were submitted: 12 / 4 = 3 chunks a GET.
    assert shard_gets(proxy) - before == stats["requests"] == 4
    assert stats["coalesced_chunks"] == 8


def test_a_group_cut_mid_body_resumes_from_its_first_unfinished_chunk(
    shards: ForeignShards, proxy: FaultProxy, transport: str
) -> None:
    listed = resolve_shards("s3://coalesce/c/", S3Options(endpoint_url=proxy.endpoint_url))
    requests = chunks_of(listed[:2], CHUNK)
    before = len(proxy.ranged_requests())
    with engine(proxy, transport) as e:
        # 2.5 chunks of the first group arrive, then the connection is reset.
        proxy.inject("reset", after_bytes=int(2.5 * CHUNK), match=".tar")
        got = drain(e, requests)
        stats = e.stats()
    expected = blobs(shards)
    assert got == {url: expected[url] for url in got}
    assert stats["retries_total"] == 1
    assert stats["chunks"] == len(requests)
    # The retry asked for the cut group from its third chunk on (the first two were whole)
    # to the same end. Which group the proxy cuts is whichever response reaches it first
    # (four GETs are in flight), so the pair is looked for in either object.
    ranges = {
        shard.url.rsplit("/", 1)[1]: [
            tuple(int(n) for n in header.removeprefix("bytes=").split("-"))
            for method, path, header, _ in proxy.ranged_requests()[before:]
            if method == "GET" and path.endswith(shard.url.rsplit("/", 1)[1]) and header
        ]
        for shard in listed[:2]
    }
    resumed = [
        (name, start, stop)
        for name, spans in ranges.items()
        for start, stop in spans
        for other_start, other_stop in spans
        if other_stop == stop and start - other_start == 2 * CHUNK
    ]
    assert len(resumed) == 1, ranges
    asked = sum(stop + 1 - start for spans in ranges.values() for start, stop in spans)
    size = sum(shard.size for shard in listed[:2])
    assert 0 < asked - size <= 2 * CHUNK  # asked twice: the group's rest only


def test_a_missing_object_fails_every_chunk_of_its_group(
    s3_server: LocalS3, shards: ForeignShards, proxy: FaultProxy, transport: str
) -> None:
    client = s3_server.client()
    source = next(iter(blobs(shards).values()))
    client.put_object(Bucket="coalesce", Key="gone/x.tar", Body=source)
    (shard,) = resolve_shards("s3://coalesce/gone/", S3Options(endpoint_url=proxy.endpoint_url))
    client.delete_object(Bucket="coalesce", Key="gone/x.tar")
    requests = chunks_of([shard], CHUNK)[:4]
    with engine(proxy, transport) as e:
        e.submit(requests)
        for _ in requests:
            with pytest.raises(NotFoundError, match=r"gone/x\.tar"):
                e.next()
        assert e.stats()["retries_total"] == 0


def test_a_stream_of_small_chunks_coalesces_and_stays_exact(
    shards: ForeignShards, proxy: FaultProxy
) -> None:
    def epoch(coalesce: int) -> tuple[list[str], int]:
        before = shard_gets(proxy)
        with ShardStream(
            "s3://coalesce/c/",
            s3=S3Options(endpoint_url=proxy.endpoint_url),
            samples_per_shard=shards.counts,
            window=3,
            seed=2,
            fetch=FetchConfig(chunk_bytes=CHUNK, inflight=4, hedge=False, coalesce_bytes=coalesce),
        ) as stream:
            keys = [s["__key__"] for s in stream]
        return keys, shard_gets(proxy) - before

    alone, gets_alone = epoch(0)
    together, gets_together = epoch(8 << 20)
    assert together == alone  # the same samples in the same order
    assert sorted(alone) == sorted(shards.keys)
    assert gets_together < gets_alone


# --------------------------------------------------------------------------- local files


def test_local_files_read_consecutive_chunks_by_one_preadv_and_stay_exact(
    shards: ForeignShards,
) -> None:
    """Local files coalesce too (one thread hand-off and one ``preadv`` a group): the same
    bytes per chunk as chunk by chunk, fewer reads."""
    found = resolve_shards(str(shards.folder))
    requests = chunks_of(found, CHUNK)
    expected = {s.url: (shards.folder / s.url.rsplit("/", 1)[1]).read_bytes() for s in found}

    def read(coalesce: int) -> tuple[dict[str, bytes], dict[str, int]]:
        config = EngineConfig(inflight=2, coalesce_bytes=coalesce, hedge=False)
        with Engine(config, n_slots=12, slot_bytes=CHUNK) as e:
            return drain(e, requests), e.stats()

    alone, stats_alone = read(0)
    together, stats_together = read(8 * CHUNK)
    assert alone == together == expected
    assert stats_alone["coalesced_chunks"] == 0
    assert stats_alone["requests"] == len(requests)
    # a local group takes every free slot it can (no connection's rate to share out):
    # most of a shard's chunks (5 to 9 of 16 KiB here, 8 at most a group) in one read
    assert stats_together["requests"] * 3 <= len(requests)
    assert stats_together["coalesced_chunks"] == len(requests) - stats_together["requests"]


def test_a_local_group_cut_short_hands_over_its_whole_chunks_and_names_the_file(
    tmp_path: Path,
) -> None:
    """A file shorter than its listing (truncated after the open): the chunks of a group
    that were read whole are handed over; the first that is not fails, naming the file
    and what was read, after the retries."""
    path = tmp_path / "cut.tar"
    payload = bytes(range(256)) * 40  # 10,240 bytes
    path.write_bytes(payload[:7000])
    outs = [bytearray(4096), bytearray(4096), bytearray(2048)]
    handed: list[int] = []

    async def group() -> None:
        request = ChunkRequest(path.as_uri(), 0, 10_240, None, True)
        await LocalStore().read_group(request, [memoryview(b) for b in outs], handed.append)

    with pytest.raises(ChunkFailure, match=r"read 7000 of 10240 bytes from .*cut\.tar"):
        asyncio.run(group())
    assert handed == [0]  # the first chunk was whole; the second was not
    assert bytes(outs[0]) == payload[:4096]

    async def changed() -> None:
        request = ChunkRequest(path.as_uri(), 0, 4096, None, False, size=10_240)
        await LocalStore().read_into(request, memoryview(outs[0]))

    with pytest.raises(ChunkFailure, match="its size is 7000, not 10240"):
        asyncio.run(changed())
