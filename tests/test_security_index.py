"""Trust boundaries of an index (issue 28, items 1 and 10), on real loopback servers.

A remote index is somebody else's file: the shards it names must stay on the origins the
user named (the index's own server or bucket, or another URL given), never a local file,
and the credentials configured for the user's origins go nowhere else, even where
``trust_index_urls=`` admits another origin. And what ``pack`` writes is served as its
shards are, and an index that a server refuses is said to be refused.
"""

from __future__ import annotations

import json
import os
import stat
import warnings
from pathlib import Path
from typing import Any

import pytest
from _servers_web import WebData
from torchdata.stateful_dataloader import StatefulDataLoader

from asyncstream import (
    AccessDeniedError,
    DataError,
    FetchConfig,
    RetryPolicy,
    ShardStream,
    Timeouts,
    configure_store,
)
from asyncstream.testing import LocalS3, WebServer

FAST = FetchConfig(
    inflight=4,
    chunk_bytes=16 << 10,
    retry=RetryPolicy(max_attempts=6, base_delay=0.005, max_delay=0.05, deadline=30),
    timeouts=Timeouts(connect=5, first_byte=5, stall=1, chunk=20),
)
TOKEN = "s3cret-token"


def read(urls: str | list[str], **kwargs: Any) -> list[dict[str, Any]]:
    settings: dict[str, Any] = {"window": 2, "seed": 1, "fetch": FAST, "index_cache": False}
    with ShardStream(urls, **{**settings, **kwargs}) as stream:
        return list(stream)


def shard_list(data: WebData, urls: list[str], *, sizes: bool = True) -> list[dict[str, Any]]:
    """A wids shardlist of ``urls`` (the web data's shards, by file name)."""
    items = []
    for url, n in zip(urls, data.counts, strict=True):
        item: dict[str, Any] = {"url": url, "nsamples": n}
        if sizes:
            item["filesize"] = (data.root / "ds" / url.rpartition("/")[2]).stat().st_size
        items.append(item)
    return items


def serve_index(data: WebData, name: str, doc: dict[str, Any]) -> str:
    """Put a JSON index in the served folder; its path on the servers."""
    (data.root / "idx").mkdir(exist_ok=True)
    (data.root / "idx" / name).write_text(json.dumps(doc))
    return f"/idx/{name}"


