"""The web store (asyncstream/stores/_webstore.py): shards at ``http://`` and ``https://``
URLs, read from a real range-capable web server on loopback (``asyncstream.testing.
WebServer``, fixtures in tests/_servers_web.py), with faults from the real FaultProxy."""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from _servers_web import WebData

from asyncstream import (
    AccessDeniedError,
    FetchConfig,
    NotFoundError,
    PermanentFetchError,
    RetryPolicy,
    ShardStream,
    ShardURLError,
    Timeouts,
    configure_store,
    resolve_shards,
)
from asyncstream.stores._errors import HTTPErrorResponse
from asyncstream.stores._retry import _Attempts
from asyncstream.stores._web import WebSettings, next_url
from asyncstream.testing import FaultPlan, FaultProxy, WebServer

FAST = FetchConfig(
    inflight=4,
    chunk_bytes=16 << 10,
    retry=RetryPolicy(max_attempts=12, base_delay=0.005, max_delay=0.05, deadline=60),
    timeouts=Timeouts(connect=5, first_byte=5, stall=1, chunk=20),
)


def read_all(urls: str | list[str], data: WebData, **kwargs: Any) -> list[dict[str, Any]]:
    settings: dict[str, Any] = {"window": 3, "seed": 4, "fetch": FAST, **kwargs}
    settings.setdefault("samples_per_shard", data.counts)
    with ShardStream(urls, **settings) as stream:
        return list(stream)


def assert_exact(samples: list[dict[str, Any]], data: WebData) -> None:
    """Every sample exactly once, each field's bytes the shard's."""
    keys = Counter(s["__key__"] for s in samples)
    assert [k for k, n in keys.items() if n > 1] == []
    assert set(keys) == set(data.samples)
    for sample in samples:
        fields = {k: bytes(v) for k, v in sample.items() if not k.startswith("__")}
        assert fields == data.samples[sample["__key__"]], sample["__key__"]


def gets(server: WebServer, part: str = ".tar") -> list[tuple[str, str | None, int]]:
    return [
        (r.path, r.headers.get("range"), r.status)
        for r in server.requests()
        if r.method == "GET" and part in r.path
    ]


def copy_shard(data: WebData, folder: str, index: int = 0) -> Path:
    """A copy of one shard in a folder of its own under the served root."""
    target = data.root / folder
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir()
    name = f"part-{index:05d}.tar"
    shutil.copy(data.root / "ds" / name, target / name)
    return target / name


# -- reading ----------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_exact_epoch_over_http_and_https(
    scheme: str, web: WebServer, web_tls: WebServer, web_data: WebData
) -> None:
    server = web if scheme == "http" else web_tls
    with ShardStream(
        web_data.pattern(server.url), samples_per_shard=web_data.counts, fetch=FAST, window=3
    ) as stream:
        samples = list(stream)
        fetch = stream.stats()["fetch"]
    assert_exact(samples, web_data)
    assert (fetch["transport"], fetch["tls"]) == ("direct", scheme == "https")
    ranged = gets(server)
    assert ranged
    assert all(status == 206 and rng for _, rng, status in ranged)
    assert all("if-match" in r.headers for r in server.requests() if r.method == "GET")


def test_exact_epoch_through_the_fault_proxy(web: WebServer, web_data: WebData) -> None:
    """10% of the GETs fail (503, 500, resets, truncated bodies): every sample still
    arrives exactly once."""
    plan = FaultPlan(slowdown=0.03, internal_error=0.02, reset=0.03, truncate=0.02, match=".tar")
    fetch = FetchConfig(
        inflight=4, chunk_bytes=4 << 10, retry=FAST.retry, timeouts=FAST.timeouts, coalesce_bytes=0
    )
    with FaultProxy(web.url, faults=plan, seed=7) as proxy:
        samples = read_all(web_data.pattern(proxy.endpoint_url), web_data, fetch=fetch)
        stats = proxy.stats()
    assert_exact(samples, web_data)
    assert stats["slowdown"] + stats["internal_error"] + stats["reset"] + stats["truncate"] > 0


def test_small_shards_from_a_server_without_ranges_are_read_whole(
    web: WebServer, web_data: WebData
) -> None:
    """A chunk that is the whole shard is read correctly from a server that ignores Range."""
    web.ranges = False
    big = FetchConfig(inflight=2, chunk_bytes=1 << 20, retry=FAST.retry, timeouts=FAST.timeouts)
    assert_exact(read_all(web_data.urls(web.url), web_data, fetch=big), web_data)
    assert {status for _, _, status in gets(web)} == {200}


