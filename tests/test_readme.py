"""The examples of the README and of the docs run as written, against ``asyncstream serve``.

The fenced blocks of README.md, then those of every page of the documentation in the
order of ``mkdocs.yml``'s navigation (``docs/*.md``; their examples go on from the
README's first run: the served bucket, the packed images), are read in order and run as
a reader would run them, in one session:

* the block marked ``<!-- readme-test: server -->`` (``asyncstream serve --port 9000
  --bucket my-bucket``) starts the installed console script as a child process, with the
  README's port replaced by a free one (so that the test runs beside anything holding
  9000); its banner must be the README's transcript, and its ``export`` line the README's,
  once the port is substituted. SIGTERM stops it at the end, and the test waits for it.
* every ``bash`` block runs with ``bash -euo pipefail``, in order, as one shell session
  would: a later block sees the variables and exports of the earlier ones (each block
  runs under ``set -a`` and hands its environment on to the next).
* every ``python`` block runs in order in ONE Python process, as a notebook runs, so a
  later block uses the names of earlier ones; the process starts at the first such block
  with the shell session's environment (the served endpoint and credentials).
* blocks with no language tag (output, plain text) are not run; a block marked
  ``<!-- readme-test: skip (REASON) -->`` is not run and is reported, with its line and
  the reason.

Substitutions, so that the README's literal text runs here: ``/tmp/`` becomes this test's
``tmp_path`` (shell and Python blocks alike), and ``127.0.0.1:9000`` the served port.
Each block must exit 0; a failing block is reported with its file and line and its
output (Python tracebacks name the file's lines: ``README.md``, ``docs/mixing.md``). The
README's ``ls`` block must list at least ten shards, as many as the README's prose says.
"""

from __future__ import annotations

import json
import os
import re
import select
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest

from asyncstream.testing._local import _read_until

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX shell and signals")

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MKDOCS = ROOT / "mkdocs.yml"
_NAV_PAGE = re.compile(r"^\s+- (?:[^:]+: )?(?P<page>\S+\.md)\s*$")
_FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w-]*)\s*$")
_MARKER = re.compile(r"^\s*<!-- readme-test: (?P<what>server|skip \((?P<reason>.+)\)) -->\s*$")
_BLOCK_TIMEOUT = 300.0  # seconds for any one block (pytest's own timeout bounds the whole)
_SERVE_TIMEOUT = 120.0
_MIN_SHARDS = 10


@dataclass
class Block:
    """One fenced block of the README or of a docs page."""

    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    marker: str | None  # "server", "skip" or None
    reason: str | None = None
    file: str = "README.md"  # relative to the repository

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


def docs_pages() -> list[Path]:
    """The pages of ``docs/`` in the order of mkdocs.yml's navigation."""
    lines = MKDOCS.read_text().splitlines()
    nav = lines[lines.index("nav:") + 1 :]
    pages = [ROOT / "docs" / m["page"] for line in nav if (m := _NAV_PAGE.match(line))]
    return [page for page in pages if page.exists()]  # bench/RESULTS.md is added by a hook


def readme_blocks(text: str, file: str = "README.md") -> list[Block]:
    """The fenced blocks of ``text`` in order, dedented, with the marker line before each."""
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        indent = len(fence["indent"])
        marker = reason = None
        previous = next((line for line in reversed(lines[:i]) if line.strip()), "")
        found = _MARKER.match(previous)
        if found is not None:
            marker = found["what"].split()[0]
            reason = found["reason"]
        body: list[str] = []
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            body.append(lines[j][indent:])
            j += 1
        if j == len(lines):
            raise AssertionError(f"{file}:{i + 1}: the block is never closed")
        code = "\n".join(body) + "\n"
        blocks.append(Block(i + 1, fence["lang"], code, marker, reason, file))
        i = j + 1
    return blocks


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _script() -> str:
    script = Path(sys.executable).with_name("asyncstream")  # the installed console script
    assert script.exists(), f"no console script at {script}: install the package"
    return str(script)


