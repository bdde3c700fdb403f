"""The Azure Blob store (asyncstream/stores/_azurestore.py, _azureobjects.py, _azure.py),
end to end against Azurite (one per session: tests/_servers_azure.py), faults injected by
a FaultProxy between the store and Azurite."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _servers_azure import AzData

from asyncstream import (
    AccessDeniedError,
    FetchConfig,
    NotFoundError,
    PermanentFetchError,
    RetryPolicy,
    ShardStream,
    ShardURLError,
    Timeouts,
    resolve_shards,
)
from asyncstream.stores._azure import DEV_KEY, AzureConfig, parse_blob_url
from asyncstream.stores._registry import make_store
from asyncstream.stores._store import StoreSetup
from asyncstream.testing import Azurite, FaultPlan, FaultProxy

HERE = Path(__file__).parent
FAST = FetchConfig(
    inflight=4,
    chunk_bytes=16 << 10,
    retry=RetryPolicy(max_attempts=12, base_delay=0.005, max_delay=0.05, deadline=60),
    timeouts=Timeouts(connect=5, first_byte=5, stall=0.5, chunk=20),
)
STREAM: dict[str, Any] = {"window": 3, "seed": 4}
ABFS = "abfs://data@devstoreaccount1.dfs.core.windows.net/train/"


def open_stream(data: AzData, url: str | None = None, **kwargs: Any) -> ShardStream:
    """A stream over the shards: small chunks, fast retries; ``hedge``, ``check_etag`` go
    into its FetchConfig, the rest to ShardStream."""
    tuning = {k: kwargs.pop(k) for k in ("hedge", "check_etag") if k in kwargs}
    fetch = dataclasses.replace(FAST, **tuning)
    settings = {"fetch": fetch, "samples_per_shard": data.counts, **STREAM, **kwargs}
    return ShardStream(url or data.prefix, **settings)


def assert_exact(samples: list[dict[str, Any]], data: AzData, prefix: str | None = None) -> None:
    """Every sample once, with exactly the shard's bytes, from the shards' URLs."""
    keys = Counter(sample["__key__"] for sample in samples)
    assert [key for key, n in keys.items() if n > 1] == []
    assert set(keys) == set(data.samples)
    for sample in samples:
        fields = {k: v for k, v in sample.items() if not k.startswith("__")}
        assert fields == data.samples[sample["__key__"]], sample["__key__"]
        url = sample["__url__"].replace(prefix or data.prefix, data.prefix)
        assert url in data.blobs


@pytest.fixture
def proxied(azurite: Azurite, use_azure: Any) -> Iterator[Callable[..., FaultProxy]]:
    """Starts a FaultProxy in front of Azurite (``FaultProxy``'s keyword arguments) and
    points the store at it; closed after the test."""
    with contextlib.ExitStack() as stack:

        def start(**kwargs: Any) -> FaultProxy:
            running = stack.enter_context(FaultProxy(f"http://127.0.0.1:{azurite.port}", **kwargs))
            use_azure(endpoint=f"{running.endpoint_url}/devstoreaccount1")
            return running

        yield start


def blob_gets(proxy: FaultProxy, name: str) -> list[tuple[str | None, int]]:
    """The ranges and statuses of the GETs of one blob that reached the proxy."""
    found = proxy.ranged_requests()
    return [(rng, status) for method, path, rng, status in found if path.endswith(name)]


def no_range_twice(gets: list[tuple[str | None, int]]) -> None:
    """No range of the blob was asked for twice: nothing was retried."""
    ranges = [rng for rng, _ in gets]
    assert len(ranges) == len(set(ranges)), gets


# -- URLs and settings (no server) -------------------------------------------------------


def test_urls_have_one_convention_and_other_forms_are_refused_saying_what_to_write() -> None:
    assert parse_blob_url("az://data/train/x.tar").container == "data"
    path = parse_blob_url("abfss://data@acct01.dfs.core.windows.net/train/")
    assert (path.container, path.key, path.account) == ("data", "train/", "acct01")
    with pytest.raises(ShardURLError, match="abfs://container@account"):
        parse_blob_url("az://data@acct01.blob.core.windows.net/x")
    with pytest.raises(ShardURLError, match=r"abfs://container@account\.dfs"):
        parse_blob_url("abfs://data/x")
    with pytest.raises(ShardURLError, match="not a valid container name"):
        parse_blob_url("az://Data_Set/x")
    with pytest.raises(ShardURLError, match="no container"):
        parse_blob_url("az:///x")
    config = AzureConfig(account="mine", key=DEV_KEY)
    with pytest.raises(ShardURLError, match="configured for 'mine'"):
        config.endpoint_of(parse_blob_url(ABFS), ABFS)
    with pytest.raises(ShardURLError, match="no Azure storage account"):
        AzureConfig().endpoint_of(parse_blob_url("az://data/x"), "az://data/x")


def test_settings_come_from_configure_store_else_the_standard_environment() -> None:
    conn = (
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=c2VjcmV0;"
        "EndpointSuffix=core.windows.net"
    )
    config = AzureConfig.resolve({}, {"AZURE_STORAGE_CONNECTION_STRING": conn})
    assert (config.account, config.endpoint, config.auth) == (
        "acct",
        "https://acct.blob.core.windows.net",
        "key",
    )
    assert "c2VjcmV0" not in repr(config)  # no secret in a repr
    dev = AzureConfig.resolve({"connection_string": "UseDevelopmentStorage=true"}, {})
    assert (dev.account, dev.endpoint) == (
        "devstoreaccount1",
        "http://127.0.0.1:10000/devstoreaccount1",
    )
    env = {"AZURE_STORAGE_ACCOUNT": "acct", "AZURE_STORAGE_SAS_TOKEN": "?sv=1&sig=x"}
    sas = AzureConfig.resolve({}, env)
    assert (sas.auth, sas.sas_token, sas.account) == ("sas", "sv=1&sig=x", "acct")
    explicit = AzureConfig.resolve({"account": "other", "key": "a2V5"}, env)  # settings win
    assert (explicit.account, explicit.auth) == ("other", "key")
    assert AzureConfig.resolve({}, {}).auth == "token"  # DefaultAzureCredential
    with pytest.raises(ValueError, match="unknown Azure store settings"):
        AzureConfig.resolve({"acount": "typo"}, {})


# -- Reading -------------------------------------------------------------------------------


def test_an_epoch_is_exact_and_stats_name_the_store(az_data: AzData, use_azure: Any) -> None:
    shards = resolve_shards(az_data.prefix)
    assert [s.url for s in shards] == sorted(az_data.blobs)
    assert [s.size for s in shards] == [len(az_data.blobs[s.url]) for s in shards]
    assert all(s.etag is not None and s.etag.startswith('"0x') for s in shards)
    with open_stream(az_data) as stream:
        samples = list(stream)
        fetch = stream.stats()["fetch"]
    assert_exact(samples, az_data)
    assert fetch["store"] == "azure-blob"
    assert fetch["azure_accounts"] == ["devstoreaccount1"]
    assert (fetch["transport"], fetch["azure_auth"], fetch["retries_total"]) == ("direct", "key", 0)


def test_a_sas_token_alone_reads(az_data: AzData, use_azure: Any) -> None:
    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    sas = generate_container_sas(
        "devstoreaccount1",
        "data",
        account_key=DEV_KEY,
        permission=ContainerSasPermissions(read=True, list=True),
        expiry=__import__("datetime").datetime(2100, 1, 1),
    )
    use_azure(key=None, account=None, sas_token=sas)
    with open_stream(az_data) as stream:
        samples = list(stream)
        assert stream.stats()["fetch"]["azure_auth"] == "sas"
    assert_exact(samples, az_data)


def test_the_abfs_form_reads_the_same_blobs(az_data: AzData, use_azure: Any) -> None:
    assert [s.url for s in resolve_shards(ABFS)] == [
        url.replace(az_data.prefix, ABFS) for url in sorted(az_data.blobs)
    ]
    with open_stream(az_data, ABFS) as stream:
        samples = list(stream)
    assert_exact(samples, az_data, ABFS)
    assert {s["__url__"].split("/train/")[0] for s in samples} == {ABFS.split("/train/")[0]}


def test_an_epoch_through_ten_percent_faults_is_exact(
    az_data: AzData, proxied: Callable[..., FaultProxy]
) -> None:
    plan = FaultPlan(slowdown=0.03, internal_error=0.02, reset=0.03, truncate=0.02, match=".tar")
    proxy = proxied(faults=plan, seed=1)
    with open_stream(az_data, hedge=False) as stream:
        samples = list(stream)
        fetch = stream.stats()["fetch"]
    assert_exact(samples, az_data)
    faults = proxy.stats()
    injected = sum(faults[k] for k in ("slowdown", "internal_error", "reset", "truncate"))
    assert injected > 0
    assert fetch["retries_total"] >= injected - faults["truncate"] - faults["reset"]


def test_throttling_429_and_503_server_busy_is_retried_with_backoff(
    az_data: AzData, proxied: Callable[..., FaultProxy]
) -> None:
    proxy = proxied()
    name = az_data.name(1)
    proxy.inject("status", 2, status=429, code="TooManyRequests", match=name, method="GET")
    proxy.inject("status", 2, status=503, code="ServerBusy", match=name, method="GET")
    proxy.inject("status", 2, status=503, code="ServerBusy", match="comp=list")  # the listing
    with open_stream(az_data, shuffle=False, hedge=False) as stream:
        samples = list(stream)
        fetch = stream.stats()["fetch"]
    assert_exact(samples, az_data)
    assert proxy.pending() == 0
    assert fetch["retries"].get("slowdown") == 4  # the engine's; the listing's were its own
    assert fetch["throttle_cuts"] >= 1  # adaptive concurrency halved the downloads
    assert [status for _, status in blob_gets(proxy, name)].count(429) == 2
    lists = [s for m, p, s in proxy.requests() if m == "GET" and p.endswith("/data")]
    assert lists[:3] == [503, 503, 200]


@pytest.mark.parametrize("via", ["Azurite's 412", "our ETag check"])
def test_a_replaced_blob_is_permanent_at_once(
    az_data: AzData, proxied: Callable[..., FaultProxy], via: str
) -> None:
    strip = ("if-match",) if via == "our ETag check" else ()
    proxy = proxied(strip_request_headers=strip)
    name, url = az_data.name(3), az_data.url(3)
    container = az_data.container()
    try:
        with open_stream(az_data, shuffle=False) as stream:
            new = bytes(b ^ 0xFF for b in az_data.blobs[url])  # same length, new ETag
            container.upload_blob(name, new, overwrite=True)
            with pytest.raises(PermanentFetchError, match="changed since it was listed") as info:
                list(stream)
    finally:
        container.upload_blob(name, az_data.blobs[url], overwrite=True)
    gets = blob_gets(proxy, name)
    message = str(info.value)
    assert url in message
    assert "attempts" not in message
    no_range_twice(gets)
    if strip:
        assert "its ETag is" in message
        assert {status for _, status in gets} == {206}
    else:
        assert "its ETag no longer matches" in message
        assert {status for _, status in gets} == {412}


def test_missing_blobs_and_containers_are_not_found_naming_them(
    az_data: AzData, use_azure: Any
) -> None:
    with pytest.raises(NotFoundError, match="no such container 'nothere'") as info:
        resolve_shards("az://nothere/train/")
    assert "az://nothere/train/" in str(info.value)
    assert "devstoreaccount1" in str(info.value)
    with pytest.raises(NotFoundError, match="no such container 'nothere'"):
        resolve_shards("az://nothere/x.tar")
    with pytest.raises(NotFoundError, match="no such blob in container 'data'") as info:
        resolve_shards("az://data/train/nope.tar")
    assert "az://data/train/nope.tar" in str(info.value)
    # Deleted after listing: Azurite's 404 in the engine, at once. (Without If-Match:
    # Azurite answers a stale If-Match on a deleted blob with 412, read as "changed".)
    container = az_data.container()
    container.upload_blob("gone/part-00000.tar", az_data.blobs[az_data.url(0)], overwrite=True)
    fetch = dataclasses.replace(FAST, check_etag=False)
    with ShardStream("az://data/gone/", fetch=fetch, samples_per_shard=az_data.counts[:1]) as s:
        container.delete_blob("gone/part-00000.tar")
        with pytest.raises(NotFoundError, match="BlobNotFound") as info:
            list(s)
    assert "az://data/gone/part-00000.tar" in str(info.value)
    assert "attempts" not in str(info.value)


def test_a_wrong_key_is_access_denied_naming_the_store(az_data: AzData, use_azure: Any) -> None:
    use_azure(key=DEV_KEY[:-12] + "AAAAAAAAAAA=")
    with pytest.raises(AccessDeniedError, match="access denied") as info:
        resolve_shards(az_data.prefix)
    message = str(info.value)
    assert az_data.prefix in message
    assert "Azure Blob Storage account 'devstoreaccount1'" in message
    assert "attempts" not in message


def test_without_a_key_or_token_default_azure_credential_is_asked_and_its_refusal_named(
    azurite: Azurite, use_azure: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DefaultAzureCredential limited to its environment credential (azure-identity's
    AZURE_TOKEN_CREDENTIALS), with no service principal in the environment: it finds no
    token, without a request to the network; the store says so, naming the account."""
    from asyncstream.engine._engine import Engine, EngineConfig
    from asyncstream.stores._store import ChunkRequest

    monkeypatch.setenv("AZURE_TOKEN_CREDENTIALS", "EnvironmentCredential")
    use_azure(key=None, endpoint="http://127.0.0.1:9/devstoreaccount1")
    with pytest.raises(AccessDeniedError, match="needs an https:// endpoint"):
        resolve_shards("az://data/train/")
    use_azure(key=None, endpoint="https://127.0.0.1:9/devstoreaccount1")  # never reached
    with pytest.raises(AccessDeniedError, match="no usable Azure credentials") as info:
        resolve_shards("az://data/train/")
    assert "'devstoreaccount1'" in str(info.value)
    assert "attempts" not in str(info.value)
    request = ChunkRequest("az://data/train/x.tar", 0, 10, size=10)
    with Engine(EngineConfig(), n_slots=1, slot_bytes=16, mode="thread") as engine:
        engine.submit([request])
        with pytest.raises(AccessDeniedError, match="no usable Azure credentials") as info:
            engine.next()
    assert "az://data/train/x.tar" in str(info.value)


def test_a_403_in_the_engine_is_access_denied_at_once(
    az_data: AzData, proxied: Callable[..., FaultProxy]
) -> None:
    proxy = proxied()
    name = az_data.name(2)
    proxy.inject("status", status=403, code="AuthenticationFailed", match=name, method="GET")
    with open_stream(az_data, shuffle=False) as stream, pytest.raises(AccessDeniedError) as info:
        list(stream)
    assert az_data.url(2) in str(info.value)
    assert "AuthenticationFailed" in str(info.value)
    gets = blob_gets(proxy, name)
    no_range_twice(gets)
    assert [status for _, status in gets].count(403) == 1


# -- Writing: pack, ls, index; resume in a fresh process ------------------------------------


def test_pack_then_ls_then_stream(
    azurite: Azurite, use_azure: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from asyncstream.cli._cli import main

    images, dest = tmp_path / "images", "az://data/packed/"
    assert main(["generate", str(images), "--images", "24", "--classes", "3"]) == 0
    assert main(["pack", str(images), dest, "--shard-samples", "8", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["ls", dest, "--samples", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert [s["samples"] for s in listing["shards"]] == [8, 8, 8]
    assert all(s["url"].startswith(dest) for s in listing["shards"])
    with ShardStream(dest, fetch=FAST, samples_per_shard=[8, 8, 8]) as stream:
        keys = [sample["__key__"] for sample in stream]
    assert len(keys) == len(set(keys)) == 24


def test_index_writes_to_az_and_a_stream_reads_through_it(az_data: AzData, use_azure: Any) -> None:
    from asyncstream import index_dataset

    result = index_dataset(az_data.prefix, index_cache=False)
    try:
        assert result.manifest == f"{az_data.prefix}asyncstream.json"
        assert (result.shards, result.samples) == (len(az_data.blobs), sum(az_data.counts))
        with ShardStream(az_data.prefix, fetch=FAST, index_cache=False, **STREAM) as stream:
            assert stream.stats()["index"]["kind"] == "asyncstream"
            assert stream.num_samples == sum(az_data.counts)
            samples = list(stream)
        assert_exact(samples, az_data)
    finally:
        az_data.container().delete_blob("train/asyncstream.json")


def test_a_stream_resumes_exactly_in_a_fresh_process(
    az_data: AzData, azurite: Azurite, use_azure: Any, tmp_path: Path
) -> None:
    """The child reads its credentials from AZURE_STORAGE_CONNECTION_STRING alone."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    from tests._resume_child import keys, record_epochs

    stream_kwargs = {**STREAM, "chunk_bytes": 16 << 10, "samples_per_shard": az_data.counts}
    with ShardStream(az_data.prefix, **stream_kwargs) as stream:
        loader = StatefulDataLoader(stream, collate_fn=keys, batch_size=7)
        epochs, states = record_epochs(stream, loader, epochs=1)
        del loader
    middle = len(epochs[0]) // 2
    spec = {
        "folder": az_data.prefix,
        "stream": stream_kwargs,
        "loader": {"batch_size": 7},
        "epochs": 1,
        "saves": [{"epoch": 0, "state": json.loads(states[0][middle - 1])}],
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    env["AZURE_STORAGE_CONNECTION_STRING"] = azurite.connection_string
    done = subprocess.run(
        [
            sys.executable,
            str(HERE / "_resume_child.py"),
            *(str(tmp_path / n) for n in ("spec.json", "out.json")),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (resumed,) = json.loads((tmp_path / "out.json").read_text())
    assert resumed == epochs[0][middle:]


def test_the_store_is_made_by_the_registry_from_its_settings(
    azurite: Azurite, az_data: AzData
) -> None:
    store = make_store("az", StoreSetup(settings=azurite.settings()))
    try:
        assert store.is_folder("az://data/train/")
        assert not store.is_folder("az://data/x.tar")
        assert store.read("az://data/none.json") is None
        store.write("az://data/tmp/x.json", b"{}")
        assert store.read("az://data/tmp/x.json") == b"{}"
        store.delete(["az://data/tmp/x.json", "az://data/tmp/never.json"])
        assert store.read("az://data/tmp/x.json") is None
        store.prepare("az://data/tmp/")
        with pytest.raises(NotFoundError, match="no such container"):
            store.prepare("az://nothere/")
    finally:
        store.close()


_IMPORT_TIME = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)\s*$", re.MULTILINE)


def test_the_engine_process_imports_the_azure_store_for_az_urls(
    az_data: AzData,
    use_azure: Any,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Python's import log of a real engine process (as tests/test_layers.py reads it,
    whose engine reads S3 and a local file and must import no ``azure`` module)."""
    from asyncstream.engine._engine import Engine, EngineConfig
    from asyncstream.stores._store import ChunkRequest

    shard = resolve_shards(az_data.url(0))[0]
    request = ChunkRequest(shard.url, 0, 4096, etag=shard.etag, size=shard.size)
    capfd.readouterr()
    monkeypatch.setenv("PYTHONPROFILEIMPORTTIME", "1")
    engine = Engine(EngineConfig(), n_slots=1, slot_bytes=4096, mode="process")
    try:
        engine.submit([request])
        ready = engine.next()
        assert bytes(engine.view(ready)) == az_data.blobs[az_data.url(0)][:4096]
        engine.release(ready.slot)
    finally:
        engine.close(wait=True)
    imported = set(_IMPORT_TIME.findall(capfd.readouterr().err))
    assert "asyncstream.stores._azurestore" in imported
    assert "azure.storage.blob" in imported  # the SAS is made from the account key


def test_listing_follows_the_pages(
    az_data: AzData, proxied: Callable[..., FaultProxy], monkeypatch: pytest.MonkeyPatch
) -> None:
    from asyncstream.stores import _azureobjects

    proxy = proxied()
    monkeypatch.setattr(_azureobjects, "_PAGE", 2)
    assert [s.url for s in resolve_shards(az_data.prefix)] == sorted(az_data.blobs)
    pages = [s for m, p, s in proxy.requests() if m == "GET" and p.endswith("/data")]
    assert pages == [200] * 3  # 6 blobs, 2 a page


def test_a_chunked_error_document_is_decoded() -> None:
    """Azurite sends its error documents in chunks; the HTTP client reads them to their
    last chunk (not until a stall) and decodes them."""
    from asyncstream.stores._http import _dechunk

    assert _dechunk(b"5\r\n<Err>\r\n3;x=1\r\nabc\r\n0\r\n\r\n") == b"<Err>abc"
    assert _dechunk(b"5\r\nhel") == b"hel"  # cut short: as far as it goes
