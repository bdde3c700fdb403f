"""Several datasets mixed in one ShardStream (``asyncstream.dataset._sources``, through the stream):
shares, determinism, each-once-before-twice, exact and elastic resume with
StatefulDataLoader and DALIImageLoader, per-source endpoints, failures, bad input.

The shards are not ``pack``'s (``tarfile`` and ``webdataset.TarWriter``, see
``tests/_foreign.py``), 100 samples each where shares are measured; one source is read from
a real moto server, the other from local files.
"""

from __future__ import annotations

import collections
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

from asyncstream import (
    CorruptTarError,
    LocalS3,
    NotFoundError,
    PermanentFetchError,
    S3Options,
    ShardStream,
    Source,
    StateError,
    mixing_quality,
)
from asyncstream.testing import FaultPlan, FaultProxy, TestCertificates, generate_imagefolder
from dali_ops import DALIImageLoader, PipelineSettings
from tests._foreign import ForeignShards, write_foreign_shards
from tests._resume_child import keys, record_epochs

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

HERE = Path(__file__).parent
STREAM: dict[str, Any] = {"window": 16, "inflight": 4, "chunk_bytes": 64 << 10, "seed": 5}


def upload(client: Any, bucket: str, prefix: str, data: ForeignShards) -> str:
    for path in sorted(data.folder.glob("*.tar")):
        client.put_object(Bucket=bucket, Key=f"{prefix}{path.name}", Body=path.read_bytes())
    return f"s3://{bucket}/{prefix}"


@pytest.fixture(scope="module")
def s3_bucket(s3_server: LocalS3) -> str:
    name = f"mix-{os.getpid()}"
    s3_server.client().create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="module")
def big(
    tmp_path_factory: pytest.TempPathFactory, s3_server: LocalS3, s3_bucket: str
) -> dict[str, Any]:
    """Curated: 40 local shards of 100 samples; web: 30 shards of 100 on S3."""
    root = tmp_path_factory.mktemp("big")
    curated = write_foreign_shards(
        root / "curated", 0, counts=[100] * 40, jpg_bytes=(50, 400), prefix="cur", seed=1
    )
    web = write_foreign_shards(
        root / "web", 0, counts=[100] * 30, jpg_bytes=(50, 400), prefix="web", seed=2
    )
    url = upload(s3_server.client(), s3_bucket, "web/", web)
    return {"curated": curated, "web": web, "web_url": url}


def big_sources(big: dict[str, Any]) -> list[Source]:
    return [
        Source(str(big["curated"].folder), weight=3, name="curated"),  # 7,500 of 4,000: up
        Source(big["web_url"], weight=1, name="web"),  # 2,500 of 3,000: down
    ]


def big_stream(big: dict[str, Any], s3_server: LocalS3, **kwargs: Any) -> ShardStream:
    return ShardStream(
        big_sources(big), epoch_size=10_000, s3=s3_server.options(), **{**STREAM, **kwargs}
    )


def test_shares_over_an_epoch_and_in_every_window_of_640(
    big: dict[str, Any], s3_server: LocalS3
) -> None:
    with big_stream(big, s3_server) as stream:
        assert stream.sources == {"curated": 7_500, "web": 2_500}
        assert len(stream) == stream.epoch_samples == 10_000
        # One engine, one ring: (window + prefetch + hedge slot) x chunk.
        assert stream.ring_bytes == (16 + 8 + 1) * (64 << 10)
        samples = list(stream)
        stats = stream.stats()
    order = [s["__source__"] for s in samples]
    assert len(order) == 10_000
    shares = {"curated": 0.75, "web": 0.25}
    for name, share in shares.items():
        assert abs(order.count(name) / 10_000 - share) <= 0.01
    assert mixing_quality(order, shares, window=640).worst_window <= 0.05
    # Each sample says its source, and comes from that source's shards.
    curated = set(big["curated"].keys)
    assert all((s["__key__"] in curated) == (s["__source__"] == "curated") for s in samples)
    assert all(s["__url__"].startswith(big["web_url"]) for s in samples if s["__source__"] == "web")
    assert stats["sources"]["curated"] == {
        "drawn": order.count("curated"),
        "planned": 7_500,
        "epoch_quota": 7_500,
        "shards": 40,
    }
    assert stats["sources"]["web"]["drawn"] == order.count("web") == 2_500
    assert set(stats["index"]) == {"curated", "web"}  # where each source's counts came from
    # Downsampled: 2,500 different web samples; upsampled: every curated one, some twice.
    web = collections.Counter(s["__key__"] for s in samples if s["__source__"] == "web")
    assert len(web) == 2_500
    cur = collections.Counter(s["__key__"] for s in samples if s["__source__"] == "curated")
    assert set(cur) == curated
    assert set(cur.values()) == {1, 2}