def wids(shardlist: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
    return {"__kind__": "wids-shard-index-v1", "shardlist": shardlist, **more}


@pytest.fixture
def token_web(web: WebServer) -> WebServer:
    """The user's server needs a token, configured for ``http`` with a header (``web``
    forgets the settings after the test; the origins withheld are each stream's own)."""
    web.token = TOKEN
    configure_store("http", token=TOKEN, headers={"X-Team": "vision"})
    return web


def credentials_seen(server: WebServer) -> list[tuple[str, str | None, str | None]]:
    return [
        (r.path, r.headers.get("authorization"), r.headers.get("x-team"))
        for r in server.requests()
        if r.headers.get("authorization") or r.headers.get("x-team")
    ]


# -- item 1: an index cannot widen the reader's reach -------------------------------------


def test_a_remote_index_never_names_a_local_file(
    token_web: WebServer, web_data: WebData, tmp_path: Path
) -> None:
    """A wids index on the user's server naming ``file:///.../private.tar`` beside its own
    shard: refused before anything is read, and the refusal says why."""
    private = tmp_path / "private.tar"
    private.write_bytes((web_data.root / "ds" / "part-00001.tar").read_bytes())
    own = f"{token_web.url}/ds/part-00000.tar"
    shardlist = [
        {"url": own, "nsamples": web_data.counts[0]},
        {
            "url": private.as_uri(),
            "nsamples": web_data.counts[1],
            "filesize": private.stat().st_size,
        },
    ]
    shardlist[0]["filesize"] = (web_data.root / "ds" / "part-00000.tar").stat().st_size
    path = serve_index(web_data, "local.json", wids(shardlist))
    with pytest.raises(DataError) as info:
        read(token_web.url + path)
    message = str(info.value)
    assert private.as_uri() in message
    assert "never names a local file" in message
    assert not any(".tar" in r.path for r in token_web.requests())  # nothing was read


def test_a_remote_index_cannot_send_the_token_to_another_origin(
    token_web: WebServer, cdn: WebServer, web_data: WebData
) -> None:
    """The attack of the issue: an index on the user's server (``http://A/``) naming
    shards on ``http://B/`` (an internal address, say). Refused at open, B is never
    contacted, and the message says exactly how to opt in."""
    path = serve_index(
        web_data, "elsewhere.json", wids(shard_list(web_data, web_data.urls(cdn.url)))
    )
    with pytest.raises(DataError) as info:
        read(token_web.url + path)
    message = str(info.value)
    assert f"trust_index_urls=['{cdn.url}/']" in message
    assert "none of the credentials" in message
    assert cdn.requests() == []


def test_a_base_pointing_elsewhere_is_refused_too(
    token_web: WebServer, cdn: WebServer, web_data: WebData
) -> None:
    """Relative shard URLs resolved against a wids ``base`` on another origin are that
    origin's shards: refused alike, with or without sizes (no HEAD goes out either)."""
    names = [u.rpartition("/")[2] for u in web_data.urls(cdn.url)]
    for sizes in (True, False):
        doc = wids(shard_list(web_data, names, sizes=sizes), base=f"{cdn.url}/ds/")
        path = serve_index(web_data, f"base-{sizes}.json", doc)
        with pytest.raises(DataError, match="trust_index_urls"):
            read(token_web.url + path)
    assert cdn.requests() == []


def test_trust_index_urls_admits_an_origin_without_the_users_credentials(
    token_web: WebServer, cdn: WebServer, web_data: WebData
) -> None:
    """Opted in, the cross-origin dataset reads exactly, but neither the HEADs at open
    (no sizes in the index) nor the engine's ranged GETs carry the token or the
    configured header to the admitted origin; the user's own server still gets them."""
    doc = wids(shard_list(web_data, web_data.urls(cdn.url), sizes=False))
    path = serve_index(web_data, "trusted.json", doc)
    samples = read(token_web.url + path, trust_index_urls=[f"{cdn.url}/ds/"])
    assert len(samples) == sum(web_data.counts)
    assert {s["__key__"] for s in samples} == set(web_data.samples)
    methods = {r.method for r in cdn.requests()}
    assert {"HEAD", "GET"} <= methods
    assert credentials_seen(cdn) == []
    index_reads = [r for r in token_web.requests() if r.path == path]
    assert index_reads
    assert all(r.headers.get("authorization") for r in index_reads)


def configure_worker(worker_id: int) -> None:
    """A spawned DataLoader worker's store settings: a fresh interpreter has none of the
    main process's (``configure_store`` is per process), so each worker gives its own."""
    configure_store("http", token=TOKEN, headers={"X-Team": "vision"})


def test_spawned_workers_withhold_the_credentials_too(
    token_web: WebServer, cdn: WebServer, web_data: WebData
) -> None:
    """The opt-in read by a StatefulDataLoader whose workers are spawned (each a fresh
    process, with a registry of its own): the origins admitted travel with the opened
    stream, so the workers' GETs to the admitted origin carry neither the token nor the
    configured header, those to the user's own server carry both, and the epoch is exact."""
    urls = web_data.urls(token_web.url)[:2] + web_data.urls(cdn.url)[2:]
    doc = wids(shard_list(web_data, urls, sizes=False))
    path = serve_index(web_data, "trusted-spawn.json", doc)
    settings: dict[str, Any] = {"window": 2, "seed": 1, "fetch": FAST, "index_cache": False}
    with ShardStream(token_web.url + path, trust_index_urls=[f"{cdn.url}/ds/"], **settings) as s:
        token_web.clear()
        cdn.clear()  # from here on, only the workers' requests
        loader = StatefulDataLoader(
            s,
            batch_size=None,
            num_workers=2,
            multiprocessing_context="spawn",
            worker_init_fn=configure_worker,
        )
        samples = list(loader)
        del loader
    keys = [sample["__key__"] for sample in samples]
    assert len(keys) == sum(web_data.counts)
    assert set(keys) == set(web_data.samples)
    admitted = [r for r in cdn.requests() if r.method == "GET"]
    assert admitted
    assert credentials_seen(cdn) == []
    own = [r for r in token_web.requests() if r.method == "GET"]
    assert own
    assert all(
        r.headers.get("authorization") == f"Bearer {TOKEN}" and r.headers.get("x-team") == "vision"
        for r in own
    )


def test_the_origins_withheld_are_each_streams_own(
    token_web: WebServer, cdn: WebServer, web_data: WebData
) -> None:
    """A stream that names the admitted origin itself, opened after one whose index
    admitted it, gets the credentials there; the first stream, read after, still sends
    none: nothing one open does lifts another's withholding."""
    doc = wids(shard_list(web_data, web_data.urls(cdn.url)))
    path = serve_index(web_data, "trusted-twice.json", doc)
    settings: dict[str, Any] = {"window": 2, "seed": 1, "fetch": FAST, "index_cache": False}
    trusted = ShardStream(token_web.url + path, trust_index_urls=[f"{cdn.url}/ds/"], **settings)
    with trusted as a, ShardStream(web_data.pattern(cdn.url), **settings) as b:
        cdn.clear()
        assert len(list(b)) == sum(web_data.counts)
        assert {r.path for r in cdn.requests() if r.method == "GET"} == {
            f"/ds/{u.rpartition('/')[2]}" for u in web_data.urls(cdn.url)
        }
        assert all(r.headers.get("authorization") for r in cdn.requests())
        cdn.clear()
        assert len(list(a)) == sum(web_data.counts)
    assert [r for r in cdn.requests() if r.method == "GET"]
    assert credentials_seen(cdn) == []


def test_trust_index_urls_true_still_refuses_local_files(
    web: WebServer, web_data: WebData, tmp_path: Path
) -> None:
    private = tmp_path / "private.tar"
    private.write_bytes((web_data.root / "ds" / "part-00000.tar").read_bytes())
    doc = wids([{"url": private.as_uri(), "nsamples": web_data.counts[0]}])
    path = serve_index(web_data, "local-true.json", doc)
    with pytest.raises(DataError, match="never names a local file"):
        read(web.url + path, trust_index_urls=True)


def test_an_index_in_one_bucket_cannot_name_another_bucket(
    s3_server: LocalS3, s3_client: Any, web_data: WebData
) -> None:
    """An index in ``s3://a/`` naming ``s3://b/`` (read with the user's credentials):
    refused; naming the other bucket among the URLs given, or in trust_index_urls,
    admits it."""
    a, b = f"sec-index-a-{os.getpid()}", f"sec-index-b-{os.getpid()}"
    for name in (a, b):
        s3_client.create_bucket(Bucket=name)
    shard = web_data.root / "ds" / "part-00000.tar"
    s3_client.put_object(Bucket=b, Key="ds/part-00000.tar", Body=shard.read_bytes())
    entry = {"url": f"s3://{b}/ds/part-00000.tar", "nsamples": web_data.counts[0]}
    s3_client.put_object(Bucket=a, Key="index.json", Body=json.dumps(wids([entry])).encode())
    endpoint = s3_server.endpoint_url
    with pytest.raises(DataError, match=f"trust_index_urls=\\['s3://{b}/'\\]"):
        read(f"s3://{a}/index.json", endpoint_url=endpoint)
    samples = read(f"s3://{a}/index.json", endpoint_url=endpoint, trust_index_urls=[f"s3://{b}"])
    assert len(samples) == web_data.counts[0]


def test_an_index_naming_its_own_origin_and_a_local_index_still_read(
    web: WebServer, web_data: WebData, tmp_path: Path
) -> None:
    """What stays open: a remote index naming shards on its own server (absolute, or
    relative with ``..``), and an index the user keeps locally naming web shards."""
    doc = wids(shard_list(web_data, ["../ds/part-00000.tar", *web_data.urls(web.url)[1:]]))
    path = serve_index(web_data, "own.json", doc)
    assert len(read(web.url + path)) == sum(web_data.counts)
    local = tmp_path / "mine.json"
    local.write_text(json.dumps(wids(shard_list(web_data, web_data.urls(web.url)))))
    assert len(read(str(local))) == sum(web_data.counts)


# -- item 10: errors say what happened ---------------------------------------------------


def test_pack_writes_its_manifest_with_the_umask_like_its_shards(tmp_path: Path) -> None:
    from asyncstream import pack
    from asyncstream.testing import make_jpeg

    for cls in ("cat", "dog"):
        (tmp_path / "images" / cls).mkdir(parents=True)
        (tmp_path / "images" / cls / "a.jpg").write_bytes(make_jpeg(0, 0, 0, 1))
    old = os.umask(0o022)
    try:
        pack(tmp_path / "images", str(tmp_path / "out"), workers=1)
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "out").iterdir()}
    assert "asyncstream.json" in modes
    assert "classes.json" in modes
    assert set(modes.values()) == {0o644}, modes


