"""The benchmark harness itself, at its smallest: every scenario runs and its JSON, tables
and plots are well formed. (Figures are not judged here: that is what the benchmark is for.)
The focused benchmark modules (``python -m bench.tarread`` and the others) are tested in
tests/test_bench_modules.py, a file of its own so that the two pytest workers share them.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.harness import SCENARIOS
from bench.report import BEGIN, END
from tests._benchrun import ROOT, numbers, run_bench


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench")
    results = out / "RESULTS.md"
    results.write_text(f"# Results\n\nhand-written notes\n\n{BEGIN}\nold\n{END}\n\nmore notes\n")
    figures, _ = run_bench(
        "bench",
        *("--quick", "--peers", "naive", "--results", str(results)),
        *("--plots", str(out / "plots"), "--no-progress"),
        out=out / "bench.json",
    )
    return {"dir": out, "json": figures}


@pytest.mark.timeout(700)
def test_every_scenario_runs_and_the_json_is_complete(quick_run: dict[str, Any]) -> None:
    data = quick_run["json"]
    assert set(data["scenarios"]) == set(SCENARIOS)
    env = data["environment"]
    for key in ("date", "python", "cpu", "cores", "versions"):
        assert env[key]
    assert "torch" in env["versions"]
    assert data["dataset"]["images"] == 160
    for name, figures in data["scenarios"].items():
        found = numbers(figures)
        assert found, name
        assert all(math.isfinite(n) for n in found), name
        assert figures["seconds"] > 0
    systems = data["scenarios"]["loader"]["systems"]
    for name in ("asyncstream", "naive"):
        assert systems[name]["complete"] is True, name
        assert systems[name]["samples"] == 160
        assert systems[name]["samples_per_s"] > 0
        assert 0 <= systems[name]["abs_correlation"] <= 1
    assert data["scenarios"]["faults"]["rows"][0]["fault_rate"] == 0.0
    assert [r["hedge"] for r in data["scenarios"]["hedging"]["rows"]] == [False, True]
    assert [r["adaptive"] for r in data["scenarios"]["throttling"]["rows"]] == [False, True]
    dali = data["scenarios"]["dali"]
    assert dali["preloaded_images_per_s"] > 0
    assert [r["source"] for r in dali["rows"]] == ["whole-shard chunks", "8 MiB chunks"]
    assert all(r["images_per_s"] > 0 for r in dali["rows"])
    for tls in (data["scenarios"]["tls"], data["scenarios"]["tls"]["s3_like"]):
        assert [(r["chunk_mib"], r["transport"]) for r in tls["rows"]] == [
            (1, "direct"),
            (1, "aiohttp"),
            (16, "direct"),
            (16, "aiohttp"),
        ]
        assert all(r["http_mb_per_s"] > 0 and r["https_mb_per_s"] > 0 for r in tls["rows"])
    assert data["scenarios"]["tls"]["network"] == "loopback"
    assert data["scenarios"]["tls"]["s3_like"]["network"] == "s3-like"
    # On loopback each server is a process of its own, whose CPU is counted.
    assert all(r["https_server_cpu_s_per_gb"] > 0 for r in data["scenarios"]["tls"]["rows"])
    cold, cached, _ = data["scenarios"]["cache"]["rows"]
    assert cold["misses"] > 0
    assert cached["misses"] == 0  # not one chunk from the network
    assert cached["hits"] == 2 * cold["misses"]
    mixing = data["scenarios"]["mixing"]
    ours = mixing["systems"]["asyncstream"]  # the peers were left out (--peers naive)
    assert set(mixing["systems"]) == {"asyncstream"}
    assert ours["samples"] == mixing["samples"] > mixing["window"] >= 64
    assert abs(ours["share_a"] - 0.75) < 1 / mixing["samples"]  # its quota, to a sample
    assert 0 <= ours["batch_mad"] < 0.02
    assert ours["samples_per_s"] > 0
    feed = data["scenarios"]["feed"]
    proxy = feed["proxy"]["batches"]["256"]["after"]
    assert proxy["ceiling"] > 0
    assert proxy["loader"] > 0
    assert 0 <= proxy["overlap"] <= 1
    assert set(feed["workers"]) == {"after"}  # by loader: no baseline in python -m bench
    assert set(feed["workers"]["after"]) == {"0", "2"}
    assert all(r["loader"] > 0 for r in feed["workers"]["after"].values())
    ring = data["scenarios"]["ring"]["results"]
    assert len(ring) == 3  # 16 MiB blocks, then 1 MiB under K = 32 and the default (auto)
    old, *small = (ring[name] for name in ring)
    assert all(s["ring_bytes"] < old["ring_bytes"] for s in small)
    assert all(r["requests"] > 0 for r in ring.values())
    first = data["scenarios"]["first_sample"]["results"]
    assert set(first) == {"local files", "S3-like"}
    for systems in first.values():
        assert set(systems) == {"asyncstream", "naive"}
        for figures in systems.values():
            assert figures["first_sample_s"] >= figures["import_s"] > 0
    stores = data["scenarios"]["stores"]["rows"]
    assert {(r["store"], r["chunk_MiB"]) for r in stores} == {
        (store, chunk) for store in ("gs", "az", "web", "s3") for chunk in (1, 16)
    }
    assert all(r["MB/s"] > 0 and r["client_cpu_s_per_gb"] > 0 for r in stores)
    decode = data["scenarios"]["cpu_decode"]
    assert set(decode["systems"]) == {"asyncstream", "webdataset", "asyncstream-wrapped"}
    for figures in decode["systems"].values():
        assert figures["images"] == 160  # the whole epoch, decoded
        assert figures["resume_first_batch_s"] > 0
        assert figures["resume_decoded"] >= decode["batch"]  # at least the batch it made


@pytest.mark.timeout(700)
def test_results_section_is_replaced_and_plots_written(quick_run: dict[str, Any]) -> None:
    text = (quick_run["dir"] / "RESULTS.md").read_text()
    assert text.startswith("# Results\n\nhand-written notes\n")
    assert text.rstrip().endswith("more notes")
    assert "\nold\n" not in text
    section = text.split(BEGIN, 1)[1].split(END, 1)[0]
    for heading in (
        "Raw fetch",
        "Loader only",
        "DALI",
        "Shuffle quality",
        "faults",
        "Hedged",
        "Local disk cache",
        "Mixing two datasets",
    ):
        assert heading in section
    assert "| asyncstream |" in section
    plots = quick_run["json"]["plots"]
    assert set(plots) == {
        "throughput_vs_k",
        "throughput_vs_faults",
        "shuffle_vs_memory",
        "loader_samples_per_s",
    }
    for path in plots.values():
        data = Path(path).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n")
        assert f"]({Path(path).relative_to(quick_run['dir'])})" in section


def test_unknown_scenario_is_refused() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--scenarios", "nope"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "unknown scenarios: nope" in proc.stderr


@pytest.mark.timeout(700)
def test_the_nginx_profile_reads_through_pinned_nginx(tmp_path: Path) -> None:
    """``--profile nginx``: the reads go to nginx (no proxy between), pinned apart from the
    benchmark where there are two CPUs, and the pinning is in the output."""
    from asyncstream.testing import NginxUnavailable, _nginxinstall

    try:
        _nginxinstall.install()
    except NginxUnavailable as exc:
        pytest.skip(f"nginx with its Lua module cannot be installed here: {exc}")
    results = tmp_path / "RESULTS.md"
    results.write_text(f"{BEGIN}\n{END}\n")
    out, _ = run_bench(
        "bench",
        *("--quick", "--profile", "nginx", "--scenarios", "raw_fetch,ring"),
        *("--results", str(results), "--plots", str(tmp_path / "plots"), "--no-progress"),
        out=tmp_path / "bench.json",
    )
    pin = out["pinning"]
    assert out["profile"] == "nginx"
    assert pin["server"].startswith("nginx/")
    if len(os.sched_getaffinity(0)) > 1:
        assert not set(pin["server_cpus"]) & set(pin["reader_cpus"])
    ring = out["scenarios"]["ring"]["results"]
    assert all(r["proxy_cpu_s_per_gb"] == 0 and r["requests"] > 0 for r in ring.values())
    assert out["scenarios"]["raw_fetch"]["mb_per_s"] > 0
    assert f"pinned to CPU {pin['server_cpus'][0]}" in results.read_text()


def test_the_nginx_profile_is_refused_with_an_endpoint() -> None:
    command = [sys.executable, "-m", "bench", "--profile", "nginx"]
    command += ["--endpoint", "http://127.0.0.1:1", "--bucket", "b"]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--profile nginx" in proc.stderr


@pytest.mark.timeout(300)
def test_the_nginx_link_mirrors_a_prefix_the_embedded_server_holds(tmp_path: Path) -> None:
    """What a converting peer wrote to the embedded server under a prefix, copied into
    nginx's folder afresh (nginx takes no uploads), is read back through nginx byte for
    byte; what an earlier copy left under the prefix is gone."""
    from asyncstream import LocalS3
    from asyncstream.stores._s3 import sync_client
    from asyncstream.testing import NginxUnavailable, _nginxinstall
    from bench._nginx import nginx_link

    try:
        _nginxinstall.install()
    except NginxUnavailable as exc:
        pytest.skip(f"nginx with its Lua module cannot be installed here: {exc}")
    before = os.sched_getaffinity(0)
    bucket, peer = "mirror-test", "_peers/p/train/"
    with LocalS3(mode="process") as server:
        client = server.client()
        client.create_bucket(Bucket=bucket)
        client.put_object(Bucket=bucket, Key="train/0.tar", Body=b"shard")
        with nginx_link(server.options(), bucket, tmp_path) as link:
            client.put_object(Bucket=bucket, Key=peer + "index.json", Body=b"{}")
            client.put_object(Bucket=bucket, Key=peer + "a.bin", Body=b"first")
            assert link.mirror(f"s3://{bucket}/{peer}") == 2
            client.delete_object(Bucket=bucket, Key=peer + "a.bin")
            client.put_object(Bucket=bucket, Key=peer + "b.bin", Body=bytes(range(256)))
            assert link.mirror(f"s3://{bucket}/{peer}") == 2
            through = sync_client(link.options)

            def read(key: str) -> bytes:
                body: bytes = through.get_object(Bucket=bucket, Key=key)["Body"].read()
                return body

            assert read(peer + "b.bin") == bytes(range(256))
            assert read("train/0.tar") == b"shard"
            listed = through.list_objects_v2(Bucket=bucket, Prefix=peer)
            assert sorted(o["Key"] for o in listed["Contents"]) == [
                peer + "b.bin",
                peer + "index.json",
            ]
    assert os.sched_getaffinity(0) == before  # the pinning ends with the link