class Served:
    """``asyncstream serve`` started from the README's command, on a free port."""

    def __init__(self, command: str, port: int, log: Path) -> None:
        argv = shlex.split(command)
        assert argv[:2] == ["asyncstream", "serve"], command
        assert "--port" in argv, command
        at = argv.index("--port") + 1
        self.readme_port = argv[at]
        argv[at] = str(port)
        self.log = log
        with log.open("w") as err:
            self.proc = subprocess.Popen(
                [_script(), *argv[1:]], stdout=subprocess.PIPE, stderr=err, text=True
            )
        assert self.proc.stdout is not None
        lines, _ = _read_until(self.proc.stdout, "Ctrl-C", _SERVE_TIMEOUT)
        self.banner = "".join(lines)
        exports = [line for line in lines if line.startswith("export ")]
        if not exports or not lines[-1].startswith("Ctrl-C"):
            self.stop()
            raise AssertionError(f"serve printed no banner: {self.banner!r}\n{log.read_text()}")
        self.export_line = exports[0].strip()
        items = shlex.split(self.export_line.removeprefix("export "))
        self.env = dict(item.split("=", 1) for item in items)

    def stop(self) -> None:
        """SIGTERM, then wait (killed if it does not stop within a minute)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("asyncstream serve did not stop on SIGTERM") from None
        finally:
            if self.proc.stdout is not None:
                self.proc.stdout.close()


class Shell:
    """``bash -euo pipefail`` blocks run as one session: each hands its environment on."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.env = env
        self.cwd = cwd
        self.state = cwd / ".readme-shell-env"

    def run(self, block: Block, code: str) -> str:
        script = f"set -a\n{code}\nenv -0 > {shlex.quote(str(self.state))}\n"
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            env=self.env,
            cwd=self.cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=_BLOCK_TIMEOUT,
            check=False,
        )
        if done.returncode != 0:
            raise AssertionError(
                f"{block.where}: the bash block exited {done.returncode}:\n"
                f"{code}\n--- output ---\n{done.stdout[-6000:]}"
            )
        names = dict(
            item.split("=", 1) for item in self.state.read_text().split("\0") if "=" in item
        )
        for name in ("_", "SHLVL", "OLDPWD"):
            names.pop(name, None)
        self.env = names
        self.cwd = Path(names.get("PWD", self.cwd))
        return done.stdout


_DRIVER = r"""
import json, os, sys, traceback
control = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)  # the blocks' own output goes to the log, with their children's
namespace = {"__name__": "__main__"}
for message in sys.stdin:
    block = json.loads(message)
    print(f"=== {block['file']}:{block['line']} ===", file=sys.stderr, flush=True)
    # Padded so that a traceback's line numbers are the file's.
    source = "\n" * block["line"] + block["code"]
    try:
        exec(compile(source, block["file"], "exec"), namespace)
        ok = True
    except BaseException:
        traceback.print_exc()
        ok = False
    sys.stdout.flush()
    sys.stderr.flush()
    control.write(json.dumps({"line": block["line"], "ok": ok}) + "\n")
"""


class Notebook:
    """One Python process that runs the Python blocks in one namespace."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.log = cwd / ".readme-python.log"
        self._log = self.log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-c", _DRIVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env={**env, "PYTHONUNBUFFERED": "1"},
            cwd=cwd,
            text=True,
        )

    def run(self, block: Block, code: str) -> None:
        stdin: IO[str] | None = self.proc.stdin
        stdout: IO[str] | None = self.proc.stdout
        assert stdin is not None
        assert stdout is not None
        stdin.write(json.dumps({"line": block.line, "file": block.file, "code": code}) + "\n")
        stdin.flush()
        ready, _, _ = select.select([stdout], [], [], _BLOCK_TIMEOUT)
        reply = stdout.readline() if ready else ""
        if not reply or not json.loads(reply)["ok"]:
            why = "failed" if reply else f"gave no answer in {_BLOCK_TIMEOUT:.0f} s"
            raise AssertionError(
                f"{block.where}: the python block {why}:\n{code}\n"
                f"--- output ---\n{self.output(block)[-6000:]}"
            )

    def output(self, block: Block) -> str:
        """What the process wrote from ``block`` on."""
        text = self.log.read_text(errors="replace")
        return text.partition(f"=== {block.where} ===\n")[2]

    def close(self) -> None:
        """End of input: the process finishes (killed if it does not within a minute)."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            returncode = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("the examples' Python process did not exit") from None
        finally:
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self._log.close()
        assert returncode == 0, f"the examples' Python process exited {returncode}"


