"""Node.js servers for tests, installed from npm once: s3rver and Azurite.

:func:`npm_install` puts one pinned version of a package into a cache folder
(``$XDG_CACHE_HOME`` or ``~/.cache``, then ``asyncstream-tests/<package>-<version>``),
preferring npm's offline cache, under a file lock so that concurrent test sessions (and
pytest's workers) install it once, saying on stderr that it is installing (the first
install takes a minute or so). What is missing (``node``, ``npm``, the package
registry) is :class:`NpmUnavailable`, for the caller to say as its own "cannot be
installed here" error.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["NpmUnavailable", "npm_cache_folder", "npm_install"]

_INSTALL_TIMEOUT = 300.0


class NpmUnavailable(RuntimeError):
    """The package cannot be installed here; the message says why."""


def npm_cache_folder(package: str, version: str) -> Path:
    """Where ``package@version`` is installed: ``$XDG_CACHE_HOME`` (or ``~/.cache``)
    /asyncstream-tests/``package-version``."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "asyncstream-tests" / f"{package}-{version}"


def _installed(folder: Path, package: str, version: str, script: str) -> Path | None:
    root = folder / "node_modules" / package
    with contextlib.suppress(OSError, ValueError):
        if json.loads((root / "package.json").read_text())["version"] == version:
            return root / script
    return None


def npm_install(package: str, version: str, script: str, folder: Path | None = None) -> Path:
    """The path of ``script`` (relative to the package) of ``package@version``, installed
    into ``folder`` (default :func:`npm_cache_folder`) first if need be.

    Raises:
        NpmUnavailable: no ``node`` or ``npm`` on PATH, or the install failed (offline with
            nothing cached, say) or took over 5 minutes.
    """
    folder = folder or npm_cache_folder(package, version)
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            raise NpmUnavailable(
                f"{tool} is not on PATH: {package} {version} needs Node.js and npm"
            )
    found = _installed(folder, package, version, script)
    if found is not None:
        return found
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f"{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session may be installing it right now
        found = _installed(folder, package, version, script)
        if found is not None:
            return found
        print(
            f"asyncstream.testing: installing {package} {version} from npm into {folder} "
            "(once; a minute or so)...",
            file=sys.stderr,
            flush=True,
        )
        command = ["npm", "install", "--prefix", str(folder), "--no-audit", "--no-fund"]
        command += ["--no-save", "--prefer-offline", "--loglevel=error", f"{package}@{version}"]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=_INSTALL_TIMEOUT, check=False
            )
        except subprocess.TimeoutExpired:
            raise NpmUnavailable(
                f"npm install {package}@{version} took over {_INSTALL_TIMEOUT:.0f} s"
            ) from None
        found = _installed(folder, package, version, script)
        if done.returncode != 0 or found is None:
            tail = (done.stderr or done.stdout).strip()[-500:]
            raise NpmUnavailable(
                f"npm install {package}@{version} failed (exit {done.returncode}): {tail}"
            )
        return found
