"""The Google Cloud Storage store (asyncstream/stores/_gcsstore.py) against a real emulator
(fake-gcs-server, one per session), with faults injected by the real FaultProxy between
the store and the emulator."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tarfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _servers_gcs import gcs_settings

from asyncstream import (
    AccessDeniedError,
    NotFoundError,
    PermanentFetchError,
    ShardStream,
    ShardURLError,
    resolve_shards,
)
from asyncstream.cli._cli import main
from asyncstream.engine._engine import Engine, EngineConfig
from asyncstream.stores._gcs import GCSSettings
from asyncstream.stores._registry import make_store
from asyncstream.stores._retry import RetryPolicy, Timeouts
from asyncstream.stores._store import ChunkRequest, StoreSetup
from asyncstream.testing import FaultPlan, FaultProxy, GCSEmulator, generate_imagefolder

HERE = Path(__file__).parent
BUCKET = "asyncstream-gcs"
FAST_RETRY = RetryPolicy(max_attempts=12, base_delay=0.005, max_delay=0.05, deadline=60)
SHORT = Timeouts(connect=5, first_byte=5, stall=0.5, chunk=20)
FETCH: dict[str, Any] = {"inflight": 4, "chunk_bytes": 8 << 10, "retry": FAST_RETRY}


@dataclass(frozen=True)
class Packed:
    """A dataset packed to gs:// by ``asyncstream pack``: its prefix, shards and samples."""

    prefix: str
    shards: list[str]
    samples: dict[str, dict[str, bytes]]  # key -> {extension: bytes}


def _samples(blobs: dict[str, bytes]) -> dict[str, dict[str, bytes]]:
    out: dict[str, dict[str, bytes]] = {}
    for blob in blobs.values():
        with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
            for member in tar:
                key, _, ext = member.name.partition(".")
                data = tar.extractfile(member)
                assert data is not None
                out.setdefault(key, {})[ext] = data.read()
    return out


@pytest.fixture(scope="module")
def packed(gcs_emulator: GCSEmulator, tmp_path_factory: pytest.TempPathFactory) -> Packed:
    """40 images in 4 classes packed by the command line into 5 shards on the emulator."""
    gcs_emulator.create_bucket(BUCKET)
    images = tmp_path_factory.mktemp("images")
    generate_imagefolder(images, 40, 4, workers=1)
    prefix = f"gs://{BUCKET}/packed/"
    with gcs_settings(**gcs_emulator.settings()):
        args = ["pack", str(images), prefix, "--shard-samples", "8", "--no-progress"]
        assert main([*args, "--workers", "2"]) == 0
        store = make_store("gs", StoreSetup())
        shards = [s.url for s in store.list(prefix) if s.url.endswith(".tar")]
        blobs = {url: store.read(url) or b"" for url in shards}
    assert len(shards) == 5
    return Packed(prefix, shards, _samples(blobs))


@pytest.fixture
def gcs(gcs_emulator: GCSEmulator) -> Iterator[GCSEmulator]:
    """The gs:// store pointed at the emulator for one test, its bucket made (a test may
    run in a worker where no other made it: xdist without ``--dist loadfile``)."""
    gcs_emulator.create_bucket(BUCKET)
    with gcs_settings(**gcs_emulator.settings()):
        yield gcs_emulator


def _assert_exact_epoch(samples: list[dict[str, Any]], packed: Packed) -> None:
    keys = Counter(sample["__key__"] for sample in samples)
    assert [key for key, n in keys.items() if n > 1] == []
    assert set(keys) == set(packed.samples)
    for sample in samples:
        fields = {k: bytes(v) for k, v in sample.items() if not k.startswith("__")}
        assert fields == packed.samples[sample["__key__"]], sample["__key__"]


