"""``asyncstream demo``, end to end at its smallest: generate, pack onto an embedded S3
server, stream, decode with DALI (on the CPU here) and train; and ``--quick``'s sizes."""

from __future__ import annotations

import argparse

import pytest

from asyncstream.cli._cli import _parser, main


def _args(*argv: str) -> argparse.Namespace:
    return _parser().parse_args(["demo", *argv])


def test_quick_sizes_and_explicit_ones() -> None:
    from dali_ops._demo import _FULL, _QUICK, _sizes

    full, quick = _args(), _args("--quick")
    _sizes(full)
    _sizes(quick)
    assert (full.images, full.shards, full.steps) == tuple(_FULL.values())
    assert (quick.images, quick.shards, quick.steps) == tuple(_QUICK.values())
    assert quick.images < 1000
    assert quick.steps < 100
    given = _args("--quick", "--images", "50")
    _sizes(given)
    assert (given.images, given.shards) == (50, _QUICK["shards"])
    with pytest.raises(ValueError, match="--steps must be at least 1"):
        _sizes(_args("--steps", "0"))


@pytest.mark.slow
def test_the_demo_runs_end_to_end(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["demo", "--quick", "--images", "48", "--shards", "3", "--steps", "3"]
    assert main([*argv, "--image-size", "32", "--device", "cpu", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "embedded S3 server at http://127.0.0.1:" in out
    assert "generated 48 JPEGs in 10 classes" in out
    assert "packed into 3 shards" in out
    assert "trained             3 steps x 32 images at 32 px" in out