def test_a_server_that_ignores_ranges_is_a_clear_permanent_error(
    web: WebServer, web_data: WebData
) -> None:
    web.ranges = False
    with pytest.raises(PermanentFetchError, match="ignores Range") as info:
        read_all(web_data.urls(web.url), web_data)
    assert web.url in str(info.value)  # the server is named
    asked = [(path, rng) for path, rng, _ in gets(web)]
    assert len(asked) == len(set(asked)), "a range asked twice: retried"


# -- the object's version --------------------------------------------------------------------


@pytest.mark.parametrize("etags", [True, False], ids=["etag", "last-modified"])
@pytest.mark.parametrize("honoured", [True, False], ids=["412", "compared"])
def test_a_replaced_shard_is_a_permanent_error(
    web: WebServer, web_data: WebData, etags: bool, honoured: bool
) -> None:
    """Listed with one version, replaced (same size) before it is read: a permanent error
    naming the URL, on the first GET (no retry); whether the server answers the condition
    with 412, or ignores it (a proxy strips it) and the answer's version is compared."""
    web.etags = etags
    path = copy_shard(web_data, f"replaced-{etags}-{honoured}")
    url = f"{web.url}/{path.parent.name}/{path.name}"
    (shard,) = resolve_shards(url)
    assert shard.etag is not None
    assert shard.etag.startswith('"' if etags else "last-modified:")
    manifest = {
        "__kind__": "asyncstream-manifest-v1",
        "shards": [
            {
                "url": path.name,
                "samples": web_data.counts[0],
                "size": shard.size,
                "etag": shard.etag,
            }
        ],
    }
    (path.parent / "asyncstream.json").write_text(json.dumps(manifest))
    data = bytearray(path.read_bytes())
    data[600] ^= 0xFF
    path.write_bytes(bytes(data))
    stat = path.stat()
    os.utime(path, (stat.st_atime, stat.st_mtime + 10))
    strip = () if honoured else ("if-match", "if-unmodified-since")
    with FaultProxy(web.url, strip_request_headers=strip) as proxy:
        index = f"{proxy.endpoint_url}/{path.parent.name}/asyncstream.json"
        with pytest.raises(PermanentFetchError, match="changed since it was listed") as info:
            read_all(index, web_data, samples_per_shard=None)
    assert path.name in str(info.value)
    asked = gets(web, path.name)  # the chunks in flight at once, each asked once
    assert len({rng for _, rng, _ in asked}) == len(asked), "a range asked twice: retried"
    assert {status for _, _, status in asked} == {412 if honoured else 206}


def test_a_missing_shard_is_not_found_naming_the_url(web: WebServer, web_data: WebData) -> None:
    url = f"{web.url}/ds/missing.tar"
    with pytest.raises(NotFoundError, match="HTTP 404") as info:
        resolve_shards(url)
    assert url in str(info.value)
    path = copy_shard(web_data, "vanishing")  # listed by an index, then gone
    manifest = {
        "__kind__": "asyncstream-manifest-v1",
        "shards": [{"url": path.name, "samples": web_data.counts[0], "size": path.stat().st_size}],
    }
    (path.parent / "asyncstream.json").write_text(json.dumps(manifest))
    path.unlink()
    with pytest.raises(NotFoundError, match="HTTP 404") as info:
        read_all(f"{web.url}/vanishing/asyncstream.json", web_data, samples_per_shard=None)
    assert f"{web.url}/vanishing/{path.name}" in str(info.value)
    asked = gets(web, path.name)
    assert len({rng for _, rng, _ in asked}) == len(asked), "a range asked twice: retried"


# -- credentials, redirects, throttling -------------------------------------------------------


def test_a_bearer_token_is_sent_and_a_missing_or_bad_one_refused(
    web: WebServer, web_data: WebData
) -> None:
    web.token = "s3cret"
    url = web_data.urls(web.url)[0]
    with pytest.raises(AccessDeniedError, match="no token was sent") as info:
        resolve_shards(url)
    assert url in str(info.value)
    assert "configure_store('http', token=...)" in str(info.value)
    configure_store("http", token="wrong")
    with pytest.raises(AccessDeniedError, match="refused"):
        resolve_shards(url)
    configure_store("http", token="s3cret", headers={"X-Team": "vision"})
    assert_exact(read_all(web_data.pattern(web.url), web_data), web_data)
    answered = [r for r in web.requests() if r.status < 300]
    assert answered
    assert all(r.headers.get("x-team") == "vision" for r in answered)
    assert all(r.headers.get("authorization") == "Bearer s3cret" for r in answered)