def test_a_403_on_an_index_url_is_access_denied(web: WebServer, web_data: WebData) -> None:
    """A web server that may not read the manifest answers 403: access denied, not 'no
    such index file'."""
    path = serve_index(web_data, "asyncstream.json", {"__kind__": "asyncstream-manifest-v1"})
    web.inject(403, count=10, match="/idx/asyncstream.json")
    with pytest.raises(AccessDeniedError, match="403"):
        read(web.url + path)


def test_a_refused_manifest_beside_a_brace_pattern_is_said(
    web: WebServer, web_data: WebData
) -> None:
    """The manifest beside the shards answers 403: the open says so (and counts the
    shards) rather than ignore it silently; a missing one says nothing."""
    manifest = web_data.root / "ds" / "asyncstream.json"
    rows = [
        {"url": u.rpartition("/")[2], "samples": n}
        for u, n in zip(web_data.urls(web.url), web_data.counts, strict=True)
    ]
    manifest.write_text(json.dumps({"__kind__": "asyncstream-manifest-v1", "shards": rows}))
    try:
        web.inject(403, count=10, match="/ds/asyncstream.json")
        with pytest.warns(UserWarning, match="asyncstream.json") as caught:
            samples = read(web_data.pattern(web.url))
        assert len(samples) == sum(web_data.counts)
        said = [w for w in caught if "asyncstream.json" in str(w.message)]
        assert type(said[0].message).__name__ == "UnreadIndexWarning"
        assert "403" in str(said[0].message)
    finally:
        manifest.unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(read(web_data.pattern(web.url))) == sum(web_data.counts)
