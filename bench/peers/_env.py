"""The isolated environment of the peers, built by :func:`ensure_env`
(``python -m bench.peers.setup [--force]``).

``.venv-peers`` (beside ``.venv``, ignored by git) gets ``requirements.txt`` under
``constraints.txt``: torch 2.13.0 and torchvision 0.28.0 from the package registry (a
matching pair, the CUDA build: no CPU build of torchvision is on the registry), MosaicML
streaming, litdata, s3torchconnector and webdataset. pip runs with the registry only (no
configured ``find-links``), so that the CPU torch wheel the main environment uses is not
taken. ``obstore`` is removed afterwards: litdata cannot use it against a plain ``http://``
endpoint (see ``lit.py``).

The build is skipped when the environment exists and was built from the same files.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ._host import PEERS_VENV

__all__ = ["CONSTRAINTS", "REQUIREMENTS", "ensure_env"]

HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE / "requirements.txt"
CONSTRAINTS = HERE / "constraints.txt"
_STAMP = ".bench-peers-stamp"
_REMOVED = ("obstore",)


def _fingerprint() -> str:
    digest = hashlib.sha256()
    for path in (REQUIREMENTS, CONSTRAINTS):
        digest.update(path.read_bytes())
    digest.update(f"{sys.version_info[:2]}".encode())
    return digest.hexdigest()


def _pip_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PIP_FIND_LINKS", None)
    env["PIP_CONFIG_FILE"] = os.devnull  # no configured find-links or extra indexes
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _size(root: Path) -> int:
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                total += os.path.getsize(path)
    return total


def ensure_env(
    venv: Path = PEERS_VENV,
    *,
    force: bool = False,
    echo: Callable[[str], None] = print,
) -> Path:
    """Build the peers' environment unless it is already built from the same files.

    Args:
        venv: where (``.venv-peers`` in the repository by default).
        force: rebuild even when up to date.
        echo: where progress lines go.

    Returns:
        The environment's Python interpreter.

    Raises:
        subprocess.CalledProcessError: ``venv`` or ``pip`` failed.
    """
    python = venv / "bin" / "python"
    stamp = venv / _STAMP
    want = _fingerprint()
    if not force and python.exists() and stamp.exists() and stamp.read_text() == want:
        return python
    if venv.exists():
        shutil.rmtree(venv)
    start = time.monotonic()
    echo(f"creating {venv}")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = _pip_env()
    pip = [str(python), "-m", "pip"]
    echo(f"installing {REQUIREMENTS.name} under {CONSTRAINTS.name}")
    subprocess.run(
        [*pip, "install", "--progress-bar", "off", "-r", str(REQUIREMENTS), "-c", str(CONSTRAINTS)],
        check=True,
        env=env,
    )
    subprocess.run([*pip, "uninstall", "--yes", *_REMOVED], check=True, env=env)
    stamp.write_text(want)
    echo(f"built {venv} in {time.monotonic() - start:.0f} s, {_size(venv) / 1e9:.1f} GB on disk")
    return python
