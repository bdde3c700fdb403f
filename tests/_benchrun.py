"""What the benchmark tests share: the repository root and every number in a figures file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def numbers(value: Any) -> list[float]:
    """Every number in ``value`` (a figures file's JSON), booleans left out."""
    if isinstance(value, bool):
        return []
    if isinstance(value, int | float):
        return [float(value)]
    if isinstance(value, dict):
        return [n for v in value.values() for n in numbers(v)]
    if isinstance(value, list):
        return [n for v in value for n in numbers(v)]
    return []


def run_bench(module: str, *args: str, out: Path, timeout: float = 600) -> tuple[Any, str]:
    """``python -m module ARGS --json out`` from the repository root: the figures it wrote
    and its stdout; the test fails with the end of its stderr where it fails."""
    proc = subprocess.run(
        [sys.executable, "-m", module, *args, "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text()), proc.stdout