def sources_of(batch: list[dict[str, Any]]) -> list[str]:
    return [sample["__source__"] for sample in batch]


def test_every_batch_of_each_dataloader_worker_holds_the_proportions(
    big: dict[str, Any], s3_server: LocalS3
) -> None:
    """Each worker mixes its own share: 3 : 1 in every full batch of 64 (48 and 16, to a
    sample), whatever worker made it."""
    with big_stream(big, s3_server, rank=1, world_size=2) as stream:
        loader = StatefulDataLoader(stream, batch_size=64, num_workers=2, collate_fn=sources_of)
        batches = list(loader)
        del loader
    assert sum(len(b) for b in batches) == 5_000
    for batch in batches:
        if len(batch) == 64:
            assert 47 <= batch.count("curated") <= 49, batch


def test_same_seed_same_order_another_seed_or_epoch_another(
    big: dict[str, Any], s3_server: LocalS3
) -> None:
    def first(n: int, **kwargs: Any) -> list[str]:
        epoch = kwargs.pop("epoch", 0)
        with big_stream(big, s3_server, **kwargs) as stream:
            stream.set_epoch(epoch)
            it = iter(stream)
            return [next(it)["__key__"] for _ in range(n)]

    a = first(1_500)
    assert a == first(1_500)
    assert a != first(1_500, seed=6)
    assert a != first(1_500, epoch=1)


# -- each once before any twice, over epochs, ranks and workers ----------------------------


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ForeignShards]:
    """Two local sources of 500 and 400 samples, shards of 50 (members larger than a
    chunk, so samples straddle chunks)."""
    root = tmp_path_factory.mktemp("small")
    return {
        "up": write_foreign_shards(root / "up", 0, counts=[50] * 10, prefix="up", seed=3),
        "down": write_foreign_shards(root / "down", 0, counts=[50] * 8, prefix="dn", seed=4),
    }


SMALL = {**STREAM, "window": 4, "chunk_bytes": 16 << 10, "epoch_size": 1_000}


def small_sources(small: dict[str, ForeignShards]) -> list[dict[str, Any]]:
    """750 of 500 samples a epoch (upsampled), 250 of 400 (downsampled), as JSON."""
    return [
        {"urls": str(small["up"].folder), "weight": 3, "name": "up"},
        {"urls": str(small["down"].folder), "samples": 250, "name": "down"},
    ]


def small_stream(small: dict[str, ForeignShards], **kwargs: Any) -> ShardStream:
    sources = [Source(**s) for s in small_sources(small)]
    return ShardStream(sources, **{**SMALL, **kwargs})


def test_upsampled_and_downsampled_sources_draw_each_sample_once_before_twice(
    small: dict[str, ForeignShards],
) -> None:
    """Over 3 epochs, 2 ranks x 2 DataLoader workers: after every epoch, any two samples
    of a source have been drawn a number of times within one of each other."""
    drawn: collections.Counter[str] = collections.Counter()
    for epoch in range(3):
        for rank in range(2):
            with small_stream(small, rank=rank, world_size=2) as stream:
                stream.set_epoch(epoch)
                loader = StatefulDataLoader(stream, batch_size=10, num_workers=2, collate_fn=keys)
                drawn.update(k for batch in loader for k in batch)
                del loader
        for name, data in (("up", small["up"]), ("down", small["down"])):
            times = [drawn[k] for k in data.keys]
            assert max(times) - min(times) <= 1, f"{name} after epoch {epoch}"
        assert sum(drawn[k] for k in small["up"].keys) == 750 * (epoch + 1)
        assert sum(drawn[k] for k in small["down"].keys) == 250 * (epoch + 1)
    # 2,250 draws of 500 samples: each 4 or 5 times; 750 of 400: once or twice.
    assert {drawn[k] for k in small["up"].keys} == {4, 5}
    assert {drawn[k] for k in small["down"].keys} == {1, 2}


