"""What the focused benchmarks share: their command line, the header of their figures, and
how they report them (the older ones, ``fetch.py`` and ``stream.py``, predate it)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def arguments(
    doc: str, more: Callable[[argparse.ArgumentParser], None] | None = None
) -> argparse.Namespace:
    """``--quick``, ``--repeat N`` and ``--json PATH``, with the module's first doc line;
    ``more`` adds a module's own options."""
    from asyncstream.cli._cli import DefaultsHelpFormatter

    parser = argparse.ArgumentParser(
        description=doc.splitlines()[0], formatter_class=DefaultsHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="small sizes, a smoke run (default: full sizes)"
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs of each measurement")
    parser.add_argument("--json", help="write the figures to this file (default: print only)")
    if more is not None:
        more(parser)
    return parser.parse_args()


def precompile(*trees: Path) -> None:
    """Write the bytecode of ``asyncstream`` and ``dali_ops`` under each tree, as
    ``pip install .`` does for a user (and did for every peer's package).

    A checkout imported with ``PYTHONDONTWRITEBYTECODE`` set (this machine's environment)
    compiles every module from source in every fresh process: 0.15 to 0.4 s of a first
    sample (cProfile: 94 modules through ``compile``), which no installed package pays.
    """
    import compileall

    for tree in trees:
        for package in ("asyncstream", "dali_ops"):
            if (tree / package).is_dir():
                compileall.compile_dir(str(tree / package), quiet=1)


def header() -> dict[str, Any]:
    """The date and the machine, first in every figures file."""
    return {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
    }


def report(out: dict[str, Any], text: str, json_path: str | None) -> None:
    """Print the tables; write the figures as JSON where asked."""
    print(text)
    if json_path:
        Path(json_path).write_text(json.dumps(out, indent=1))


ROOT = Path(__file__).resolve().parent.parent


def run_child(
    script: Path, config: dict[str, Any], source: Path, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run ``script --child CONFIG`` in a fresh process with the ``asyncstream`` found in
    ``source`` (a baseline's extracted tree, or this one), and return the JSON object it
    prints last."""
    env = {**(os.environ if env is None else env), "PYTHONPATH": str(source)}
    done = subprocess.run(
        [sys.executable, str(script), "--child", json.dumps(config)],
        env=env,
        cwd=source,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{script.name} --child {config} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def baseline_tree(rev: str, folder: Path) -> Path:
    """Revision ``rev``'s ``asyncstream`` and ``dali_ops`` in ``folder``, its C extensions
    built in place where it has any."""
    names = subprocess.run(
        ["git", "-C", str(ROOT), "ls-tree", "--name-only", rev],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    wanted = [n for n in ("asyncstream", "dali_ops", "setup.py") if n in names]
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, *wanted], check=True, capture_output=True
    ).stdout
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    if "setup.py" in wanted and any(folder.rglob("*.c")):
        subprocess.run(
            [sys.executable, "setup.py", "--quiet", "build_ext", "--inplace"],
            cwd=folder,
            check=True,
            capture_output=True,
        )
    return folder


def rounds_arguments(
    parser: argparse.ArgumentParser, child: Callable[[dict[str, Any]], dict[str, Any]]
) -> argparse.Namespace:
    """The command line of a benchmark that runs each side in a fresh child process,
    round by round: ``--baseline REV``, ``--rounds``, ``--json`` and the child's own
    ``--child CONFIG``, where ``child`` measures, its figures are printed as JSON and the
    process exits."""
    parser.add_argument("--baseline", help="a git revision to compare with, in the same rounds")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        # The side's asyncstream is on PYTHONPATH (run_child): not the one of the tree this
        # script is in, which its main() put first to import this module.
        if sys.path[0] == str(ROOT):
            del sys.path[0]
        row = child(json.loads(args.child))
        import asyncstream

        row["source"] = str(Path(asyncstream.__file__).resolve().parent.parent)
        print(json.dumps(row))
        raise SystemExit(0)
    return args


def side_by_side(
    script: Path, configs: dict[str, dict[str, Any]], baseline: str | None, rounds: int
) -> tuple[list[str], dict[tuple[str, str], list[dict[str, Any]]]]:
    """Run ``script --child CONFIG`` for each of ``configs`` on each side, ``rounds``
    times: ``after`` (this tree) and, with ``baseline``, ``before`` (that revision's
    tree), the sides' order turned every other round. Returns the sides and each
    ``(side, config's name)``'s rows, one a round, each printed as it comes."""
    import tempfile

    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        sides = {"after": ROOT}
        if baseline:
            sides = {"before": baseline_tree(baseline, Path(tmp)), **sides}
        for round_ in range(rounds):
            for side in list(sides) if round_ % 2 == 0 else list(reversed(sides)):
                for name, config in configs.items():
                    row = run_child(script, config, sides[side])
                    source = row.pop("source")
                    if Path(source) != sides[side].resolve():  # what the side is about
                        raise RuntimeError(f"{side}: the child read {source}, not {sides[side]}")
                    runs.setdefault((side, name), []).append(row)
                    print(f"round {round_}, {side}, {name}: {row}", flush=True)
    return list(sides), runs
