"""``asyncstream probe`` (asyncstream/probe/, asyncstream/cli/_probe.py, dali_ops/_probe.py)
against real nginx with a link of known first byte and rate: the report names the
bottleneck each test made (a slow link with few GETs in flight: the network; a fast link
with tiny samples: the stream; real JPEGs on a fast link: DALI's decoder), its first byte
is at least the delay nginx adds, and ``--json`` parses with the keys scripts read.
Speed is never asserted. Skipped, with the reason, where nginx cannot be installed."""

from __future__ import annotations

import io
import json
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from asyncstream.cli._cli import main
from asyncstream.probe import STAGES, verdict
from asyncstream.probe._decode import measure_decode
from asyncstream.testing import NetworkProfile, Nginx, NginxUnavailable

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux only")

BUCKET = "shards"
GZ = "gzipped"
DELAY = 0.05  # nginx's first-byte delay on the slow link
KEYS = {
    "url",
    "shards",
    "bytes",
    "machine",
    "connection",
    "inflight",
    "stream",
    "decode",
    "stages",
    "binding",
    "next",
    "suggested",
    "seconds",
}


def _tiny_shards(folder: Path, shards: int = 3, samples: int = 1500, gz: bool = False) -> None:
    """Shards of tiny samples (16 B of "image", a label); gzipped, a sample takes a few
    bytes on the wire and some CPU to inflate: the stream binds on any fast link."""
    folder.mkdir(parents=True)
    for s in range(shards):
        name = f"part-{s:02d}.tar" + (".gz" if gz else "")
        with tarfile.open(folder / name, "w:gz" if gz else "w") as tar:
            for i in range(samples):
                for ext, data in (("jpg", bytes(16)), ("cls", str(i % 10).encode())):
                    info = tarfile.TarInfo(f"s{s:02d}-{i:05d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))


def _start(server: Nginx) -> Nginx:
    try:
        return server.start()
    except NginxUnavailable as exc:
        pytest.skip(f"nginx with its Lua module cannot be installed here: {exc}")


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("probe")
    _tiny_shards(root / BUCKET, samples=300)
    _tiny_shards(root / GZ, gz=True)
    return root


@pytest.fixture
def fast(tiny_root: Path) -> Iterator[Nginx]:
    server = _start(Nginx(tiny_root))
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def slow(tiny_root: Path) -> Iterator[Nginx]:
    profile = NetworkProfile(first_byte_latency=(DELAY, DELAY), bandwidth_bytes_per_s=1e6)
    server = _start(Nginx(tiny_root, profile=profile))
    try:
        yield server
    finally:
        server.close()


def run_probe(
    capsys: pytest.CaptureFixture[str], nginx: Nginx, *extra: str, url: str = f"s3://{BUCKET}/"
) -> dict[str, Any]:
    status = main(["probe", url, "--endpoint-url", nginx.url, "--json", *extra])
    out, err = capsys.readouterr()
    assert status == 0, err
    report: dict[str, Any] = json.loads(out)
    assert report.keys() >= KEYS
    assert set(report["stages"]) <= set(STAGES)
    assert set(report["suggested"]) >= {"inflight", "chunk_bytes", "workers", "dali_threads"}
    return report


def test_a_slow_link_with_few_gets_is_named_the_bottleneck(
    slow: Nginx, capsys: pytest.CaptureFixture[str]
) -> None:
    """1 MB/s a connection, at most 2 in flight: the network binds, the first byte is at
    least nginx's delay, and the chunk size asked for covers the round trip."""
    report = run_probe(
        capsys, slow, "--seconds", "4", "--k", "1,2", "--chunk-bytes", "256KiB", "--no-decode"
    )
    assert report["binding"] == "network"
    assert report["connection"]["first_byte_s"] >= 0.9 * DELAY
    assert [row["inflight"] for row in report["inflight"]] == [1, 2]
    for row in report["inflight"]:
        assert row["gets"] > 0
        assert row["reader_cpu_us_per_get"] > 0
        assert row["reader_cpu_s_per_gb"] > 0
    assert report["stream"]["samples"] > 0
    assert report["decode"] == {"not_measured": "not asked (--no-decode)"}
    assert report["suggested"]["workers"] == 0  # more readers would not help the network
    assert report["suggested"]["inflight"] in (1, 2)
    assert report["suggested"]["chunk_bytes"] >= 1 << 20


def test_a_fast_link_with_tiny_samples_names_the_stream(
    fast: Nginx, capsys: pytest.CaptureFixture[str]
) -> None:
    """Unshaped loopback and gzipped samples of a few bytes: the reader's CPU per sample
    binds, and the words say so as the JSON does."""
    url = f"s3://{GZ}/"
    report = run_probe(capsys, fast, "--seconds", "4", "--k", "1,4", "--no-decode", url=url)
    assert report["binding"] == "stream"
    wire = sum(p.stat().st_size for p in (fast.root / GZ).iterdir()) / 4500  # 3 shards of 1,500
    assert report["stream"]["sample_wire_bytes"] == pytest.approx(wire)
    assert report["suggested"]["workers"] == (1 if report["machine"]["cpus"] > 1 else 0)
    main(["probe", url, "--endpoint-url", fast.url, "--seconds", "2", "--k", "1", "--no-decode"])
    words = capsys.readouterr().out
    assert "binding: stream" in words
    assert "inflight" in words
    assert "chunk_bytes" in words


def test_the_probe_reads_only_what_the_url_names(
    fast: Nginx, capsys: pytest.CaptureFixture[str]
) -> None:
    """One shard named: no other shard read (the stream looks for its index files beside
    it, in its bucket, as any stream of it would), nothing outside its bucket."""
    before = len(fast.requests())
    report = run_probe(
        capsys, fast, "--seconds", "1", "--k", "1", "--no-decode", url=f"s3://{BUCKET}/part-01.tar"
    )
    assert report["shards"] == 1
    paths = {r.path.split("?")[0] for r in fast.requests()[before:]}
    assert all(p == f"/{BUCKET}" or p.startswith(f"/{BUCKET}/") for p in paths), paths
    assert {p for p in paths if p.endswith(".tar")} == {f"/{BUCKET}/part-01.tar"}


_NO_DALI = """
import sys


class _NoDALI:
    def find_spec(self, name, path=None, target=None):
        if name == "nvidia.dali" or name.startswith("nvidia.dali."):
            raise ImportError("no DALI here")
        return None


sys.meta_path.insert(0, _NoDALI())
"""


def test_without_dali_the_decode_stage_says_so(
    tmp_path: Path, fast: Nginx, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Python where DALI will not import (a ``sitecustomize`` refuses it): not measured,
    and why."""
    (tmp_path / "sitecustomize.py").write_text(_NO_DALI)
    root = str(Path(__file__).resolve().parents[1])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), root]))
    got = measure_decode(
        f"s3://{BUCKET}/", fast.options(), seconds=1, inflight=1, chunk_bytes=1 << 20
    )
    assert got["not_measured"].startswith("DALI not installed"), got


@pytest.mark.slow
def test_real_jpegs_on_a_fast_link_name_the_decoder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """JPEGs of ImageNet's sizes, loopback: DALI's decode binds on a machine without a GPU
    (on one with a GPU the test only checks the stage was measured there)."""
    pytest.importorskip("nvidia.dali")
    torch = pytest.importorskip("torch")
    from asyncstream.testing import generate_imagefolder

    images = generate_imagefolder(tmp_path / "images", 48, 4, workers=1)
    (tmp_path / "root" / BUCKET).mkdir(parents=True)
    with tarfile.open(tmp_path / "root" / BUCKET / "part-00.tar", "w") as tar:
        for i, path in enumerate(sorted(images)):
            tar.add(path, arcname=f"{i:05d}.jpg")
            label = str(i % 4).encode()
            info = tarfile.TarInfo(f"{i:05d}.cls")
            info.size = len(label)
            tar.addfile(info, io.BytesIO(label))
    server = _start(Nginx(tmp_path / "root"))
    try:
        report = run_probe(capsys, server, "--seconds", "8", "--k", "1,4")
    finally:
        server.close()
    decode = report["decode"]
    assert "not_measured" not in decode, decode
    assert decode["decoder"]["images_per_s"] > 0
    assert decode["feed"]["images"] > 0
    if torch.cuda.is_available():
        assert decode["decoder"]["device"] == "mixed"
    else:
        assert decode["decoder"]["device"] == "cpu"
        assert report["binding"] == "decoder"
        assert report["suggested"]["dali_threads"] == report["machine"]["cpus"]


def test_the_verdict_of_figures_made_up() -> None:
    """The pure part: the lowest ceiling binds; K and the chunk size follow the figures."""
    ks = [
        {"inflight": 1, "mb_per_s": 50.0, "engine_cpu_s_per_gb": 0.5},
        {"inflight": 4, "mb_per_s": 190.0, "engine_cpu_s_per_gb": 0.5},
        {"inflight": 16, "mb_per_s": 200.0, "engine_cpu_s_per_gb": 0.5},
    ]
    measured: dict[str, Any] = {
        "inflight": ks,
        "connection": {"mb_per_s": 90.0, "first_byte_s": 0.035},
        "stream": {
            "sample_wire_bytes": 100_000,
            "ceiling_samples_per_s": 10_000.0,
            "samples_per_s": 1500.0,
            "cpu_us_per_sample": 100.0,
        },
        "decode": {"decoder": {"images_per_s": 500.0, "device": "cpu", "threads": 2}},
        "machine": {"cpus": 2},
    }
    got = verdict(measured)
    assert got["binding"] == "decoder"
    assert got["next"] == "network"  # 200 MB/s of 100 kB samples: 2,000 a second
    # The decoder takes 500 a second: 50 MB/s, 60 with headroom, of which 90% (54) is past
    # one GET's 50 MB/s and within four's.
    assert got["suggested"]["inflight"] == 4
    assert got["suggested"]["chunk_bytes"] == 16 << 20  # 4 x 90 MB/s x 35 ms = 12.6 MB
    assert got["suggested"]["workers"] == 0
    measured["decode"] = {"not_measured": "DALI not installed"}
    measured["stream"]["ceiling_samples_per_s"] = 1000.0
    got = verdict(measured)
    assert got["binding"] == "stream"
    assert got["suggested"]["workers"] == 1  # two cores: one left for a worker
