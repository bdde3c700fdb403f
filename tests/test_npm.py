"""``asyncstream.testing._npm``: a Node.js server's first install says it is installing.

``node`` and ``npm`` here are two small shell scripts on a PATH of the test's own, the
``npm`` one writing the package's ``package.json`` where ``npm install --prefix`` would:
what is checked is what asyncstream says and when, not npm.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from asyncstream.testing._npm import npm_install

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX shell scripts")

_NPM = """#!/bin/sh
# npm install --prefix FOLDER ... PACKAGE@VERSION: the last argument names the package
prefix=""; last=""
while [ $# -gt 0 ]; do
  case "$1" in --prefix) prefix="$2"; shift ;; esac
  last="$1"; shift
done
name="${last%@*}"; version="${last##*@}"
root="$prefix/node_modules/$name"
mkdir -p "$root"
printf '{"name": "%s", "version": "%s"}' "$name" "$version" > "$root/package.json"
"""


def _tool(folder: Path, name: str, text: str) -> None:
    path = folder / name
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_first_install_says_it_is_installing_and_later_ones_are_silent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _tool(bin_dir, "npm", _NPM)
    _tool(bin_dir, "node", "#!/bin/sh\nexit 0\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    folder = tmp_path / "cache" / "demo-server-1.2.3"

    script = npm_install("demo-server", "1.2.3", "bin/serve.js", folder)
    assert script == folder / "node_modules" / "demo-server" / "bin" / "serve.js"
    err = capsys.readouterr().err
    assert f"installing demo-server 1.2.3 from npm into {folder}" in err

    assert npm_install("demo-server", "1.2.3", "bin/serve.js", folder) == script
    assert capsys.readouterr().err == ""  # installed: nothing to say
