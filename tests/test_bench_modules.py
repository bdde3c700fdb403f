"""The focused benchmark modules (``python -m bench.scale``, ``bench.index``,
``bench.tarread``, ``bench.samplecost`` (and ``--defaults --webdataset``), ``bench.bombs``,
``bench.endtoend``,
``bench.blenddraw``, ``bench.autotune``, ``bench.localring``, ``bench.localread``,
``bench.tarblocks`` (and ``--writer webdataset``),
``bench.tls --server nginx``, ``bench.shuffle --window``, ``bench.feed --parts real``),
each at its smallest: it runs and its figures are complete and finite.
(Figures are not judged here: that is what the benchmark is for.)"""

from __future__ import annotations

import math
import shutil
import statistics
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests._benchrun import ROOT, numbers, run_bench


def _run_module(module: str, out: Path) -> dict[str, Any]:
    figures: dict[str, Any] = run_bench(module, "--quick", "--repeat", "1", out=out)[0]
    return figures


@pytest.mark.timeout(700)
def test_scale_benchmark_opens_indexed_datasets_in_one_request(tmp_path: Path) -> None:
    data = _run_module("bench.scale", tmp_path / "scale.json")
    assert [(r["shards"], r["samples"]) for r in data["rows"]] == [
        (64, 64_000),
        (1_000, 10_000_000),
    ]
    for row in data["rows"]:
        assert row["requests"] == 1  # the manifest, nothing else
        assert all(math.isfinite(n) and n >= 0 for n in numbers(row))
        assert row["state_bytes_fresh"] < row["state_bytes_mid_epoch_max"] < 1 << 20


@pytest.mark.timeout(700)
def test_index_benchmark_resumes_without_rereading(tmp_path: Path) -> None:
    data = _run_module("bench.index", tmp_path / "index.json")
    assert data["raw_mb_per_s"] > 0
    assert data["index_mb_per_s"] > 0
    resume = data["resume"]
    assert resume["second_run_cached_shards"] == resume["interrupted_after_shards"] == 2
    assert resume["second_run_bytes"] <= resume["unfinished_shard_bytes"] * 1.05
    assert resume["third_run_unchanged_shards"] == 4
    assert resume["third_run_bytes"] < 100_000  # the manifest and listing, no shard


@pytest.mark.timeout(700)
def test_tarread_benchmark_reads_every_compression_of_the_same_samples(tmp_path: Path) -> None:
    data = _run_module("bench.tarread", tmp_path / "tarread.json")
    assert data["reader"]["samples_per_cpu_s"] > 0
    assert {r["samples"] for r in data["stream"].values()} == {40}  # every sample (--quick)
    assert list(data["compressed"]) == [".tar", ".tar.gz", ".tar.zst", ".tar.xz", ".tar.bz2"]
    for row in data["compressed"].values():
        for source in ("local files", "S3, loopback"):
            assert row[source]["samples"] == 40
            assert all(math.isfinite(n) and n >= 0 for n in numbers(row[source]))


@pytest.mark.timeout(700)
def test_samplecost_benchmark_measures_both_revisions(tmp_path: Path) -> None:
    from asyncstream import pack
    from asyncstream.testing import generate_imagefolder

    generate_imagefolder(tmp_path / "images", 40, 2, seed=0, workers=1)
    pack(tmp_path / "images", str(tmp_path / "shards"), shard_samples=10, shard_bytes=None)
    out = tmp_path / "samplecost.json"
    has_git = shutil.which("git") is not None and (
        subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True
        ).returncode
        == 0
    )
    sides = ["before", "after"] if has_git else ["after"]  # no git checkout: no baseline
    data, stdout = run_bench(
        "bench.samplecost",
        "--url",
        str(tmp_path / "shards"),
        "--s3",
        *(["--baseline", "HEAD"] if has_git else []),
        "--rounds",
        "1",  # each round runs every path of both revisions: one shows the table's shape
        "--epochs",
        "2",
        out=out,
        timeout=600,
    )
    for source in ("local files", "S3, loopback"):
        assert list(data[source]) == ["iter", "take"]
        for path in data[source].values():
            assert list(path) == sides
            for side in path.values():
                assert side["samples"] == 40
                assert all(math.isfinite(n) and n >= 0 for n in numbers(side))
    assert "| S3, loopback | take | after |" in stdout


