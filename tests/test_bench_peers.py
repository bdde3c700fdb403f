"""The benchmark's peers against the session's S3 server: each peer that is installed reads
the whole dataset, each sample exactly once, and reports well-formed measurements; a peer
that is not installed is skipped with the reason."""

from __future__ import annotations

import random
from typing import Any

import pytest
from _jpegs import jpeg_of

from asyncstream import LocalS3, pack
from bench.peers import (
    PEERS,
    PeerSettings,
    available,
    default_target,
    run_peer,
    shuffle_quality_of,
)

CLASSES = 3
PER_CLASS = 20
N = CLASSES * PER_CLASS


@pytest.fixture(scope="module")
def dataset(s3_server: LocalS3, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """60 samples in 6 shards of 10, class-sorted (keys 0-19 are class 0, and so on)."""
    root = tmp_path_factory.mktemp("peers")
    rng = random.Random(7)
    nbytes = 0
    for label in range(CLASSES):
        folder = root / "src" / f"c{label}"
        folder.mkdir(parents=True)
        for i in range(PER_CLASS):
            data = jpeg_of(rng, rng.choice([100, 3000, 20000]))
            (folder / f"img{i:03d}.jpg").write_bytes(data)
            nbytes += len(data) + len(str(label))
    s3_server.client().create_bucket(Bucket="peers-data")
    options = s3_server.options()
    packed = pack(root / "src", "s3://peers-data/train/", shard_samples=10, options=options)
    assert len(packed.shards) == 6
    return {
        "url": "s3://peers-data/train/",
        "options": options,
        "bytes": nbytes,
        "workdir": root / "work",
    }


@pytest.fixture(scope="module")
def reasons() -> dict[str, str | None]:
    return available()


def run(dataset: dict[str, Any], name: str, **kwargs: Any) -> dict[str, Any]:
    options = dataset["options"]
    return run_peer(
        name,
        url=dataset["url"],
        workdir=dataset["workdir"],
        endpoint_url=options.endpoint_url,
        credentials=options.credentials,
        **kwargs,
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(PEERS))
def test_peer_reads_every_sample_once(
    dataset: dict[str, Any], reasons: dict[str, str | None], name: str
) -> None:
    if reasons[name] is not None:
        pytest.skip(f"{name} is not available: {reasons[name]}")
    result = run(dataset, name, timeout=90)
    assert result["ok"], result["error"]
    assert result["error"] is None
    assert result["shards"] == 6
    read = result["read"]
    keys, labels = read["keys"], read["labels"]
    # Exactly once: the dataset's keys, each emitted once, with their own labels.
    assert sorted(keys) == [f"{i:06d}" for i in range(N)]
    assert labels == [int(key) // PER_CLASS for key in keys]
    assert read["samples"] == N
    assert read["bytes"] == dataset["bytes"]
    assert 0 < read["first_sample_s"] <= read["seconds"]
    assert read["samples_per_s"] == pytest.approx(N / read["seconds"])
    assert read["mb_per_s"] == pytest.approx(dataset["bytes"] / read["seconds"] / 1e6)
    assert read["cpu_s"] == pytest.approx(read["cpu_self_s"] + read["cpu_children_s"])
    assert read["cpu_self_s"] > 0
    assert read["peak_rss_bytes"] >= read["rss_start_bytes"] > 0
    assert read["shm_bytes"] >= 0
    assert read["cache_bytes"] >= 0
    assert read["import_s"] >= 0
    assert read["shuffle"]
    assert read["versions"]
    # Shuffled, from the seed: not the stored order.
    assert keys != sorted(keys)
    quality = shuffle_quality_of(result)
    assert -1 <= quality.correlation < 1
    if PEERS[name].converts:
        converted = result["convert"]
        assert result["target"] == default_target(["s3://peers-data/train/x.tar"], name)
        assert converted["output_url"] == result["target"]
        assert converted["output_objects"] >= 2  # an index and data
        assert converted["output_bytes"] >= dataset["bytes"]
        assert converted["seconds"] > 0
    else:
        assert result["convert"] is None
        assert result["target"] is None


def test_the_same_seed_gives_the_same_order(dataset: dict[str, Any]) -> None:
    first, again, other = (run(dataset, "naive", settings=PeerSettings(seed=s)) for s in (3, 3, 4))
    assert all(result["ok"] for result in (first, again, other))
    assert first["read"]["keys"] == again["read"]["keys"] != other["read"]["keys"]


def test_a_failing_peer_reports_instead_of_raising(dataset: dict[str, Any]) -> None:
    result = run(dataset, "naive", settings=PeerSettings(workers=2))
    assert not result["ok"]
    assert result["read"] is None
    assert "workers must be 0" in result["error"]
    # The scratch folder is gone; the log stays for whoever reads the error.
    assert not (dataset["workdir"] / "naive-read").exists()
    assert (dataset["workdir"] / "naive-read.log").exists()


def test_a_peer_past_its_time_is_killed(dataset: dict[str, Any]) -> None:
    result = run(dataset, "naive", timeout=0.05)
    assert not result["ok"]
    assert "timed out after" in result["error"]


def test_bad_arguments_are_refused(dataset: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="unknown peer"):
        run(dataset, "tensorflow")
    with pytest.raises(ValueError, match="timeout"):
        run(dataset, "naive", timeout=0)
    with pytest.raises(ValueError, match="workers"):
        PeerSettings(workers=-1)
    with pytest.raises(TypeError, match="seed"):
        PeerSettings(seed=1.5)  # type: ignore[arg-type]


def test_available_names_every_peer(reasons: dict[str, str | None]) -> None:
    assert list(reasons) == list(PEERS)
    assert reasons["naive"] is None  # boto3 is always there
    for reason in reasons.values():
        assert reason is None or reason.strip()