def test_readme_and_docs_blocks(tmp_path: Path) -> None:
    text = README.read_text()
    blocks = readme_blocks(text)
    readme_count = len(blocks)
    for page in docs_pages():
        blocks += readme_blocks(page.read_text(), page.relative_to(ROOT).as_posix())
    port = _free_port()
    served: Served | None = None
    shell: Shell | None = None
    notebook: Notebook | None = None
    outputs: dict[str, str] = {}
    ran: list[tuple[str, str, float]] = []
    skipped: list[tuple[str, str]] = []

    def substitute(code: str) -> str:
        code = re.sub(r"(?<![\w/.])/tmp/", f"{tmp_path}/", code)
        if served is not None:
            code = code.replace(f"127.0.0.1:{served.readme_port}", f"127.0.0.1:{port}")
        return code

    base_env = dict(os.environ)
    base_env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{base_env.get('PATH', '')}"
    try:
        for block in blocks:
            if block.marker == "skip":
                skipped.append((block.where, block.reason or ""))
                continue
            if block.marker == "server":
                assert served is None, f"{block.where}: a second server block"
                served = Served(block.code.strip(), port, tmp_path / "serve.log")
                continue
            if block.lang not in ("bash", "python"):
                continue
            code = substitute(block.code)
            started = time.monotonic()
            if block.lang == "bash":
                if shell is None:
                    shell = Shell(dict(base_env), tmp_path)
                outputs[block.where] = shell.run(block, code)
            else:
                if notebook is None:
                    notebook = Notebook(shell.env if shell else dict(base_env), tmp_path)
                notebook.run(block, code)
            ran.append((block.where, block.lang, time.monotonic() - started))
        if notebook is not None:
            notebook.close()
            notebook = None
    finally:
        if notebook is not None:
            notebook.proc.kill()
            notebook.close()
        if served is not None:
            served.stop()

    for where, reason in skipped:
        print(f"{where}: skipped ({reason})")
    for where, lang, seconds in ran:
        print(f"{where}: {lang} block ran in {seconds:.1f} s")
    blocks = blocks[:readme_count]  # what follows checks the README's own blocks

    # The server block, its transcript and the export line are the README's, port aside.
    assert served is not None, "the README has no <!-- readme-test: server --> block"
    readme_address = f"127.0.0.1:{served.readme_port}"
    banner = served.banner.replace(f"127.0.0.1:{port}", readme_address)
    export_line = served.export_line.replace(f"127.0.0.1:{port}", readme_address)
    transcripts = [b.code for b in blocks if b.code.startswith("asyncstream: S3 server")]
    assert transcripts == [banner], "the README's serve transcript is not what serve prints"
    exports = [b for b in blocks if b.lang == "bash" and "export AWS_ENDPOINT_URL" in b.code]
    assert [b.code.strip() for b in exports] == [export_line]

    # The ls block lists many shards, as many as the prose says.
    listing = next(out for where, out in outputs.items() if _block(blocks, where, "asyncstream ls"))
    shards = re.findall(r"^s3://\S+\.tar\s", listing, flags=re.MULTILINE)
    assert len(shards) >= _MIN_SHARDS, listing
    claimed = re.search(r"make (\d+) shards", text)
    assert claimed is not None, "the README does not say how many shards pack makes"
    assert int(claimed[1]) == len(shards), listing


def _block(blocks: list[Block], where: str, needle: str) -> bool:
    return any(b.where == where and needle in b.code for b in blocks)
