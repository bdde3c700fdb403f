"""``asyncstream serve``: the embedded S3 server for a shell. ``pack``, ``ls`` and ``index``
reach it through the environment it prints, with no flag, and it stops cleanly on SIGTERM
and on Ctrl-C (SIGINT), leaving nothing behind."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from _served import Served, _command

from asyncstream import S3Options
from asyncstream.cli._cli import main
from asyncstream.stores._s3 import sync_client
from asyncstream.testing import generate_imagefolder

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


@pytest.fixture
def served() -> Iterator[Served]:
    """``asyncstream serve --bucket data``, killed after the test if it is still up."""
    server = Served("--bucket", "data")
    try:
        yield server
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.communicate()


def _port_open(endpoint: str) -> bool:
    host, port = endpoint.split("://")[1].split(":")
    with socket.socket() as sock:
        sock.settimeout(2)
        return sock.connect_ex((host, int(port))) == 0


def test_pack_ls_and_index_reach_it_through_the_environment_it_prints(
    served: Served,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert set(served.env) == {
        "AWS_ENDPOINT_URL",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_DEFAULT_REGION",
    }
    assert served.endpoint_url.startswith("http://127.0.0.1:")
    for name, value in served.env.items():
        monkeypatch.setenv(name, value)
    generate_imagefolder(tmp_path / "images", 12, 3, workers=1)
    capsys.readouterr()
    # No --endpoint-url anywhere: the commands read AWS_ENDPOINT_URL and the rest.
    dest = "s3://data/train/"
    args = ["pack", str(tmp_path / "images"), dest, "--shard-samples", "4", "--no-progress"]
    assert main(args) == 0
    assert main(["ls", dest]) == 0
    listing = capsys.readouterr().out
    assert "3 shards" in listing
    assert "12 samples" in listing
    assert main(["index", dest, "--no-progress"]) == 0
    assert "indexed 3 shards, 12 samples" in capsys.readouterr().out

    status, err = served.stop(signal.SIGTERM)
    assert status == 0, err
    assert "S3 server stopped (SIGTERM)" in err
    assert "Traceback" not in err
    assert not _port_open(served.endpoint_url)


def test_ctrl_c_stops_it_cleanly(served: Served) -> None:
    client = sync_client(S3Options(endpoint_url=served.endpoint_url).resolve())
    assert [b["Name"] for b in client.list_buckets()["Buckets"]] == ["data"]
    client.close()
    status, err = served.stop(signal.SIGINT)
    assert status == 0, err
    assert "S3 server stopped (SIGINT)" in err
    assert "Traceback" not in err
    assert not _port_open(served.endpoint_url)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_tls_on_a_given_port_with_buckets(monkeypatch: pytest.MonkeyPatch) -> None:
    port = _free_port()
    served = Served("--tls", "--port", str(port), "--bucket", "one", "--bucket", "two")
    try:
        assert served.endpoint_url == f"https://127.0.0.1:{port}"
        ca_bundle = Path(served.env["AWS_CA_BUNDLE"])
        assert ca_bundle.is_file()
        for name, value in served.env.items():
            monkeypatch.setenv(name, value)
        client = sync_client(S3Options().resolve())  # endpoint and CA from the environment
        assert sorted(b["Name"] for b in client.list_buckets()["Buckets"]) == ["one", "two"]
        client.close()
        status, err = served.stop()
        assert status == 0, err
        assert not ca_bundle.parent.exists()  # the test certificates are deleted
        assert not _port_open(served.endpoint_url)
    finally:
        if served.proc.poll() is None:
            served.proc.kill()
            served.proc.communicate()


def test_a_port_in_use_is_an_error_naming_it() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [*_command(), "serve", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr
    assert "in use" in proc.stderr
    assert "export" not in proc.stdout