# -- exact resume ---------------------------------------------------------------------------


def run_child(tmp_path: Path, spec: dict[str, Any]) -> Any:
    spec_path, out_path = tmp_path / "spec.json", tmp_path / "out.json"
    spec_path.write_text(json.dumps(spec))
    result = subprocess.run(
        [sys.executable, str(HERE / "_resume_child.py"), str(spec_path), str(out_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(HERE.parent)},
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out_path.read_text())


@pytest.mark.parametrize("rank", [0, 1])
def test_stateful_dataloader_resumes_a_mixed_stream_exactly_in_a_fresh_process(
    small: dict[str, ForeignShards], tmp_path: Path, rank: int
) -> None:
    loader_kwargs = {"batch_size": 8, "num_workers": 2}
    stream_kwargs = {**SMALL, "rank": rank, "world_size": 2}
    with small_stream(small, rank=rank, world_size=2) as stream:
        loader = StatefulDataLoader(stream, collate_fn=keys, **loader_kwargs)
        epochs, states = record_epochs(stream, loader)
        del loader
    n0 = len(epochs[0])
    points = [(0, 1), (0, n0 // 2), (0, n0 - 3), (1, 5)]
    spec = {
        "sources": small_sources(small),
        "stream": stream_kwargs,
        "loader": loader_kwargs,
        "epochs": 2,
        "saves": [{"epoch": e, "state": json.loads(states[e][j - 1])} for e, j in points],
    }
    for (e, j), got in zip(points, run_child(tmp_path, spec), strict=True):
        expected = epochs[e][j:] + [b for later in epochs[e + 1 :] for b in later]
        assert got == expected, f"resumed after batch {j} of epoch {e}"


def test_elastic_resume_of_a_mixed_stream_reads_the_rest_of_the_epoch_exactly(
    small: dict[str, ForeignShards],
) -> None:
    """2 ranks x 2 workers, saved mid-epoch, onto 3 ranks x 1 worker: what was read before
    and after is the epoch's planned samples exactly (repeats of the upsampled source
    included), and every new rank takes the same number of steps."""
    with small_stream(small) as stream:
        stream.set_epoch(1)
        planned = collections.Counter(s["__key__"] for s in stream)
    before: list[str] = []
    states = []
    for rank, n in ((0, 6), (1, 7)):  # 13 batches of 4 leave 948 samples: 316 per new rank
        with small_stream(small, rank=rank, world_size=2) as stream:
            stream.set_epoch(1)
            loader = StatefulDataLoader(stream, batch_size=4, num_workers=2, collate_fn=keys)
            it = iter(loader)
            for _ in range(n):
                before.extend(next(it))
            states.append(json.loads(json.dumps(loader.state_dict())))
            del it, loader
    after: list[str] = []
    steps = []
    for rank in range(3):
        with small_stream(small, rank=rank, world_size=3) as stream:
            stream.load_state_dict(states)
            loader = StatefulDataLoader(stream, batch_size=4, num_workers=1, collate_fn=keys)
            batches = list(loader)
            steps.append(len(batches))
            after.extend(k for b in batches for k in b)
            del loader
    assert collections.Counter(before + after) == planned
    assert len(set(steps)) == 1


@pytest.fixture(scope="module")
def jpeg_sources(tmp_path_factory: pytest.TempPathFactory) -> list[ForeignShards]:
    root = tmp_path_factory.mktemp("mixjpegs")
    paths = generate_imagefolder(root / "images", 16, 2, seed=0, workers=1)
    jpgs = [path.read_bytes() for path in paths]
    return [
        write_foreign_shards(root / "a", 0, counts=[12] * 4, jpgs=jpgs, prefix="ja"),
        write_foreign_shards(root / "b", 0, counts=[10] * 3, jpgs=jpgs, prefix="jb"),
    ]


@pytest.mark.parametrize("world", [2, 3])
def test_dali_loader_resumes_a_mixed_stream(jpeg_sources: list[ForeignShards], world: int) -> None:
    """Saved on 2 ranks after a few batches: onto 2 ranks each continues with exactly the
    batches the uninterrupted run read next; onto 3, the rest of the epoch exactly once."""
    settings = PipelineSettings(image_size=32, num_threads=1, seed=3)
    sources = [
        Source(str(jpeg_sources[0].folder), weight=1, name="a"),
        Source(str(jpeg_sources[1].folder), samples=48, name="b"),  # 30 held: upsampled
    ]

    def loader(rank: int, ranks: int) -> DALIImageLoader:
        stream = ShardStream(
            sources, rank=rank, world_size=ranks, epoch_size=96, **{**STREAM, "window": 3}
        )
        return DALIImageLoader(stream, 8, device="cpu", settings=settings)

    def batch_keys(dali: DALIImageLoader) -> list[str]:
        return [key for _, key in dali.last_keys]

    full: list[list[list[str]]] = []  # per old rank, every batch's keys
    before: list[str] = []
    states = []
    for rank, n in ((0, 1), (1, 2)):  # 96 - 3 x 8 = 72 left: 2 and 3 ranks divide it
        with loader(rank, 2) as old:
            full.append([batch_keys(old) for _ in old])
        with loader(rank, 2) as old:
            it = iter(old)
            for _ in range(n):
                next(it)
                before.extend(batch_keys(old))
            states.append(old.state_dict())
    after: list[str] = []
    for rank in range(world):
        with loader(rank, world) as new:
            new.load_state_dict(states if world != 2 else states[rank])
            rest = []
            for _ in new:
                rest.append(batch_keys(new))
            after.extend(k for b in rest for k in b)
            if world == 2:
                assert rest == full[rank][(1, 2)[rank] :]
    everything = collections.Counter(before + after)
    assert everything == collections.Counter(k for r in full for b in r for k in b)


# -- per-source endpoints, failures ---------------------------------------------------------


def test_sources_on_different_endpoints_share_one_engine(
    big: dict[str, Any], s3_server: LocalS3
) -> None:
    """The web source through a proxy (its own endpoint), the curated one local: one
    engine reads both, and the proxy sees only the web source's requests."""
    with FaultProxy(s3_server.endpoint_url) as proxy:
        sources = [
            Source(str(big["curated"].folder), weight=1, name="curated"),
            Source(big["web_url"], weight=1, name="web", endpoint_url=proxy.endpoint_url),
        ]
        with ShardStream(sources, epoch_size=2_000, s3=s3_server.options(), **STREAM) as s:
            got = collections.Counter(x["__source__"] for x in s)
            fetch = s.stats()["fetch"]
        assert got == {"curated": 1_000, "web": 1_000}
        assert proxy.stats()["requests"] >= 10  # 10 web shards at least
        assert len(fetch["endpoints"]) == 1  # the proxy's store beside the stream's own


def test_a_source_on_its_own_endpoint_never_reads_from_the_streams(
    big: dict[str, Any], s3_server: LocalS3
) -> None:
    """The stream's own endpoint is an empty server; the web source names the one that
    holds its shards. With chunks small enough to be fetched several to a GET, every
    read (single or coalesced) goes to the source's endpoint."""
    with (
        LocalS3(mode="process") as empty,
        FaultProxy(empty.endpoint_url) as default,
        FaultProxy(s3_server.endpoint_url) as proxy,
    ):
        sources = [
            Source(str(big["curated"].folder), weight=1, name="curated"),
            Source(big["web_url"], weight=1, name="web", endpoint_url=proxy.endpoint_url),
        ]
        options = S3Options(endpoint_url=default.endpoint_url)
        small = {**STREAM, "chunk_bytes": 8 << 10, "prefetch": 16}  # followers wait
        with ShardStream(sources, epoch_size=2_000, s3=options, **small) as s:
            got = collections.Counter(x["__source__"] for x in s)
            fetch = s.stats()["fetch"]
    assert got == {"curated": 1_000, "web": 1_000}
    assert fetch["coalesced_chunks"] > 0  # groups were read, not only single chunks
    assert [r for r in default.requests() if r[0] == "GET"] == []  # none at the stream's
    assert fetch["endpoints"][0]["transport"] == "direct"


def test_a_source_over_https_with_faults_reads_the_same_epoch_as_over_http(
    big: dict[str, Any], s3_server: LocalS3, certs: TestCertificates
) -> None:
    """The web source behind a TLS proxy that resets and throttles some GETs, trusted
    through its own ``S3Options(ca_bundle=)``; the curated one local. The epoch is the one
    the same sources give over plain HTTP: same samples, same order, same bytes."""

    def epoch(web: Source) -> list[tuple[str, str, bytes]]:
        sources = [Source(str(big["curated"].folder), weight=3, name="curated"), web]
        with ShardStream(sources, epoch_size=4_000, s3=s3_server.options(), **STREAM) as s:
            return [(x["__source__"], x["__key__"], x["jpg"]) for x in s]

    plain = epoch(Source(big["web_url"], weight=1, name="web"))
    faults = FaultPlan(reset=0.1, slowdown=0.1, match="web-")
    with FaultProxy(s3_server.endpoint_url, tls=certs.server, faults=faults, seed=3) as proxy:
        options = S3Options(endpoint_url=proxy.endpoint_url, ca_bundle=certs.ca)
        assert options.endpoint_url is not None
        assert options.endpoint_url.startswith("https://")
        tls = epoch(Source(big["web_url"], weight=1, name="web", s3=options))
        counts = proxy.stats()
    assert tls == plain
    assert collections.Counter(src for src, _, _ in tls) == {"curated": 3_000, "web": 1_000}
    assert counts["reset"] > 0
    assert counts["slowdown"] > 0


def test_a_source_whose_shard_cannot_be_read_fails_naming_the_source_and_the_shard(
    big: dict[str, Any], s3_server: LocalS3
) -> None:
    with FaultProxy(s3_server.endpoint_url) as proxy:
        options = S3Options(endpoint_url=proxy.endpoint_url)
        sources = big_sources(big)
        with ShardStream(sources, epoch_size=10_000, s3=options, **STREAM) as stream:
            proxy.inject("status", status=403, count=1_000, match="web-0000", method="GET")
            with pytest.raises(PermanentFetchError) as caught:
                for _ in stream:
                    pass
    message = str(caught.value)
    assert message.startswith("source 'web': ")
    assert "web/web-0000" in message


def test_a_corrupt_shard_fails_naming_its_source(
    small: dict[str, ForeignShards], tmp_path: Path
) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    for path in small["down"].folder.glob("*.tar"):
        (bad / path.name).write_bytes(path.read_bytes())
    target = sorted(bad.glob("*.tar"))[3]
    data = bytearray(target.read_bytes())
    data[512 * 4 : 512 * 5] = b"\xff" * 512  # a header of garbage
    target.write_bytes(bytes(data))
    sources = [
        Source(str(small["up"].folder), name="up"),
        Source(str(bad), name="broken", samples_per_shard=small["down"].counts),
    ]
    with (
        ShardStream(sources, **{**SMALL, "epoch_size": 900}) as stream,
        pytest.raises(CorruptTarError) as caught,
    ):
        for _ in stream:
            pass
    assert str(caught.value).startswith("source 'broken': ")
    assert target.name in str(caught.value)


def test_a_source_that_is_not_there_fails_at_construction_naming_it(
    s3_server: LocalS3, s3_bucket: str, small: dict[str, ForeignShards]
) -> None:
    sources = [
        Source(str(small["up"].folder), name="up"),
        Source(f"s3://{s3_bucket}/nothing-here/", name="missing"),
    ]
    with pytest.raises(NotFoundError, match=r"^source 'missing': .*nothing-here"):
        ShardStream(sources, s3=s3_server.options(), **SMALL)


# -- bad input ------------------------------------------------------------------------------


def empty_tar(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w"):
        pass
    (folder / "empty-000.tar").write_bytes(buf.getvalue())
    return folder


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda up, down: [Source(up, weight=-1, name="neg"), Source(down)], r"'neg'.*>= 0"),
        (
            lambda up, down: [Source(up, weight=0, name="a"), Source(down, weight=0, name="b")],
            r"weights of sources 'a', 'b' are zero in total",
        ),
        (
            lambda up, down: [Source(up, weight=2, samples=100, name="both"), Source(down)],
            r"source 'both' has weight=2 and samples=100",
        ),
        (lambda up, down: [Source(up), Source([], name="nothing")], r"'nothing' is empty"),
        (lambda up, down: [Source(up), Source("", name="blank")], r"'blank' is empty"),
        (
            lambda up, down: [Source(up, samples=0, name="zero"), Source(down)],
            r"'zero': samples must be >= 1",
        ),
        (
            lambda up, down: [Source(up, name="x"), Source(down, name="x")],
            r"two sources are named 'x'",
        ),
        (
            lambda up, down: [
                Source(up, samples=300, name="a"),
                Source(down, samples=400, name="b"),
            ],
            r"epoch_size=1000 conflicts .*'a': 300, 'b': 400",
        ),
    ],
)
def test_bad_weights_counts_and_empty_sources_are_a_value_error_naming_the_source(
    small: dict[str, ForeignShards], make: Any, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        ShardStream(make(str(small["up"].folder), str(small["down"].folder)), **SMALL)


def test_a_source_whose_shards_hold_no_sample_is_a_value_error_naming_it(
    small: dict[str, ForeignShards], tmp_path: Path
) -> None:
    sources = [Source(str(small["up"].folder)), Source(str(empty_tar(tmp_path)), name="hollow")]
    with pytest.raises(ValueError, match=r"source 'hollow' is empty: its 1 shards hold no sample"):
        ShardStream(sources, **SMALL)
    with pytest.raises(ValueError, match=r"^source 'given': samples_per_shard"):
        ShardStream(
            [
                Source(str(small["up"].folder)),
                Source(str(small["down"].folder), name="given", samples_per_shard=[0] * 8),
            ],
            **SMALL,
        )


def test_other_misuse_says_what_to_do(small: dict[str, ForeignShards]) -> None:
    up, down = str(small["up"].folder), str(small["down"].folder)
    with pytest.raises(TypeError, match="not both"):
        ShardStream([Source(up), down], **SMALL)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="window=1 is less than the 2 sources"):
        ShardStream([Source(up), Source(down)], **{**SMALL, "window": 1})
    with pytest.raises(ValueError, match=r"give ShardStream a list of asyncstream\.Source"):
        ShardStream(up, epoch_size=100, samples_per_shard=small["up"].counts)
    with pytest.raises(ValueError, match="give samples_per_shard and split to each Source"):
        ShardStream([Source(up), Source(down)], samples_per_shard=50, **SMALL)
    with pytest.raises(TypeError, match="weight must be a number"):
        Source(up, weight="3")  # type: ignore[arg-type]


# -- state ----------------------------------------------------------------------------------


def test_a_mixed_state_fits_only_the_same_sources_and_says_so(
    small: dict[str, ForeignShards],
) -> None:
    with small_stream(small) as stream:
        it = iter(stream)
        for _ in range(37):
            next(it)
        state = stream.state_dict()
    assert state["version"] == 3
    assert [s["name"] for s in state["sources"]] == ["up", "down"]
    assert sum(state["position"]["sources"]["drawn"]) == 37
    with (
        small_stream(small, epoch_size=1_100) as other,  # up's quota changes
        pytest.raises(StateError, match="sources="),
    ):
        other.load_state_dict(state)
    broken = json.loads(json.dumps(state))
    broken["position"]["sources"]["drawn"] = [1, 2, 3]
    with small_stream(small) as again, pytest.raises(StateError, match="sources must have 2"):
        again.load_state_dict(broken)
    with small_stream(small) as again:
        again.load_state_dict(state)
        rest = [s["__key__"] for s in again]
    with small_stream(small) as whole:
        everything = [s["__key__"] for s in whole]
    assert rest == everything[37:]


def test_take_draws_a_mixed_stream_s_samples_in_next_s_order(
    small: dict[str, ForeignShards],
) -> None:
    """A mixed stream (upsampled and downsampled sources, samples straddling chunks) handed
    out in bulk by ``iter_views().take`` (as DALIImageLoader reads it) gives the samples of
    ``next()`` in the same order, and its state mid-epoch resumes a plain iteration exactly."""
    with small_stream(small) as stream:
        plain = [(s["__url__"], s["__key__"], s["jpg"]) for s in stream]
    got: list[tuple[str, str, bytes]] = []

    def sink(view: memoryview, url: str, record: tuple[Any, ...]) -> bool:
        fields = {
            ext: (owned if owned is not None else view[a:b].tobytes())
            for ext, a, b, owned in record[2:]
        }
        got.append((url, record[0], fields["jpg"]))
        return True

    with small_stream(small) as stream:
        views = stream.iter_views()
        while len(got) < 400 and views.take(37, sink):
            pass
        state = stream.state_dict()
    with small_stream(small) as stream:
        stream.load_state_dict(state)
        rest = [(s["__url__"], s["__key__"], s["jpg"]) for s in stream]
    assert len(plain) == 1_000
    assert got + rest == plain