def test_pack_ls_and_an_exact_epoch(
    gcs: GCSEmulator, packed: Packed, capsys: pytest.CaptureFixture[str]
) -> None:
    """Packed to gs:// by the command line, listed by ``ls`` with the sample counts of the
    index pack wrote, read by a stream: every sample once, its exact bytes, through the
    direct transport, and stats() name the store."""
    assert main(["ls", packed.prefix, "--samples", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert sum(int(s["samples"]) for s in listed["shards"]) == 40
    assert [s["url"] for s in listed["shards"]] == packed.shards
    with ShardStream(packed.prefix, seed=1, window=2, **FETCH) as stream:
        samples = list(stream)
        fetch = stream.stats()["fetch"]
    _assert_exact_epoch(samples, packed)
    assert fetch["store"] == f"Google Cloud Storage at {gcs.endpoint_url}"
    assert fetch["transport"] == "direct"
    assert fetch["connections_reused"] > 0


def test_resume_in_a_fresh_process_reads_the_rest_exactly(
    gcs: GCSEmulator, packed: Packed, tmp_path: Path
) -> None:
    """A loader state saved mid-epoch resumes in a fresh process that finds the emulator
    by ``STORAGE_EMULATOR_HOST`` alone (anonymous, as Google's libraries are)."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    from tests._resume_child import keys, record_epochs

    settings = {"seed": 5, "window": 2, "inflight": 2, "chunk_bytes": 8 << 10}
    with ShardStream(packed.prefix, **settings) as stream:
        loader = StatefulDataLoader(stream, collate_fn=keys, batch_size=4)
        batches, states = record_epochs(stream, loader, epochs=1)
    middle = len(batches[0]) // 2
    spec = {
        "folder": packed.prefix,
        "stream": settings,
        "loader": {"batch_size": 4},
        "epochs": 1,
        "saves": [{"epoch": 0, "state": json.loads(states[0][middle - 1])}],
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "STORAGE_EMULATOR_HOST": gcs.endpoint_url.removeprefix("http://")}
    done = subprocess.run(
        [sys.executable, str(HERE / "_resume_child.py"), "spec.json", "out.json"],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": f"{HERE.parent}:{HERE}"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    [resumed] = json.loads((tmp_path / "out.json").read_text())
    assert resumed == batches[0][middle:]
    assert sorted(k for b in batches[0] for k in b) == sorted(packed.samples)


def test_an_exact_epoch_through_ten_percent_faults(gcs: GCSEmulator, packed: Packed) -> None:
    """10% of the chunk GETs fail at the proxy between the engine and the emulator
    (throttling, 500s, resets, truncated bodies): retried, and the epoch is still exact."""
    plan = FaultPlan(slowdown=0.03, internal_error=0.02, reset=0.03, truncate=0.02, match=".tar")
    with (
        FaultProxy(gcs.endpoint_url, faults=plan, seed=11) as proxy,
        gcs_settings(endpoint=proxy.endpoint_url, anonymous=True),
        ShardStream(packed.prefix, seed=2, window=2, timeouts=SHORT, **FETCH) as stream,
    ):
        samples = list(stream)
        fetch = stream.stats()["fetch"]
        faults = proxy.stats()
    _assert_exact_epoch(samples, packed)
    injected = sum(faults[k] for k in ("slowdown", "internal_error", "reset", "truncate"))
    assert injected > 0
    # Every fault is retried, except one on either copy of a hedged chunk while the other
    # copy finishes it: at most one such fault a hedged chunk.
    assert sum(fetch["retries"].values()) + fetch["hedged"] >= injected


def _engine(**config: Any) -> Engine:
    return Engine(
        EngineConfig(inflight=2, retry=FAST_RETRY, timeouts=SHORT, **config),
        n_slots=2,
        slot_bytes=64 << 10,
    )


def test_a_replaced_object_is_permanent_and_not_retried(gcs: GCSEmulator) -> None:
    """Replaced after it was listed, with the same size: the chunk's generation differs
    (the emulator ignores ``ifGenerationMatch``; Cloud Storage answers 412, mapped the
    same way), raised at once."""
    store = make_store("gs", StoreSetup())
    url = f"gs://{BUCKET}/replaced/x.tar"
    store.write(url, b"a" * 5000)
    [shard] = resolve_shards(url)
    store.write(url, b"b" * 5000)
    with _engine() as engine:
        engine.submit([ChunkRequest(url, 0, 5000, shard.etag, size=shard.size)])
        with pytest.raises(PermanentFetchError, match="changed since it was listed") as info:
            engine.next()
        assert engine.stats()["retries_total"] == 0
    assert url in str(info.value)
    assert f"it was {shard.etag}" in str(info.value)


def test_a_412_from_the_service_is_changed(gcs: GCSEmulator) -> None:
    """What Cloud Storage itself answers a stale ``ifGenerationMatch`` (412, injected at
    the proxy): the same permanent error, no retry."""
    store = make_store("gs", StoreSetup())
    url = f"gs://{BUCKET}/precondition/x.tar"
    store.write(url, b"a" * 5000)
    [shard] = resolve_shards(url)
    with (
        FaultProxy(gcs.endpoint_url) as proxy,
        gcs_settings(endpoint=proxy.endpoint_url, anonymous=True),
    ):
        proxy.inject("status", status=412, match="x.tar")
        with _engine() as engine:
            engine.submit([ChunkRequest(url, 0, 5000, shard.etag, size=shard.size)])
            with pytest.raises(PermanentFetchError, match="changed since it was listed"):
                engine.next()
            assert engine.stats()["retries_total"] == 0
        assert proxy.stats()["status"] == 1


@pytest.mark.parametrize("status", [429, 503])
def test_throttling_is_retried_with_backoff(gcs: GCSEmulator, status: int) -> None:
    url = f"gs://{BUCKET}/throttled/x.tar"
    make_store("gs", StoreSetup()).write(url, bytes(range(256)) * 20)
    [shard] = resolve_shards(url)
    with (
        FaultProxy(gcs.endpoint_url) as proxy,
        gcs_settings(endpoint=proxy.endpoint_url, anonymous=True),
    ):
        store = make_store("gs", StoreSetup())
        proxy.inject("status", count=3, status=status, match="x.tar")
        with _engine() as engine:
            engine.submit([ChunkRequest(url, 0, shard.size, shard.etag, size=shard.size)])
            ready = engine.next()
            assert bytes(engine.view(ready)) == bytes(range(256)) * 20
            engine.release(ready.slot)
            stats = engine.stats()
        assert stats["retries_total"] == 3
        assert stats["retries"] == {"slowdown": 3}
        assert proxy.stats()["status"] == 3
        # the blocking half too: a listing answered 429/503 twice is retried
        proxy.inject("status", count=2, status=status, match="/o?")
        assert [s.url for s in store.list(f"gs://{BUCKET}/throttled/")] == [url]
        assert proxy.stats()["status"] == 5


def test_a_401_from_the_service_is_access_denied_at_once(gcs: GCSEmulator) -> None:
    """A token the service refuses (401, injected at the proxy): AccessDeniedError naming
    the object and the store, no retry."""
    store = make_store("gs", StoreSetup())
    url = f"gs://{BUCKET}/denied/x.tar"
    store.write(url, b"a" * 100)
    with (
        FaultProxy(gcs.endpoint_url) as proxy,
        gcs_settings(endpoint=proxy.endpoint_url, anonymous=True),
    ):
        proxy.inject("status", status=401, match="x.tar")
        with _engine() as engine:
            engine.submit([ChunkRequest(url, 0, 100, size=100)])
            with pytest.raises(AccessDeniedError, match="check the credentials") as info:
                engine.next()
            assert engine.stats()["retries_total"] == 0
        assert f"{url}: Google Cloud Storage at {proxy.endpoint_url}" in str(info.value)


def test_missing_objects_and_buckets_are_not_found_naming_them(gcs: GCSEmulator) -> None:
    with pytest.raises(NotFoundError, match=f"no such object in bucket '{BUCKET}'") as info:
        resolve_shards(f"gs://{BUCKET}/nothing-here.tar")
    assert f"gs://{BUCKET}/nothing-here.tar" in str(info.value)
    for url in ("gs://no-such-bucket-gcs/x.tar", "gs://no-such-bucket-gcs/prefix/"):
        with pytest.raises(NotFoundError, match="no such bucket 'no-such-bucket-gcs'") as info:
            resolve_shards(url)
        assert url in str(info.value)
    store = make_store("gs", StoreSetup())
    assert store.read(f"gs://{BUCKET}/nothing-here.json") is None
    with pytest.raises(NotFoundError, match="no such bucket"):
        store.read("gs://no-such-bucket-gcs/asyncstream.json")
    with pytest.raises(NotFoundError, match="no such bucket"):
        store.prepare("gs://no-such-bucket-gcs/out/")
    # deleted after it was listed: the engine's read says so, at once
    url = f"gs://{BUCKET}/deleted/x.tar"
    store.write(url, b"a" * 100)
    [shard] = resolve_shards(url)
    store.delete([url, f"gs://{BUCKET}/deleted/never-was.tar"])
    with _engine() as engine:
        engine.submit([ChunkRequest(url, 0, 100, shard.etag, size=100)])
        with pytest.raises(NotFoundError, match="not found") as info:
            engine.next()
        assert engine.stats()["retries_total"] == 0
    assert url in str(info.value)


def test_a_prefix_without_its_slash_is_named(gcs: GCSEmulator, packed: Packed) -> None:
    with pytest.raises(NotFoundError, match="a prefix needs its trailing '/'"):
        resolve_shards(packed.prefix.rstrip("/"))


def test_no_credentials_are_a_clear_error_naming_the_store(gcs: GCSEmulator) -> None:
    """Against an endpoint not marked anonymous, with no credentials anywhere (the
    session's environment has none): AccessDeniedError saying where they are looked for."""
    with (
        gcs_settings(endpoint=gcs.endpoint_url),
        pytest.raises(AccessDeniedError, match="no usable Google credentials") as info,
    ):
        resolve_shards(f"gs://{BUCKET}/packed/")
    message = str(info.value)
    assert f"Google Cloud Storage at {gcs.endpoint_url}" in message
    assert "GOOGLE_APPLICATION_CREDENTIALS" in message


def test_an_invalid_credentials_file_is_named(gcs: GCSEmulator, tmp_path: Path) -> None:
    bad = tmp_path / "key.json"
    bad.write_text('{"type": "service_account", "client_email": "x@y"}')
    with (
        gcs_settings(endpoint=gcs.endpoint_url, credentials=str(bad)),
        pytest.raises(AccessDeniedError, match=f"file {bad}") as info,
    ):
        resolve_shards(f"gs://{BUCKET}/packed/")
    assert f"gs://{BUCKET}/packed/" in str(info.value)


def test_a_key_the_token_endpoint_refuses_is_access_denied(
    gcs: GCSEmulator, tmp_path: Path
) -> None:
    """A well-formed service-account key whose token endpoint (here: the emulator, which
    has none, so it answers 404) refuses it: google-auth's RefreshError, permanent."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    account = {
        "type": "service_account",
        "project_id": "test",
        "private_key_id": "1",
        "private_key": pem,
        "client_email": "reader@test.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": f"{gcs.endpoint_url}/token",
    }
    path = tmp_path / "account.json"
    path.write_text(json.dumps(account))
    with (
        gcs_settings(endpoint=gcs.endpoint_url, credentials=str(path)),
        pytest.raises(AccessDeniedError, match="refused by Google's token endpoint") as info,
    ):
        resolve_shards(f"gs://{BUCKET}/packed/")
    assert str(path) in str(info.value)
    assert "PRIVATE KEY" not in str(info.value)


def _write_plain_shards(count: int) -> dict[str, bytes]:
    """Plain tar shards of text samples, as bytes by shard name."""
    shards = {}
    for i in range(count):
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w") as tar:
            for j in range(10):
                data = f"shard {i} sample {j} ".encode() * (j + 1)
                info = tarfile.TarInfo(f"{i:02d}{j:03d}.txt")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        shards[f"shard-{i}.tar"] = out.getvalue()
    return shards


def test_index_writes_to_gs_and_a_stream_reads_through_it(
    gcs: GCSEmulator, capsys: pytest.CaptureFixture[str]
) -> None:
    store = make_store("gs", StoreSetup())
    prefix = f"gs://{BUCKET}/indexed/"
    shards = _write_plain_shards(3)
    for name, blob in shards.items():
        store.write(prefix + name, blob)
    assert main(["index", prefix]) == 0
    manifest = store.read(prefix + "asyncstream.json")
    assert manifest is not None
    entries = json.loads(manifest)["shards"]
    assert sorted(entry["url"] for entry in entries) == sorted(shards)
    assert all(entry["etag"] for entry in entries)  # the generations
    capsys.readouterr()
    assert main(["ls", prefix, "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert listing["samples"] == 30
    assert listing["index"]["kind"] == "asyncstream"
    assert listing["index"]["url"] == prefix + "asyncstream.json"
    with ShardStream(prefix, seed=0, window=2, **FETCH) as stream:
        got = {x["__key__"]: bytes(x["txt"]) for x in stream}
    assert len(got) == 30
    assert got["01009"] == b"shard 1 sample 9 " * 10


def test_listing_follows_every_page(gcs: GCSEmulator, packed: Packed) -> None:
    whole = make_store("gs", StoreSetup()).list(packed.prefix)
    with FaultProxy(gcs.endpoint_url) as proxy:
        with gcs_settings(endpoint=proxy.endpoint_url, anonymous=True, page_size=2):
            paged = make_store("gs", StoreSetup()).list(packed.prefix)
        requests = proxy.stats()["requests"]
    assert [s.url for s in paged] == [s.url for s in whole]
    assert len(paged) > 5  # five shards and pack's index files
    assert requests == (len(paged) + 1) // 2


def test_settings_from_the_environment_and_configure_store() -> None:
    emulator = GCSSettings.of({}, {"STORAGE_EMULATOR_HOST": "localhost:9023"})
    assert (emulator.endpoint, emulator.anonymous) == ("http://localhost:9023", True)
    google = GCSSettings.of({}, {})
    assert (google.endpoint, google.anonymous) == ("https://storage.googleapis.com", False)
    keyed = GCSSettings.of({"credentials": "/k.json"}, {"STORAGE_EMULATOR_HOST": "h:1"})
    assert (keyed.credentials, keyed.anonymous) == ("/k.json", False)
    given = GCSSettings.of({"endpoint": "https://gcs.internal/", "project": "p"}, {})
    assert (given.endpoint, given.project) == ("https://gcs.internal", "p")
    with pytest.raises(ValueError, match="unknown gs:// store settings"):
        GCSSettings.of({"region": "x"}, {})
    with pytest.raises(ValueError, match="page_size"):
        GCSSettings.of({"page_size": 5000}, {})
    with pytest.raises(ShardURLError, match="not a Cloud Storage bucket name"):
        resolve_shards("gs://B/x.tar")


def test_the_engine_process_loads_no_google_library_for_an_emulator(
    gcs: GCSEmulator, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Anonymous reads need neither google-auth nor requests: the engine's own import log
    (``PYTHONPROFILEIMPORTTIME``) has the gs:// store and none of them."""
    store = make_store("gs", StoreSetup())
    url = f"gs://{BUCKET}/imports/x.tar"
    store.write(url, b"z" * 1000)
    capfd.readouterr()
    monkeypatch.setenv("PYTHONPROFILEIMPORTTIME", "1")
    with Engine(EngineConfig(), n_slots=1, slot_bytes=1000, mode="process") as engine:
        engine.submit([ChunkRequest(url, 0, 1000, size=1000)])
        ready = engine.next()
        assert bytes(engine.view(ready)) == b"z" * 1000
        engine.release(ready.slot)
    imported = set(
        re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)\s*$", capfd.readouterr().err, re.M)
    )
    assert "asyncstream.stores._gcsstore" in imported
    assert [m for m in imported if m.split(".")[0] in ("google", "requests")] == []
    assert "asyncstream.stores._gcsobjects" not in imported
