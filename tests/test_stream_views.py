"""``ShardStream.iter_views``: the samples of ``iter`` in the same order, each member a
view of the ring instead of a copy, with the same state; on shards ``pack`` did not write
(``tarfile`` and ``webdataset.TarWriter``), some samples straddling chunks, checked
against webdataset's reading of the same tars, from local files and over HTTPS."""

from __future__ import annotations

from typing import Any

import pytest

from asyncstream import LocalS3, ShardStream, StateError
from tests._foreign import ForeignShards, write_foreign_shards
from tests._wds import wds_samples

CHUNK = 16 << 10  # members up to 20 kB: samples straddle chunks, some carried as bytes


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> ForeignShards:
    return write_foreign_shards(
        tmp_path_factory.mktemp("views"), 5, seed=3, jpg_bytes=(200, 20_000)
    )


def stream(shards: ForeignShards) -> ShardStream:
    return ShardStream(
        str(shards.folder), window=3, inflight=2, chunk_bytes=CHUNK, seed=5, index_cache=False
    )


def copied(sample: dict[str, Any]) -> dict[str, Any]:
    """A sample with every view copied out at once, as a consumer of views must."""
    kinds = {type(v) for k, v in sample.items() if not k.startswith("__")}
    assert kinds <= {memoryview, bytes}
    return {k: bytes(v) if isinstance(v, memoryview) else v for k, v in sample.items()}


def test_views_give_iter_s_samples_in_iter_s_order(shards: ForeignShards) -> None:
    with stream(shards) as s:
        plain = list(s)
    with stream(shards) as s:
        views = [copied(sample) for sample in s.iter_views()]
        stats = s.stats()
    assert views == plain
    assert sorted(sample["__key__"] for sample in views) == sorted(shards.keys)
    assert stats["samples"] == shards.total


def test_members_are_views_unless_carried_across_chunks(shards: ForeignShards) -> None:
    with stream(shards) as s:
        kinds = {type(sample["jpg"]) for sample in s.iter_views()}
    assert memoryview in kinds  # not copied: the point
    assert bytes in kinds  # a sample straddling two chunks is carried in bytes


