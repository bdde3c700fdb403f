"""Tar names grouped natively (``asyncstream/shards/_tarwalk.c``) and by numpy (its
reference, ``asyncstream/shards/_targroup.py``) on shards ``pack`` did not write: long runs
of small members from GNU tar (upper-case ``.JPEG`` included), ``tarfile`` and
``webdataset.TarWriter``, read by ``ShardStream`` from local files (both ways), over HTTPS
and in ``StatefulDataLoader`` workers (natively, as users read), each against webdataset's
reading of the same tars. ``tests/test_tarfast.py`` and ``tests/test_native_tar.py`` check
the walks against the general parser byte for byte; here the whole path is checked against
the ecosystem's reader.
"""

from __future__ import annotations

import random
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

from asyncstream import LocalS3, ShardStream
from asyncstream.shards import _tarfast, _targroup
from tests._foreign import gnu_tar, write_foreign_shards
from tests._wds import wds_samples

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

SAMPLES = 120  # a shard: 360 members, runs far longer than VECTOR_MIN


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two shards from ``tarfile`` and ``webdataset.TarWriter`` and one from GNU tar, whose
    images are named ``.JPEG`` as ImageNet's are."""
    root = tmp_path_factory.mktemp("targroup")
    shards = write_foreign_shards(
        root / "shards", 2, counts=[SAMPLES] * 2, jpg_bytes=(30, 300), seed=9
    )
    tar = gnu_tar()
    if tar is None:
        pytest.skip("GNU tar is not installed")
    rng = random.Random(4)
    files = root / "files" / "train"
    files.mkdir(parents=True)
    for i in range(SAMPLES):
        (files / f"n01440764_{i:05d}.JPEG").write_bytes(rng.randbytes(rng.randint(30, 300)))
        (files / f"n01440764_{i:05d}.cls").write_bytes(b"%d" % (i % 5))
    subprocess.run(
        [
            tar,
            "--sort=name",
            "-cf",
            str(shards.folder / "gnu-00000.tar"),
            "-C",
            str(root / "files"),
            "train",
        ],
        check=True,
    )
    return shards.folder


def webdataset_reads(folder: Path) -> dict[tuple[str, str], dict[str, bytes]]:
    """webdataset's samples of every shard, by (shard file, key)."""
    return {
        (path.name, sample["__key__"]): {k: v for k, v in sample.items() if k != "__key__"}
        for path in sorted(folder.glob("*.tar"))
        for sample in wds_samples(path.read_bytes(), path.name)
    }


def by_shard_and_key(samples: Iterator[dict[str, Any]]) -> dict[tuple[str, str], dict[str, bytes]]:
    return {
        (s["__url__"].rsplit("/", 1)[1], s["__key__"]): {
            k: bytes(v) for k, v in s.items() if not k.startswith("__")
        }
        for s in samples
    }


@pytest.fixture(params=["native", "numpy"])
def grouped_runs(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many members each walk grouped in this process: the native walk's, or (with the
    native walk off) the numpy grouping's runs."""
    taken: list[int] = []
    if request.param == "native":
        walk = _tarfast._NATIVE_WALK
        assert walk is not None, "the extension is not built"

        def walked(*args: Any) -> Any:
            out = walk(*args)
            taken.append(sum(len(record) - 2 for record in out[2]))
            return out

        monkeypatch.setattr(_tarfast, "_NATIVE_WALK", walked)
        return taken
    monkeypatch.setattr(_tarfast, "NATIVE", False)
    monkeypatch.setenv("ASYNCSTREAM_NATIVE", "0")  # a child process started here
    group_run = _targroup.group_run

    def counted(*args: Any) -> Any:
        out = group_run(*args)
        if out is not None:
            taken.append(len(args[1]))
        return out

    monkeypatch.setattr(_targroup, "group_run", counted)
    return taken


def test_local_shards_from_three_writers_read_as_webdataset_reads_them(
    folder: Path, grouped_runs: list[int]
) -> None:
    with ShardStream(str(folder), seed=1, window=3, index_cache=False) as stream:
        got = by_shard_and_key(iter(stream))
    expected = webdataset_reads(folder)
    assert got == expected
    assert len(got) == 3 * SAMPLES
    assert {k for (shard, _), v in got.items() if shard.startswith("gnu") for k in v} == {
        "jpeg",
        "cls",
    }
    assert sum(grouped_runs) >= 3 * SAMPLES * 2  # nearly every member grouped so


@pytest.mark.parametrize("grouped_runs", ["native"], indirect=True)
def test_over_https_and_in_two_workers_as_webdataset_reads_them(
    folder: Path, s3_server: LocalS3, s3_tls_server: LocalS3, grouped_runs: list[int]
) -> None:
    client = s3_server.client()  # moto's backend is shared by its HTTP and HTTPS servers
    client.create_bucket(Bucket="targroup")
    for path in sorted(folder.glob("*.tar")):
        client.put_object(Bucket="targroup", Key=f"t/{path.name}", Body=path.read_bytes())
    expected = webdataset_reads(folder)
    with ShardStream("s3://targroup/t/", s3=s3_tls_server.options(), seed=2) as stream:
        over_https = by_shard_and_key(iter(stream))
        assert stream.stats()["fetch"]["stores"][0]["tls"]
    assert over_https == expected
    assert sum(grouped_runs)  # the native walk read these too
    with ShardStream("s3://targroup/t/", s3=s3_tls_server.options(), seed=2) as stream:
        loader = StatefulDataLoader(stream, batch_size=None, num_workers=2)
        in_workers = by_shard_and_key(iter(loader))
    assert in_workers == expected
