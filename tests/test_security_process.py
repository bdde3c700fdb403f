"""Trust boundaries of the processes asyncstream starts and serves (issue 28, items 7, 8).

* The engine process (and ``LocalS3``'s child) import nothing from the user's working
  directory: a ``secrets.py`` planted there, which the engine's import chain would take
  in place of the standard library's, is never run.
* The embedded S3 server (``LocalS3``, ``asyncstream serve``) is closed to web browsers:
  another origin, a CORS preflight and a rebound host name are refused with no
  ``Access-Control-Allow-Origin``, and moto's ``/moto-api/`` admin endpoints are refused
  to all but ``LocalS3.reset``; botocore and the CLI are served as before.
"""

from __future__ import annotations

import io
import os
import tarfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _served import Served

from asyncstream import ShardStream
from asyncstream.cli._cli import main
from asyncstream.testing import LocalS3, generate_imagefolder

SAMPLES = 5
EVIL = "http://evil.example"

# A stand-in for the standard library's ``secrets`` that leaves a mark when imported, then
# behaves as the real one, so that an epoch that imports it still runs to its end.
PLANTED = """
import os, sysconfig
with open({marker!r}, "a") as _f:
    _f.write(f"{{os.getpid()}}\\n")
_path = os.path.join(sysconfig.get_paths()["stdlib"], "secrets.py")
with open(_path) as _f:
    exec(compile(_f.read(), _path, "exec"))
"""


# --- item 7: nothing imported from the working directory ------------------------------


def write_shards(folder: Path) -> list[str]:
    paths = []
    for shard in range(3):
        path = folder / f"shard-{shard}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(SAMPLES):
                data = f"shard {shard} sample {i}".encode() * 20
                info = tarfile.TarInfo(f"{shard:02d}{i:04d}.txt")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        paths.append(str(path))
    return paths