def test_a_views_state_resumes_a_plain_iteration_exactly(shards: ForeignShards) -> None:
    with stream(shards) as s:
        everything = [sample["__key__"] for sample in s]
    with stream(shards) as s:
        views = s.iter_views()
        head = [next(views)["__key__"] for _ in range(shards.total // 3)]
        state = s.state_dict()
    with stream(shards) as s:
        s.load_state_dict(state)
        tail = [sample["__key__"] for sample in s]
    assert head + tail == everything


def test_views_hold_what_webdataset_reads_from_the_same_tars(shards: ForeignShards) -> None:
    expected = {
        (path.name, sample["__key__"]): sample
        for path in sorted(shards.folder.glob("*.tar"))
        for sample in wds_samples(path.read_bytes(), path.name)
    }
    with stream(shards) as s:
        got = {
            (sample["__url__"].rsplit("/", 1)[1], sample["__key__"]): {
                k: v for k, v in copied(sample).items() if k != "__url__"
            }
            for sample in s.iter_views()
        }
    assert got == expected


def test_views_over_https_are_the_plain_iteration_s(
    shards: ForeignShards, s3_server: LocalS3, s3_tls_server: LocalS3
) -> None:
    client = s3_server.client()  # moto's backend is shared by its HTTP and HTTPS servers
    client.create_bucket(Bucket="views")
    for path in sorted(shards.folder.glob("*.tar")):
        client.put_object(Bucket="views", Key=f"v/{path.name}", Body=path.read_bytes())
    settings: dict[str, Any] = {"window": 3, "inflight": 2, "chunk_bytes": CHUNK, "seed": 5}
    with ShardStream("s3://views/v/", s3=s3_tls_server.options(), **settings) as s:
        over_https = [copied(sample) for sample in s.iter_views()]
        (store,) = s.stats()["fetch"]["stores"]
        assert store["scheme"] == "s3"
        assert store["tls"]  # read over HTTPS
    with ShardStream("s3://views/v/", s3=s3_server.options(), **settings) as s:
        assert over_https == list(s)


def record_sample(view: memoryview, url: str, record: tuple[Any, ...]) -> dict[str, Any]:
    """The dict ``iter`` gives for a record ``take`` hands over (copied out at once)."""
    sample: dict[str, Any] = {"__key__": record[0], "__url__": url}
    for ext, start, stop, owned in record[2:]:
        sample[ext] = view[start:stop].tobytes() if owned is None else owned
    return sample


def test_take_hands_over_iter_s_samples_in_iter_s_order(shards: ForeignShards) -> None:
    """Records in bulk, in batches of 7 and the epoch's end: the samples of ``iter``,
    members and all, and the same statistics."""
    with stream(shards) as s:
        plain = list(s)
    got: list[dict[str, Any]] = []
    with stream(shards) as s:
        views = s.iter_views()
        counts = []
        while n := views.take(7, lambda *a: got.append(record_sample(*a)) is None):
            counts.append(n)
        assert views.take(7, lambda *a: pytest.fail("a sample after the end")) == 0
        stats = s.stats()
    assert got == plain
    assert counts == [7] * (shards.total // 7) + ([shards.total % 7] if shards.total % 7 else [])
    assert stats["samples"] == shards.total


def test_take_stops_where_the_sink_says_and_keeps_next_s_state(shards: ForeignShards) -> None:
    """A sink that says stop ends the call after that sample, which counts as drawn; the
    state is then as after as many ``next()``, and resumes a plain iteration exactly;
    ``take`` and ``next`` mix on one iterator."""
    with stream(shards) as s:
        everything = [sample["__key__"] for sample in s]
    keys: list[str] = []

    def until_third(view: memoryview, url: str, record: tuple[Any, ...]) -> bool:
        keys.append(record[0])
        return len(keys) % 3 != 0

    with stream(shards) as s:
        views = s.iter_views()
        assert views.take(10, until_third) == 3
        keys.append(next(views)["__key__"])
        assert views.take(5, until_third) == 2
        state = s.state_dict()
    assert keys == everything[:6]
    with stream(shards) as s:
        s.load_state_dict(state)
        assert [sample["__key__"] for sample in s] == everything[6:]


def test_take_over_https_from_a_mid_epoch_state(
    shards: ForeignShards, s3_server: LocalS3, s3_tls_server: LocalS3
) -> None:
    """Over HTTPS, resumed mid-epoch: ``take`` hands over what the plain iteration of the
    same state over HTTP reads, in its order."""
    client = s3_server.client()
    client.create_bucket(Bucket="takes")
    for path in sorted(shards.folder.glob("*.tar")):
        client.put_object(Bucket="takes", Key=f"t/{path.name}", Body=path.read_bytes())
    settings: dict[str, Any] = {"window": 3, "inflight": 2, "chunk_bytes": CHUNK, "seed": 5}
    with ShardStream("s3://takes/t/", s3=s3_server.options(), **settings) as s:
        plain = iter(s)
        for _ in range(11):
            next(plain)
        state = s.state_dict()
        rest = list(plain)
    got: list[dict[str, Any]] = []
    with ShardStream("s3://takes/t/", s3=s3_tls_server.options(), **settings) as s:
        s.load_state_dict(state)
        views = s.iter_views()
        while views.take(64, lambda *a: got.append(record_sample(*a)) is None):
            pass
        assert s.stats()["fetch"]["stores"][0]["tls"]
    assert got == rest


def test_take_on_a_replaced_or_closed_iterator(shards: ForeignShards) -> None:
    """``take`` keeps ``next``'s guards: a replaced iterator refuses, a closed one is over."""
    with stream(shards) as s:
        first = s.iter_views()
        assert first.take(2, lambda *a: True) == 2
        second = s.iter_views()  # a new iteration from this thread replaces the first
        with pytest.raises(StateError, match="ended by a newer iter"):
            first.take(1, lambda *a: True)
        assert second.take(3, lambda *a: True) == 3
        second.close()
        assert second.take(3, lambda *a: pytest.fail("a sample after close")) == 0