def test_samplecost_benchmark_with_the_defaults_and_webdataset(tmp_path: Path) -> None:
    """``--defaults`` reads with the library's defaults; ``--webdataset`` adds webdataset's
    own plain iteration of the same shards, on the ``iter`` path only."""
    from tests._foreign import webdataset_shard, write

    write(tmp_path / "shards", [webdataset_shard("a.tar", 0, 30)])
    data, stdout = run_bench(
        "bench.samplecost",
        *("--url", str(tmp_path / "shards"), "--defaults", "--webdataset"),
        *("--rounds", "1", "--epochs", "2"),
        out=tmp_path / "samplecost.json",
        timeout=600,
    )
    assert data["settings"] == "defaults"
    assert list(data["local files"]["iter"]) == ["after", "webdataset"]
    assert list(data["local files"]["take"]) == ["after"]
    for path in data["local files"].values():
        for side in path.values():
            assert side["samples"] == 30
            assert all(math.isfinite(n) and n >= 0 for n in numbers(side))
    assert "| local files | iter | webdataset |" in stdout


def test_samplecost_benchmark_times_the_consumer_steps(tmp_path: Path) -> None:
    """``--steps`` times each step of the consumer in process: every step the revision
    has, with its µs a sample, calls an epoch and µs a call, in the JSON and a table."""
    from tests._foreign import webdataset_shard, write

    write(tmp_path / "shards", [webdataset_shard("a.tar", 0, 30)])
    data, stdout = run_bench(
        "bench.samplecost",
        *("--url", str(tmp_path / "shards"), "--defaults", "--steps", "--paths", "take"),
        *("--rounds", "1", "--epochs", "2"),
        out=tmp_path / "samplecost.json",
        timeout=600,
    )
    side = data["local files"]["take"]["after"]
    assert side["samples"] == 30
    steps = {k.removeprefix("step: "): v for k, v in side.items() if k.startswith("step: ")}
    for step in ("load a chunk", "index a chunk (the tar reader)", "a run of draws"):
        us, calls, per_call = steps[step]
        assert calls >= 1
        assert us > 0
        assert per_call > 0
    for figures in steps.values():
        assert len(figures) == 3
        assert all(math.isfinite(n) and n >= 0 for n in figures)
    assert "| local files | take | after | load a chunk |" in stdout


def test_localring_benchmark_reads_both_settings_from_local_files(tmp_path: Path) -> None:
    from asyncstream import pack
    from asyncstream.testing import generate_imagefolder

    generate_imagefolder(tmp_path / "images", 40, 2, seed=0, workers=1)
    pack(tmp_path / "images", str(tmp_path / "shards"), shard_samples=10, shard_bytes=None)
    data, stdout = run_bench(
        "bench.localring",
        "--data",
        str(tmp_path / "shards"),
        "--rounds",
        "1",
        "--epochs",
        "2",
        out=tmp_path / "localring.json",
    )
    assert list(data["runs"]) == ["after, default", "after, small"]
    for run in data["runs"].values():
        (row,) = run["rounds"]
        assert row == run["median"]
        assert row["mb_per_s"] > 0
        assert row["reads_per_epoch"] >= 4  # 4 shards: a read each at least
        assert all(math.isfinite(n) and n >= 0 for n in numbers(row))
    small = data["runs"]["after, small"]["median"]
    assert small["ring_mib"] <= data["runs"]["after, default"]["median"]["ring_mib"]
    assert "| after, small |" in stdout


