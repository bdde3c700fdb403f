"""The decode stages of the probe, measured by ``dali_ops`` in a process of its own.

asyncstream never imports DALI nor ``dali_ops`` (the import contracts in
``pyproject.toml``), so the feed and the decoder are measured by ``python -m
dali_ops._probe``: it reads a JSON request on its standard input (the URL, how to reach
the store, the seconds, the stream's settings) and prints its figures as JSON. The
store's options, credentials included, go through the pipe, never the command line.
Where ``dali_ops`` or DALI is not installed, or the child fails, the stage says why and
is not measured.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys
from typing import Any

from ..stores._s3 import S3Options

__all__ = ["measure_decode", "options_to_json"]

_START_S = 300.0  # the child's imports (torch, DALI) and its pipeline's build, on a busy machine
_MODULE = "dali_ops._probe"


def options_to_json(options: S3Options) -> dict[str, Any]:
    """The store's options as plain JSON (``dali_ops._probe`` makes them back)."""
    return dataclasses.asdict(options)


def measure_decode(
    url: str | list[str], options: S3Options, *, seconds: float, inflight: int, chunk_bytes: int
) -> dict[str, Any]:
    """The feed's and the decoder's figures, or ``{"not_measured": why}``."""
    if importlib.util.find_spec("dali_ops") is None:
        return {"not_measured": "dali_ops not installed"}
    request = {
        "url": url,
        "s3": options_to_json(options),
        "seconds": seconds,
        "inflight": inflight,
        "chunk_bytes": chunk_bytes,
    }
    try:
        done = subprocess.run(
            [sys.executable, "-m", _MODULE],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=seconds + _START_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"not_measured": f"the decode probe took over {seconds + _START_S:.0f} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode == 0 and lines:
        try:
            figures = json.loads(lines[-1])
        except json.JSONDecodeError:
            figures = None
        if isinstance(figures, dict):
            return figures
    said = (done.stderr.strip().splitlines() or ["no message"])[-1]
    return {"not_measured": f"the decode probe failed (exit {done.returncode}): {said}"}