def test_redirects_same_host_and_cross_host_without_the_token(
    web: WebServer, cdn: WebServer, web_data: WebData
) -> None:
    web.token = "s3cret"
    configure_store("http", token="s3cret")
    web.redirect("/moved/", "/ds/")  # same host: the token goes along
    web.redirect("/hub/", cdn.url + "/ds/")  # another origin: it does not
    urls = web_data.urls(web.url, "moved")[:2] + web_data.urls(web.url, "hub")[2:]
    with ShardStream(urls, samples_per_shard=web_data.counts, fetch=FAST, window=3) as stream:
        for epoch in range(2):  # the second reuses the CDN's URLs, until one expires
            stream.set_epoch(epoch)
            assert_exact(list(stream), web_data)
            cdn.inject(403, match="part-00003", count=1)
        fetch = stream.stats()["fetch"]
    assert all(r.headers.get("authorization") == "Bearer s3cret" for r in web.requests())
    assert cdn.requests()
    assert not any("authorization" in r.headers for r in cdn.requests())
    assert fetch["redirects"] >= 2
    assert fetch["reresolved"] == 1
    assert any(r.status == 403 for r in cdn.requests())


def test_a_redirect_loop_is_a_clear_error(web: WebServer) -> None:
    web.redirect("/loop/", "/loop/")
    with pytest.raises(PermanentFetchError, match="more than 10 redirects"):
        resolve_shards(f"{web.url}/loop/a.tar")


def test_throttling_is_retried_after_its_retry_after(web: WebServer, web_data: WebData) -> None:
    """429 and 503 (with Retry-After) at open (the HEADs) and in the engine (the GETs):
    retried, counted as throttling, and the epoch exact."""
    web.inject(429, match="part-00000", count=1, retry_after=0)
    with ShardStream(
        web_data.pattern(web.url), samples_per_shard=web_data.counts, fetch=FAST, window=3
    ) as stream:
        web.inject(429, match="part-00001", count=2, retry_after=0)
        web.inject(503, match="part-00002", count=1, retry_after=0)
        assert_exact(list(stream), web_data)
        retries = stream.stats()["fetch"]["retries"]
    statuses = Counter((r.method, r.status) for r in web.requests())
    assert (statuses["HEAD", 429], statuses["GET", 429], statuses["GET", 503]) == (1, 2, 1)
    assert retries == {"slowdown": 3}


def test_retry_after_lengthens_the_wait() -> None:
    policy = RetryPolicy(base_delay=0.001, max_delay=4.0)
    attempts = _Attempts("http://h/x.tar", policy, random.Random(1), lambda: 0.0)
    assert attempts.failed(HTTPErrorResponse(503, "busy", retry_after=3.0)) == ("slowdown", 3.0)
    assert attempts.failed(HTTPErrorResponse(429, "busy", retry_after=60.0))[1] == 4.0
    assert attempts.failed(HTTPErrorResponse(429, "busy"))[1] < 0.01


def test_the_hub_token_goes_to_the_hub_only_and_never_across_origins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_abc")
    settings = WebSettings.of("https", {})
    hub = "https://huggingface.co/datasets/org/ds/resolve/main/shard-0000.tar"
    assert settings.headers_for(hub)["Authorization"] == "Bearer hf_abc"
    assert "Authorization" not in settings.headers_for("https://example.org/shard.tar")
    target, headers = next_url(hub, "https://cdn-lfs.hf.co/x?sig=1", settings.headers_for(hub))
    assert target == "https://cdn-lfs.hf.co/x?sig=1"
    assert "Authorization" not in headers
    same = next_url(hub, "/api/x.tar", settings.headers_for(hub))[1]
    assert same["Authorization"] == "Bearer hf_abc"
    with pytest.raises(ValueError, match="unknown settings"):
        WebSettings.of("https", {"tokn": "x"})


# -- datasets: patterns, folders, indexes, writing --------------------------------------------


def test_a_folder_is_refused_with_what_to_give_instead(web: WebServer) -> None:
    with pytest.raises(ShardURLError, match="brace pattern") as info:
        resolve_shards(f"{web.url}/ds/")
    assert "index file" in str(info.value)


