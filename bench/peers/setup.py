"""Build the isolated environment of the peers: ``python -m bench.peers.setup [--force]``.

See :func:`bench.peers.ensure_env` and ``bench/peers/README.md``. Prints, at the end, which
peers run and in which interpreter, or why not.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from ._common import PEERS
from ._env import ensure_env
from ._host import PEERS_VENV, locate

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry; see the module docstring."""
    parser = argparse.ArgumentParser(prog="python -m bench.peers.setup", description=__doc__)
    parser.add_argument("--venv", type=Path, default=PEERS_VENV, help="where to build it")
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = parser.parse_args(argv)
    python = ensure_env(args.venv, force=args.force)
    for name in PEERS:
        where, why = locate(name, [sys.executable, str(python)])
        print(f"{name:17} {where if where is not None else why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