def test_tarblocks_benchmark_reads_every_sample_at_each_block_size(tmp_path: Path) -> None:
    """``bench.tarblocks`` reads a ``webdataset.TarWriter`` shard of about 4 MiB in blocks
    of 1 and 2 MiB, both sides against the tree itself as the baseline."""
    from tests._foreign import webdataset_shard, write

    shard = webdataset_shard("a.tar", 0, 600)
    write(tmp_path / "shards", [shard])
    revision = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    data, stdout = run_bench(
        "bench.tarblocks",
        *("--data", str(tmp_path / "shards"), "--blocks", "2,1", "--rounds", "1"),
        *("--repeat", "1", "--baseline", revision),
        out=tmp_path / "tarblocks.json",
    )
    assert list(data["runs"]) == [
        "before, 1 MiB",
        "before, 2 MiB",
        "after, 1 MiB",
        "after, 2 MiB",
    ]
    blocks = -(-len(shard.data) // (1 << 20))
    for label, run in data["runs"].items():
        (row,) = run["rounds"]
        assert row["samples"] == 600
        assert row["blocks"] == (blocks if label.endswith(" 1 MiB") else -(-blocks // 2))
        assert row["general"] >= 1  # at least one member cut by a block's end
        assert math.isfinite(run["us_per_sample"])
        assert run["us_per_sample"] > 0
        assert (run["us_per_edge"] is None) == label.endswith("2 MiB")
    assert "| after | 1 MiB |" in stdout


def test_tarblocks_benchmark_reads_the_shards_as_webdataset_writes_them(tmp_path: Path) -> None:
    """``bench.tarblocks --writer webdataset`` writes the samples of ``--data`` again with
    ``webdataset.TarWriter`` beside it, once, and reads those: the same samples, every
    member behind a PAX header of its mtime, which the walk reads (the general parser
    only an entry whose headers a block's end cuts, where it read all 900 before)."""
    from tests._foreign import tarfile_shard, write

    write(tmp_path / "shards", [tarfile_shard("a.tar", 0, 300)])
    data, _ = run_bench(
        "bench.tarblocks",
        *("--data", str(tmp_path / "shards"), "--blocks", "1", "--rounds", "1"),
        *("--repeat", "1", "--writer", "webdataset"),
        out=tmp_path / "tarblocks.json",
    )
    (row,) = data["runs"]["after, 1 MiB"]["rounds"]
    assert row["samples"] == 300
    assert row["general"] <= row["blocks"] - 1
    (shard,) = (tmp_path / "shards-wds").glob("*.tar")
    assert shard.read_bytes()[156] == ord("x")  # TarWriter's PAX header first


def test_localread_benchmark_reads_on_the_loop_and_in_threads(tmp_path: Path) -> None:
    """``bench.localread`` reads a cached file both ways: every read of the loop's runs
    answered by the page cache, every read of the threads' runs in a thread."""
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "a.tar").write_bytes(bytes(range(256)) * (3 << 12))  # 3 MiB
    data, stdout = run_bench(
        "bench.localread",
        *("--data", str(tmp_path / "shards"), "--reads", "24", "--rounds", "1"),
        out=tmp_path / "localread.json",
    )
    assert list(data["runs"]) == ["1, loop", "1, thread", "8, loop", "8, thread"]
    for label, run in data["runs"].items():
        (row,) = run["rounds"]
        loop = label.endswith("loop")
        assert (row["cached_reads"], row["thread_reads"]) == ((24, 0) if loop else (0, 24))
        assert all(math.isfinite(n) and n > 0 for n in numbers(row) if n)
    assert "| 8 | thread |" in stdout
    cold, _ = run_bench(
        "bench.localread",
        *("--data", str(tmp_path / "shards"), "--reads", "24", "--rounds", "1", "--cold"),
        out=tmp_path / "cold.json",
    )
    assert cold["cold"] is True
    for label, run in cold["runs"].items():
        (row,) = run["rounds"]  # each range of the 3 MiB file once, from the disk
        if label.endswith("thread"):
            assert (row["cached_reads"], row["thread_reads"]) == (0, 3)
        else:  # the page cache first: readahead may have brought the next range in
            assert row["cached_reads"] + row["thread_reads"] == 3


@pytest.mark.parametrize("flank", [False, True])
def test_feed_benchmark_realistic_run_reports_each_rounds_first_epoch(
    tmp_path: Path, flank: bool
) -> None:
    """``bench.feed --parts real`` at its smallest (DALI on the CPU): the loader's epochs
    beside DALI's ceiling, each with its page faults, and each round's first epoch; with
    ``--flank``, the ceiling measured again after the loader and the ratio against the
    mean of the two."""
    data, stdout = run_bench(
        "bench.feed",
        *("--parts", "real", "--images", "40", "--epochs", "2", "--repeat", "2"),
        *("--threads", "1", "--data", str(tmp_path), *(["--flank"] if flank else [])),
        out=tmp_path / "feed.json",
    )
    real = data["real"]
    runs = real["runs"]["after"]
    assert real["flanked"] is flank
    assert sorted(runs) == sorted(
        ["ceiling", "loader, 0 workers", *(["ceiling after 0 workers"] if flank else [])]
    )
    steady = statistics.mean(e["images_per_s"] for e in runs["loader, 0 workers"][1:])
    ceilings = [runs["ceiling"][1:], *([runs["ceiling after 0 workers"][1:]] if flank else [])]
    reference = statistics.mean(statistics.mean(c) for c in ceilings)
    assert real["ratios"]["after"]["0 workers"][-1] == pytest.approx(steady / reference)
    epochs = real["runs"]["after"]["loader, 0 workers"]
    assert [e["images"] for e in epochs] == [40, 40]
    for epoch in epochs:
        assert epoch["minor_faults_per_image"] >= 0
        assert epoch["huge_page_faults"] >= 0
        assert all(math.isfinite(n) for n in numbers(epoch))
    firsts = real["first"]["after"]["0 workers"]
    assert len(firsts) == 2  # a round each
    first, last = epochs
    assert firsts[-1] == [
        first["images_per_s"],
        first["huge_page_faults"],
        first["feed_cpu_us"],
        last["feed_cpu_us"],
    ]
    assert first["feed_cpu_us"] > 0  # the producer thread's CPU, workers=0
    assert "first epoch img/s (huge pages faulted in; feed thread" in stdout


def test_bombs_benchmark_reads_each_bomb_in_a_capped_child(tmp_path: Path) -> None:
    """Today's reader refuses every bomb of ``bench.bombs`` (each in its own child)."""
    out = tmp_path / "bombs.json"
    rows, _ = run_bench("bench.bombs", out=out)
    assert [(r["bomb"], r["side"]) for r in rows] == [
        ("sparse", "today"),
        ("sparse", "today"),
        ("gzip", "today"),
        ("zstd", "today"),
    ]
    assert all(r["outcome"] == "CorruptTarError" for r in rows), rows
    assert all(r["shard"] < 1 << 20 and r["claims"] >= 512 << 20 for r in rows)
    assert all(math.isfinite(r["peak_mib"]) for r in rows), rows


@pytest.mark.timeout(600)
def test_endtoend_benchmark_reads_local_files_and_https_both_ways(tmp_path: Path) -> None:
    """``bench.endtoend`` feeds every image from local files and over HTTPS, and reports
    finite costs per image."""
    out = tmp_path / "endtoend.json"
    data, stdout = run_bench(
        "bench.endtoend",
        *("--images", "24", "--data", str(tmp_path), "--rounds", "1", "--epochs", "1"),
        "--sides",
        "after",
        out=out,
        timeout=500,
    )
    for source in ("local files", "HTTPS, loopback"):
        assert list(data[source]) == ["after"]
        for side in data[source].values():
            assert side["images"] == 24
            assert all(math.isfinite(n) and n > 0 for n in numbers(side))
    assert "| HTTPS, loopback | after |" in stdout


@pytest.mark.timeout(300)
def test_blenddraw_benchmark_drains_the_blended_window_and_takes_a_mixed_stream(
    tmp_path: Path,
) -> None:
    from asyncstream import pack
    from asyncstream.testing import generate_imagefolder

    generate_imagefolder(tmp_path / "images", 20, 2, seed=0, workers=1)
    pack(tmp_path / "images", str(tmp_path / "shards"), shard_samples=10, shard_bytes=None)
    out = tmp_path / "blenddraw.json"
    data, _stdout = run_bench(
        "bench.blenddraw",
        "--url",
        str(tmp_path / "shards"),
        *("--rounds", "2", "--epochs", "2", "--pieces", "12", "--piece", "30"),
        *("--chunk", "7", "--window", "3"),
        out=out,
        timeout=280,
    )
    for side in ("before", "after"):
        alone = data["draw alone"][side]
        assert alone["samples"] == 12 * 30  # every sample of the pieces, drawn once
        assert 0 < alone["draw_many_us_per_sample"] <= alone["us_per_sample"]
    assert list(data["take"]) == ["after"]  # no --baseline: this tree alone
    assert data["take"]["after"]["samples"] == 2 * 20  # the folder twice, weight 1 each
    assert data["take"]["after"]["consumer_us_per_sample"] > 0


@pytest.mark.timeout(600)
def test_autotune_benchmark_sweeps_fixed_k_and_auto_on_both_links(tmp_path: Path) -> None:
    """``bench.autotune`` reads a small packed folder through pinned nginx on the fast and
    the slow link, each fixed K and auto, every sample once an epoch."""
    from asyncstream import pack
    from asyncstream.testing import NginxUnavailable, _nginxinstall, generate_imagefolder

    try:
        _nginxinstall.install()
    except NginxUnavailable as exc:
        pytest.skip(f"nginx with its Lua module cannot be installed here: {exc}")
    generate_imagefolder(tmp_path / "images", 40, 2, seed=0, workers=1)
    pack(tmp_path / "images", str(tmp_path / "shards"), shard_samples=10, shard_bytes=None)
    data, stdout = run_bench(
        "bench.autotune",
        *("--quick", "--data", str(tmp_path / "shards")),
        out=tmp_path / "autotune.json",
        timeout=500,
    )
    assert list(data["links"]) == ["fast", "slow"]
    for link in data["links"].values():
        assert list(link["rows"]) == ["2", "8", "auto"]
        assert all(math.isfinite(n) and n >= 0 for n in numbers(link["rows"]))
        assert link["best_fixed"] in (2, 8)
        assert 1 <= min(link["rows"]["auto"]["concurrency_end"]) <= 16
    assert "| slow | auto |" in stdout


@pytest.mark.timeout(400)
def test_tls_benchmark_reads_both_ports_of_one_pinned_nginx(tmp_path: Path) -> None:
    """``bench.tls --server nginx --rcvlowat``: HTTP and HTTPS rows from one nginx, pinned,
    its CPU read for both schemes, each row with the engine's receive mark and without,
    every figure finite."""
    from asyncstream.testing import NginxUnavailable, _nginxinstall

    try:
        _nginxinstall.install()
    except NginxUnavailable as exc:
        pytest.skip(f"nginx with its Lua module cannot be installed here: {exc}")
    data, stdout = run_bench(
        *("bench.tls", "--server", "nginx", "--quick", "--repeat", "1", "--rcvlowat"),
        out=tmp_path / "tls.json",
    )
    assert data["server"] == "nginx"
    assert [(r["chunk_mib"], r["transport"], r["mark"]) for r in data["rows"]] == [
        (chunk, transport, mark)
        for chunk in (1, 16)
        for transport in ("direct", "aiohttp")
        for mark in ("on", "off")
    ]
    for row in data["rows"]:
        assert all(math.isfinite(n) and n >= 0 for n in numbers(row))
        assert row["http_mb_per_s"] > 0
        assert row["https_mb_per_s"] > 0
        assert row["https_server_cpu_s_per_gb"] is not None  # nginx's /proc, read
    assert "nginx, loopback" in stdout
    assert "| 16 MiB | direct | off |" in stdout


def test_shuffle_benchmark_at_one_window_compares_block_sizes(tmp_path: Path) -> None:
    """``bench.shuffle --window``: one row per block size at the same window, the figures
    of a real simulated order (classes per batch between 1 and a batch's 64)."""
    data, stdout = run_bench(
        "bench.shuffle",
        *("--window", "8", "--chunks", "5,50", "--seeds", "1", "--jobs", "1"),
        out=tmp_path / "shuffle.json",
    )
    assert [(r["window"], r["chunk"]) for r in data["rows"]] == [(8, 5), (8, 50)]
    for row in data["rows"]:
        assert 0 <= row["abs_correlation"] <= 1
        assert 1 <= row["distinct_classes_per_batch"] <= 64
    assert "| 8 | 50 |" in stdout