@pytest.fixture
def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory holding a ``secrets.py`` that writes the returned marker file
    when imported; the test runs in it."""
    folder = tmp_path / "cwd"
    folder.mkdir()
    marker = tmp_path / "imported-from-cwd"
    (folder / "secrets.py").write_text(PLANTED.format(marker=str(marker)))
    monkeypatch.chdir(folder)
    return marker


@pytest.mark.parametrize("pythonpath", ["as-is", "empty-entry"])
def test_the_engine_process_imports_nothing_from_the_working_directory(
    planted: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pythonpath: str
) -> None:
    if pythonpath == "empty-entry":  # `PYTHONPATH=$PYTHONPATH:` also names the cwd
        monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", "") + os.pathsep)
    shards = write_shards(tmp_path)
    with ShardStream(shards, samples_per_shard=[SAMPLES] * 3, seed=5) as stream:
        keys = [sample["__key__"] for sample in stream]
    assert sorted(keys) == [f"{s:02d}{i:04d}" for s in range(3) for i in range(SAMPLES)]
    assert not planted.exists(), f"the engine imported secrets.py from the cwd: {planted}"


def test_the_local_s3_child_imports_nothing_from_the_working_directory(
    planted: Path, aws_env: dict[str, str]
) -> None:
    with LocalS3(mode="process") as server:
        client = server.client()
        client.create_bucket(Bucket="cwd")
        client.put_object(Bucket="cwd", Key="k", Body=b"v")
        assert client.get_object(Bucket="cwd", Key="k")["Body"].read() == b"v"
    assert not planted.exists(), "the S3 server's child imported secrets.py from the cwd"


# --- item 8: the embedded S3 server and web browsers ----------------------------------


def request(url: str, method: str = "GET", **headers: str) -> tuple[int, dict[str, str], bytes]:
    """A plain HTTP request (as a browser would make it): status, headers, body."""
    sent = urllib.request.Request(url, method=method, headers=headers)
    try:
        with urllib.request.urlopen(sent, timeout=30) as reply:
            return reply.status, {k.lower(): v for k, v in reply.headers.items()}, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


def cors_headers(headers: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.startswith("access-control-")}


@pytest.fixture(scope="module", params=["LocalS3-thread", "LocalS3-process", "serve"])
def server(request: pytest.FixtureRequest, aws_env: dict[str, str]) -> Iterator[Any]:
    """Each way the embedded server runs, holding a public object at ``/data/public``
    (readable with no signature, as a browser would read it)."""
    if request.param == "LocalS3-thread":
        # Thread-mode servers of a process share their buckets: use the session's.
        running: Any = request.getfixturevalue("s3_server")
        stop = None
    elif request.param == "LocalS3-process":
        running = stop = LocalS3(mode="process").start()
    else:
        running = stop = Served("--bucket", "data")
    client = running.client()
    if request.param != "serve":  # serve made it (--bucket data)
        client.create_bucket(Bucket="data")
    client.put_object(Bucket="data", Key="public", Body=b"payload", ACL="public-read")
    try:
        yield running
    finally:
        if stop is not None:
            stop.close() if isinstance(stop, LocalS3) else stop.stop()


def test_a_plain_request_with_no_origin_is_served(server: Any) -> None:
    status, _, body = request(f"{server.endpoint_url}/data/public")
    assert (status, body) == (200, b"payload")


def test_another_origin_is_refused_with_no_cors_grant(server: Any) -> None:
    status, headers, body = request(f"{server.endpoint_url}/data/public", Origin=EVIL)
    assert status == 403
    assert b"payload" not in body
    assert cors_headers(headers) == {}


def test_the_servers_own_origin_is_served_with_no_cors_grant(server: Any) -> None:
    url = server.endpoint_url
    status, headers, body = request(f"{url}/data/public", Origin=url)
    assert (status, body) == (200, b"payload")
    assert cors_headers(headers) == {}


def test_a_cors_preflight_is_refused(server: Any) -> None:
    for method in ("PUT", "DELETE"):
        status, headers, _ = request(
            f"{server.endpoint_url}/data/public",
            "OPTIONS",
            Origin=EVIL,
            **{"Access-Control-Request-Method": method},
        )
        assert status == 403
        assert cors_headers(headers) == {}


def test_a_cross_site_form_cannot_delete(server: Any) -> None:
    # What an HTML form on another site sends: no preflight, an Origin, Sec-Fetch-Site.
    status, _, _ = request(
        f"{server.endpoint_url}/data/public",
        "DELETE",
        Origin=EVIL,
        **{"Sec-Fetch-Site": "cross-site"},
    )
    assert status == 403
    assert request(f"{server.endpoint_url}/data/public")[2] == b"payload"


def test_a_rebound_host_name_is_refused(server: Any) -> None:
    # DNS rebinding: a name of the page's own made to resolve to 127.0.0.1, so that its
    # requests are same-origin for the browser and carry that name as their Host (this
    # one moto reads path-style, as it reads localhost).
    port = server.endpoint_url.rsplit(":", 1)[1]
    url = f"{server.endpoint_url}/data/public"
    status, _, body = request(url, Host=f"localhost.evil.example:{port}")
    assert status == 403
    assert b"payload" not in body
    for name in ("localhost", "127.0.0.1", "data.localhost"):  # loopback names are served
        assert request(url, Host=f"{name}:{port}")[0] != 403


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/moto-api/reset"),
        ("GET", "/moto-api/"),
        ("GET", "/moto-api/data.json"),
        ("POST", "/moto-api/reset-auth"),
    ],
)
def test_motos_admin_endpoints_are_refused(server: Any, method: str, path: str) -> None:
    status, _, body = request(f"{server.endpoint_url}{path}", method)
    assert status == 403
    assert b"payload" not in body
    assert b"public" not in body
    # Nothing was reset: the object is still there.
    assert request(f"{server.endpoint_url}/data/public")[2] == b"payload"


def test_local_s3_reset_still_works(aws_env: dict[str, str]) -> None:
    # Process mode: a thread-mode reset would empty the session's server too.
    with LocalS3(mode="process") as local:
        client = local.client()
        client.create_bucket(Bucket="to-reset")
        local.reset()
        assert client.list_buckets()["Buckets"] == []


def test_serve_still_serves_pack_and_ls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    served = Served("--bucket", "data")
    try:
        for name, value in served.env.items():
            monkeypatch.setenv(name, value)
        generate_imagefolder(tmp_path / "images", 8, 2, workers=1)
        dest = "s3://data/train/"
        args = ["pack", str(tmp_path / "images"), dest, "--shard-samples", "4", "--no-progress"]
        assert main(args) == 0
        capsys.readouterr()
        assert main(["ls", dest]) == 0
        assert "8 samples" in capsys.readouterr().out
    finally:
        served.stop()


def test_serve_help_says_what_it_exposes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "no authentication" in text
    assert "anyone who can reach" in text
    assert "--host" in text
    assert "loopback" in text
