"""Every option of every ``asyncstream`` command, and of ``python -m bench``, says what it
does and, where it has a default, what the default is; ``asyncstream --version`` works."""

from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

from asyncstream.cli._cli import _parser, main
from bench.harness import make_parser

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = ("demo", "generate", "index", "ls", "pack", "probe", "serve")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("no subcommands")


def _flat(text: str) -> str:
    """``text`` without whitespace: argparse wraps lines, after hyphens too."""
    return "".join(text.split())


def _check_options(parser: argparse.ArgumentParser, shown: str) -> None:
    """Each option's help, as ``--help`` shows it (``shown``), says what it does and its
    default where it has one."""
    formatter = parser._get_formatter()
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        name = "/".join(action.option_strings)
        assert action.help, f"{parser.prog} {name} has no help text"
        rendered = _flat(formatter._expand_help(action))
        assert rendered in shown, f"{parser.prog} {name}: {rendered!r} is not in its --help"
        default = action.default
        if isinstance(action, argparse._HelpAction | argparse._VersionAction):
            continue
        if default is None or default is False or default == argparse.SUPPRESS:
            continue
        assert str(default) in rendered, f"{parser.prog} {name} hides its default {default!r}"


def test_the_commands_are_all_there() -> None:
    assert set(_subparsers(_parser())) == set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_has_help_and_shows_its_default(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0
    shown = _flat(capsys.readouterr().out)
    _check_options(_subparsers(_parser())[command], shown)


def test_the_main_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    shown = capsys.readouterr().out
    for command in COMMANDS:
        assert command in shown
    assert "--version" in shown


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"asyncstream {importlib.metadata.version('asyncstream')}\n"


def test_bench_options_have_help_and_show_their_defaults() -> None:
    """``python -m bench --help`` from the repository (bench is not installed)."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("usage: python -m bench")
    _check_options(make_parser(), _flat(proc.stdout))


def test_defaults_are_stated_once(capsys: pytest.CaptureFixture[str]) -> None:
    """An option whose help already states its default gets no second one."""
    with pytest.raises(SystemExit):
        main(["index", "--help"])
    shown = _flat(capsys.readouterr().out)
    assert "bytesperGET(default16MiB)--no-progress" in shown
    assert "(default16MiB)(default" not in shown


@pytest.mark.parametrize(
    "words", [["--help"], ["--version"], ["ls", "--help"], ["serve", "--help"], ["demo", "--help"]]
)
def test_help_and_version_import_neither_torch_nor_dali(words: list[str]) -> None:
    """The command answers at once: its help (the demo's too, which a plugin adds) and
    ``--version`` load neither PyTorch nor DALI, asserted on a fresh process's modules."""
    code = (
        "import json, sys\n"
        "from asyncstream.cli._cli import main\n"
        "try:\n"
        f"    main({words!r})\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == 0, exc.code\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] == 'torch' or "
        "m.startswith('nvidia.dali'))\n"
        "print(json.dumps(heavy), file=sys.stderr)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == "[]"
    if words[0] in ("--help", "demo"):
        assert "demo" in proc.stdout  # the plugin's command is there all the same