def test_a_wids_index_of_https_urls(web: WebServer, web_tls: WebServer, web_data: WebData) -> None:
    """A wids index (the common case on the Hub) naming shards on another server by
    absolute https URLs, with their sizes: opened without a HEAD, read exactly, once that
    server is admitted (trust_index_urls: tests/test_security_index.py)."""
    shardlist = [
        {
            "url": url,
            "nsamples": n,
            "filesize": (web_data.root / "ds" / url.rpartition("/")[2]).stat().st_size,
        }
        for url, n in zip(web_data.urls(web_tls.url), web_data.counts, strict=True)
    ]
    index = {"__kind__": "wids-shard-index-v1", "shardlist": shardlist}
    (web_data.root / "wids").mkdir(exist_ok=True)
    (web_data.root / "wids" / "train.json").write_text(json.dumps(index))
    samples = read_all(
        f"{web.url}/wids/train.json",
        web_data,
        samples_per_shard=None,
        trust_index_urls=[web_tls.url],
    )
    assert_exact(samples, web_data)
    assert not any(r.method == "HEAD" for r in web_tls.requests())


def test_pack_refuses_and_index_writes_elsewhere(
    web: WebServer, web_data: WebData, tmp_path: Path
) -> None:
    from asyncstream import index_dataset, pack
    from asyncstream.testing import make_jpeg

    (tmp_path / "images" / "cat").mkdir(parents=True)
    (tmp_path / "images" / "cat" / "a.jpg").write_bytes(make_jpeg(0, 0, 0, 1))
    with pytest.raises(ShardURLError, match="read-only"):
        pack(tmp_path / "images", f"{web.url}/packed/")
    before = len(web.requests())
    with pytest.raises(ShardURLError, match="read-only"):
        index_dataset(web_data.pattern(web.url), index_cache=False)
    # Refused before counting: no shard was read.
    assert [r for r in web.requests()[before:] if r.method == "GET" and ".tar" in r.path] == []
    result = index_dataset(
        web_data.pattern(web.url), output=str(tmp_path / "asyncstream.json"), index_cache=False
    )
    manifest = json.loads((tmp_path / "asyncstream.json").read_text())
    assert [s["url"] for s in manifest["shards"]] == web_data.urls(web.url)
    assert [s["samples"] for s in manifest["shards"]] == web_data.counts
    assert result is not None
    samples = read_all(str(tmp_path / "asyncstream.json"), web_data, samples_per_shard=None)
    assert_exact(samples, web_data)


def test_counting_without_an_index_suggests_an_index_kept_elsewhere(
    web: WebServer, web_data: WebData, caplog: pytest.LogCaptureFixture
) -> None:
    """Web shards cannot be indexed in place: the counting warning says where to put it."""
    pattern = web_data.pattern(web.url)
    with caplog.at_level(logging.WARNING, logger="asyncstream"):
        samples = read_all(pattern, web_data, samples_per_shard=None, index_cache=False)
    assert_exact(samples, web_data)
    assert f"'asyncstream index '{pattern}' --output asyncstream.json'" in caplog.text


def test_an_untrusted_certificate_is_refused_at_once(web_tls: WebServer, web_data: WebData) -> None:
    configure_store("https")  # the system's trust store: not the test CA
    url = web_data.urls(web_tls.url)[0]
    with pytest.raises(PermanentFetchError, match="does not verify") as info:
        resolve_shards(url)
    assert url in str(info.value)
    assert len(web_tls.requests()) == 0


def test_index_files_refused_beside_named_shards_are_no_index(
    web: WebServer, web_data: WebData
) -> None:
    """A server answering 403 for the index files probed beside named shards (static
    hosting on S3, a presigned URL's siblings): no index, the shards read all the same."""
    web.inject(403, match=".json", count=1000)
    samples = read_all(web_data.urls(web.url), web_data, samples_per_shard=None)
    assert_exact(samples, web_data)
    assert any(r.status == 403 for r in web.requests())


def test_a_token_appears_in_no_repr(web: WebServer) -> None:
    from asyncstream.engine._config import EngineConfig
    from asyncstream.stores._registry import make_store
    from asyncstream.stores._store import StoreSetup
    from asyncstream.stores._webstore import WebStore

    configure_store("http", token="tok-s3cret", headers={"Cookie": "c-s3cret"})
    store = make_store("http", StoreSetup())
    assert isinstance(store, WebStore)
    for shown in (repr(EngineConfig()), repr(store.settings)):
        assert "s3cret" not in shown
