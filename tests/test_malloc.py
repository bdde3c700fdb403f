"""Freed memory kept in the process (``asyncstream/stream/_malloc.py``): once a stream is
iterated, glibc's malloc keeps the top of its heap rather than giving it back and faulting
it in again; the environment's own settings, and ``ASYNCSTREAM_MALLOC=0``, are left alone.

The behaviour is seen in fresh processes (the settings are process-wide): 40 MiB of
``bytes`` freed and allocated again fault in a few pages where the memory was kept, and
every page where it was given back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from asyncstream.stream import _malloc
from tests._foreign import tarfile_shard, write

ROOT = Path(__file__).resolve().parent.parent
GLIBC = _malloc._glibc() is not None

CHILD = """
import json, resource, sys
from asyncstream import ShardStream

def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

with ShardStream(sys.argv[1], shuffle=False) as stream:
    n = sum(1 for _ in stream)
    state = stream.stats()["malloc"]
blocks = [b"x" * (1 << 20) for _ in range(40)]  # 40 MiB, each block below 16 MiB
del blocks
before = faults()
blocks = [b"y" * (1 << 20) for _ in range(40)]
print(json.dumps({"samples": n, "malloc": state, "faults": faults() - before}))
"""


def _child(folder: Path, **env: str) -> dict[str, Any]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    environ.pop("ASYNCSTREAM_MALLOC", None)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(folder)],
        env={**environ, **env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("malloc")
    write(path, [tarfile_shard("a.tar", 0, 20)])
    return path


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_an_iterated_stream_keeps_freed_memory_in_the_process(folder: Path) -> None:
    tuned = _child(folder)
    assert tuned["samples"] == 20
    assert tuned["malloc"] == "tuned"
    assert tuned["faults"] < 40 * 256 // 4  # a quarter of the pages at most
    untuned = _child(folder, ASYNCSTREAM_MALLOC="0")
    assert untuned["malloc"] == "off"
    assert untuned["faults"] > 40 * 256 // 2  # given back, faulted in again


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_the_environments_malloc_settings_are_left_alone(folder: Path) -> None:
    assert _child(folder, MALLOC_TRIM_THRESHOLD_="131072")["malloc"] == "environment"
    assert _child(folder, MALLOC_TOP_PAD_="0")["malloc"] == "environment"


class _Libc:
    """glibc's ``mallopt`` as the decision sees it: the calls made, and its answer."""

    def __init__(self, answer: int = 1) -> None:
        self.answer = answer
        self.calls: list[tuple[int, int]] = []

    def mallopt(self, option: int, value: int) -> int:
        self.calls.append((option, value))
        return self.answer


def test_the_decision() -> None:
    libc = _Libc()
    assert _malloc.decide({}, libc) == "tuned"
    assert libc.calls == [(-3, 16 << 20), (-1, 64 << 20)]  # mmap threshold, then trim
    for environ, expected in (
        ({"ASYNCSTREAM_MALLOC": "0"}, "off"),
        ({"MALLOC_MMAP_THRESHOLD_": "1"}, "environment"),
        ({"ASYNCSTREAM_MALLOC": "1", "MALLOC_TOP_PAD_": "1"}, "environment"),
    ):
        libc = _Libc()
        assert _malloc.decide(environ, libc) == expected
        assert libc.calls == []
    assert _malloc.decide({}, None) == "unavailable"
    assert _malloc.decide({}, _Libc(answer=0)) == "unavailable"
