"""Configuration objects (``asyncstream._config``): the flat keyword arguments and the
config objects give the same stream, both at once is refused, and a checkpoint depends on
the order settings only: it resumes exactly under other fetch tuning (chunk size,
inflight, prefetch, hedging, cache, transport), with and without DataLoader workers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

from asyncstream import (
    CacheConfig,
    FetchConfig,
    IndexConfig,
    LocalS3,
    OrderConfig,
    ShardStream,
    StateError,
)
from asyncstream._config import FLAT, FlatSettings
from tests._foreign import ForeignShards, write_foreign_shards
from tests._resume_child import keys
from tests._servers import FAST_RETRY, SHORT

CHUNK = 8 << 10  # several chunks per shard, so a save lands mid-shard


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> ForeignShards:
    return write_foreign_shards(tmp_path_factory.mktemp("config"), 5, seed=4)


@pytest.fixture
def url(data: ForeignShards, s3_client: Any, bucket: str) -> str:
    for path in sorted(data.folder.glob("*.tar")):
        s3_client.put_object(Bucket=bucket, Key=f"c/{path.name}", Body=path.read_bytes())
    return f"s3://{bucket}/c/"


ORDER = OrderConfig(seed=5, window=3)
BASE = FetchConfig(inflight=4, chunk_bytes=CHUNK, retry=FAST_RETRY, timeouts=SHORT)


def tunings(tmp_path: Path) -> dict[str, dict[str, Any]]:
    """Another setting of each tuning knob: ShardStream keyword arguments."""
    return {
        # A larger GET than the saved block (the state's block is kept: one GET a block),
        # and a smaller one (each block read by four GETs at once).
        "chunk_bytes": {"fetch": FetchConfig(**{**_fields(BASE), "chunk_bytes": 2 * CHUNK})},
        "chunk_parts": {"fetch": FetchConfig(**{**_fields(BASE), "chunk_bytes": CHUNK // 4})},
        "inflight": {"fetch": FetchConfig(**{**_fields(BASE), "inflight": 1})},
        "prefetch": {"fetch": FetchConfig(**{**_fields(BASE), "prefetch": 1})},
        "hedge": {"fetch": FetchConfig(**{**_fields(BASE), "hedge": False})},
        "hedge_factor": {"fetch": FetchConfig(**{**_fields(BASE), "hedge_factor": 1.0})},
        "coalesce": {"fetch": FetchConfig(**{**_fields(BASE), "coalesce_bytes": 0})},
        "transport": {"fetch": FetchConfig(**{**_fields(BASE), "transport": "aiohttp"})},
        "cache": {"fetch": BASE, "cache": CacheConfig(path=tmp_path / "cache")},
    }


def _fields(config: FetchConfig) -> dict[str, Any]:
    return {name: getattr(config, name) for name in config.__dataclass_fields__}


def stream(url: str, s3: LocalS3, data: ForeignShards, **kwargs: Any) -> ShardStream:
    settings: dict[str, Any] = {"order": ORDER, "fetch": BASE, **kwargs}
    index = IndexConfig(samples_per_shard=data.counts)
    return ShardStream(url, s3=s3.options(), index=index, **settings)


@pytest.mark.parametrize(
    "knob",
    [
        "chunk_bytes",
        "chunk_parts",
        "inflight",
        "prefetch",
        "hedge",
        "hedge_factor",
        "coalesce",
        "transport",
        "cache",
    ],
)
def test_a_checkpoint_resumes_exactly_under_other_tuning(
    knob: str, url: str, s3_server: LocalS3, data: ForeignShards, tmp_path: Path
) -> None:
    with stream(url, s3_server, data) as s:
        it = iter(s)
        head = [next(it)["__key__"] for _ in range(23)]
        state = json.loads(json.dumps(s.state_dict()))
        rest = [sample["__key__"] for sample in it]
    with stream(url, s3_server, data, **tunings(tmp_path)[knob]) as s:
        s.load_state_dict(state)
        resumed = [sample["__key__"] for sample in s]
        if knob == "transport":
            assert s.stats()["fetch"]["transport"] == "aiohttp"
        if knob.startswith("chunk"):
            assert s._settings.chunk_bytes == CHUNK  # the saved block, in GETs of another size
    assert resumed == rest
    assert sorted(head + rest) == sorted(data.keys)


@pytest.mark.parametrize(
    "knob", ["chunk_bytes", "chunk_parts", "inflight", "prefetch", "hedge", "transport", "cache"]
)
def test_a_loader_checkpoint_resumes_exactly_under_other_tuning(
    knob: str, url: str, s3_server: LocalS3, data: ForeignShards, tmp_path: Path
) -> None:
    with stream(url, s3_server, data) as s:
        loader = StatefulDataLoader(s, batch_size=4, num_workers=2, collate_fn=keys)
        it = iter(loader)
        head = [k for _ in range(5) for k in next(it)]
        state = json.loads(json.dumps(loader.state_dict()))
        rest = [k for batch in it for k in batch]
        del it, loader
    with stream(url, s3_server, data, **tunings(tmp_path)[knob]) as s:
        loader = StatefulDataLoader(s, batch_size=4, num_workers=2, collate_fn=keys)
        loader.load_state_dict(state)
        resumed = [k for batch in loader for k in batch]
        del loader
    assert resumed == rest
    assert sorted(head + rest) == sorted(data.keys)


def test_a_block_size_that_changes_the_order_is_refused_naming_it(
    url: str, s3_server: LocalS3, data: ForeignShards
) -> None:
    """The window shuffle draws from each open shard's resident block, so the block
    boundaries are part of a shuffled order: a stream whose order sets another block
    refuses the state, naming the setting and both values (one that leaves the block
    unset takes the state's: above)."""
    with stream(url, s3_server, data) as s:
        it = iter(s)
        next(it)
        state = s.state_dict()
        del it
    other = OrderConfig(seed=5, window=3, block_bytes=2 * CHUNK)
    with (
        stream(url, s3_server, data, order=other) as s,
        pytest.raises(StateError, match=rf"block_bytes={CHUNK}.*block_bytes={2 * CHUNK}"),
    ):
        s.load_state_dict(state)


@pytest.mark.parametrize(
    ("order", "name", "saved", "now"),
    [
        (OrderConfig(seed=6, window=3), "seed", 5, 6),
        (OrderConfig(seed=5, window=4), "window", 3, 4),
        (OrderConfig(seed=5, window=3, mode="samples"), "mode", "'shards'", "'samples'"),
        (OrderConfig(seed=5, window=3, shuffle=False), "shuffle", True, False),
    ],
)
def test_an_order_setting_that_differs_is_refused_naming_it(
    order: OrderConfig, name: str, saved: Any, now: Any, data: ForeignShards
) -> None:
    index = IndexConfig(samples_per_shard=data.counts)
    with ShardStream(str(data.folder), order=ORDER, fetch=BASE, index=index) as s:
        state = s.state_dict()
    with (
        ShardStream(str(data.folder), order=order, fetch=BASE, index=index) as s,
        pytest.raises(StateError, match=rf"{name}={saved}.*{name}={now}"),
    ):
        s.load_state_dict(state)


def test_flat_arguments_and_config_objects_give_the_same_stream(
    data: ForeignShards, tmp_path: Path
) -> None:
    flat: FlatSettings = {
        "seed": 7,
        "window": 2,
        "shuffle_mode": "samples",
        "remainder": "pad",
        "rank": 1,
        "world_size": 2,
        "inflight": 2,
        "prefetch": 3,
        "chunk_bytes": CHUNK,
        "hedge": False,
        "adaptive": False,
        "check_etag": False,
        "samples_per_shard": data.counts,
        "index_cache": False,
    }
    grouped = {
        "order": OrderConfig(
            seed=7, window=2, mode="samples", remainder="pad", rank=1, world_size=2
        ),
        "fetch": FetchConfig(
            inflight=2,
            prefetch=3,
            chunk_bytes=CHUNK,
            hedge=False,
            adaptive=False,
            check_etag=False,
        ),
        "index": IndexConfig(samples_per_shard=data.counts, cache=False),
    }
    with ShardStream(str(data.folder), **flat) as a, ShardStream(str(data.folder), **grouped) as b:
        assert repr(a) == repr(b)
        assert a._settings == b._settings
        first = [s["__key__"] for s in a]
        second = [s["__key__"] for s in b]
    assert first == second
    assert len(first) == len(a)


@pytest.mark.parametrize(
    ("flat", "group", "config"),
    [
        ("seed", "order", OrderConfig()),
        ("shuffle_mode", "order", OrderConfig()),
        ("inflight", "fetch", FetchConfig()),
        ("cache_dir", "cache", CacheConfig()),
        ("samples_per_shard", "index", IndexConfig()),
    ],
)
def test_a_flat_argument_with_its_group_is_refused_naming_both(
    flat: str, group: str, config: Any, data: ForeignShards
) -> None:
    value = {"seed": 1, "shuffle_mode": "samples", "inflight": 2, "samples_per_shard": 3}
    kwargs = {flat: value.get(flat, "x"), group: config}
    with pytest.raises(TypeError, match=rf"{flat}= and {group}= were both given"):
        ShardStream(str(data.folder), **kwargs)


def test_unknown_arguments_and_wrong_groups_are_refused(data: ForeignShards) -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'windw'"):
        ShardStream(str(data.folder), windw=3)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"order= must be an asyncstream\.OrderConfig"):
        ShardStream(str(data.folder), order=FetchConfig())  # type: ignore[arg-type]


