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


def environment(**extra: str) -> dict[str, str]:
    """This process's environment, with this checkout's asyncstream first on the path."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path, **extra}


def command(
    script: Path,
    *args: str,
    nproc: int = 2,
    port: int | None = None,
    master: str = "127.0.0.1",
    nnodes: int = 1,
    node_rank: int = 0,
) -> list[str]:
    """The command line of one node of a torchrun job (static rendezvous at ``master``)."""
    nodes = [f"--nnodes={nnodes}", f"--node_rank={node_rank}"] if nnodes > 1 else []
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *nodes,
        f"--nproc_per_node={nproc}",
        f"--master_port={port or free_port()}",
        f"--master_addr={master}",
        str(script),
        *args,
    ]


def torchrun(
    script: Path, *args: str, nproc: int = 2, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """Run ``script ARGS`` as ``nproc`` ranks; this checkout's asyncstream is the one imported."""
    return subprocess.run(
        command(script, *args, nproc=nproc),
        env=environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
