"""Running a script as several processes under ``torch.distributed.run`` (gloo, the CPU)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def torchrun(
    script: Path, *args: str, nproc: int = 2, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """Run ``script ARGS`` as ``nproc`` ranks; this checkout's asyncstream is the one imported."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc_per_node={nproc}",
            f"--master_port={free_port()}",
            "--master_addr=127.0.0.1",
            str(script),
            *args,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
