"""No wall at /dev/shm: a stream's rings and the DataLoader workers' batch buffers are
memfd segments, so a container's default 64 MB /dev/shm (Docker; Kubernetes without a
memory volume) does not bind them.

Run for real: a child process in a private mount namespace (``unshare -m``) with a 64 MiB
tmpfs mounted over /dev/shm (``tests/_small_shm_child.py``). There, a 160 MiB POSIX
segment still dies of SIGBUS (the wall is real), while a 160 MiB ring filled by its engine
process, and DALIImageLoader with 4 StatefulDataLoader workers whose rings and buffers
pass 64 MiB, work; nothing is left behind."""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from _jpegs import jpeg_of

pytest.importorskip("nvidia.dali")
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

MiB = 1 << 20
CHUNK = 32 * MiB
RING = 5 * CHUNK  # 160 MiB: two and a half times /dev/shm
SHARDS, PER_SHARD, IMAGE = 8, 16, 256 << 10  # 4 MiB shards of 256 KiB JPEGs: 32 MiB
CHILD = Path(__file__).with_name("_small_shm_child.py")
SMALL_SHM = "mount -t tmpfs -o size=64m tmpfs /dev/shm"


def _small_shm_reason() -> str | None:
    """Why a private 64 MiB /dev/shm cannot be had here, or None."""
    if shutil.which("unshare") is None:
        return "no unshare(1) on this machine"
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"{SMALL_SHM} && df -k /dev/shm"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if probe.returncode != 0:
        return f"no private mount namespace with a 64 MiB /dev/shm here: {probe.stderr.strip()}"
    return None


def _shards(folder: Path) -> int:
    """Shards of padded JPEGs (decodable 8x8 images), 4 MiB each; returns the images."""
    folder.mkdir()
    rng = random.Random(0)
    for shard in range(SHARDS):
        with tarfile.open(folder / f"shard-{shard:04d}.tar", "w") as tar:
            for i in range(PER_SHARD):
                for ext, data in (("jpg", jpeg_of(rng, IMAGE)), ("cls", str(i % 4).encode())):
                    info = tarfile.TarInfo(f"{shard:04d}{i:04d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return SHARDS * PER_SHARD


def test_a_64_mib_dev_shm_binds_neither_rings_nor_batch_buffers(tmp_path: Path) -> None:
    reason = _small_shm_reason()
    if reason is not None:
        pytest.skip(reason)
    images = _shards(tmp_path / "shards")
    big = tmp_path / "big.bin"
    block = bytes(range(256)) * (MiB // 256)
    with big.open("wb") as f:
        for i in range(RING // MiB):
            f.write(block[i % 256 :] + block[: i % 256])  # each MiB different
    config = {
        "ring_bytes": RING,
        "chunk": CHUNK,
        "file": str(big),
        "shards": str(tmp_path / "shards"),
    }
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(CHILD.parent.parent), str(CHILD.parent)]),
    }
    command = f'{SMALL_SHM} && exec "$0" "$1" "$2"'
    result = subprocess.run(
        ["unshare", "-m", "sh", "-c", command, sys.executable, str(CHILD), json.dumps(config)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["shm_bytes"] == 64 * MiB
    assert report["posix_returncode"] == -signal.SIGBUS  # the wall is there, for /dev/shm
    ring = report["ring"]
    assert ring["nbytes"] > RING - 1  # 160 MiB and its header, written by the engine
    assert ring["same"]
    loader = report["loader"]
    assert loader["images"] == images  # one whole pass
    assert loader["node_ring_bytes"] > 64 * MiB  # the old check would have refused this
    assert len(loader["worker_pids"]) == 4
    assert report["left"] == []  # nothing outlives the run