def test_the_table_maps_every_flat_argument_onto_a_field() -> None:
    classes = {"order": OrderConfig, "fetch": FetchConfig, "cache": CacheConfig}
    classes["index"] = IndexConfig
    assert set(FLAT) == set(FlatSettings.__annotations__)
    for flat, (group, name) in FLAT.items():
        assert name in classes[group].__dataclass_fields__, flat


def test_configs_validate_and_read_well() -> None:
    assert "OrderConfig(seed=3," in repr(OrderConfig(seed=3))
    assert FetchConfig(inflight=3).prefetch_chunks == 6
    assert FetchConfig(chunk_bytes=100).chunk_for(40) == 40
    for bad, match in [
        ({"inflight": 0}, "FetchConfig.inflight"),
        ({"chunk_bytes": True}, "FetchConfig.chunk_bytes"),
        ({"coalesce_bytes": -1}, "FetchConfig.coalesce_bytes"),
        ({"hedge_factor": 0.5}, "FetchConfig.hedge_factor"),
        ({"hedge_budget": 2.0}, "FetchConfig.hedge_budget"),
        ({"transport": "curl"}, "FetchConfig.transport"),
    ]:
        with pytest.raises(ValueError, match=match):
            FetchConfig(**bad)
    with pytest.raises(ValueError, match=r"OrderConfig\.window"):
        OrderConfig(window=0)
    with pytest.raises(ValueError, match=r"OrderConfig\.mode"):
        OrderConfig(mode="lanes")  # type: ignore[arg-type]
    with pytest.raises(AttributeError):
        OrderConfig().seed = 1  # type: ignore[misc]
