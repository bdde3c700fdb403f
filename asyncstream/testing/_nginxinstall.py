"""nginx and its Lua module for :class:`~asyncstream.testing.Nginx`: found on the machine
or unpacked from Debian's packages into a cache folder, once.

A system nginx counts where its Lua module (``libnginx-mod-http-lua``, with the
development kit it needs) sits in ``/usr/lib/nginx/modules``: ``apt-get install nginx
libnginx-mod-http-lua`` as root. Otherwise :func:`install` fetches the same Debian
packages with ``apt-get download`` (no root needed, nothing installed system-wide, no
service started) and unpacks them with ``dpkg-deb -x`` into ``$XDG_CACHE_HOME`` (or
``~/.cache``) ``/asyncstream-tests/nginx-debian``, under a file lock, so that concurrent
test sessions unpack them once; the binary then runs with that folder's shared libraries
(LuaJIT, PCRE) on ``LD_LIBRARY_PATH`` and its Lua libraries (``resty.core``) on the Lua
path. Where neither works (no apt, offline with nothing cached),
:class:`NginxUnavailable` says why, and the fixtures turn it into a skip.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Installation", "NginxUnavailable", "cache_folder", "install"]

_SYSTEM_MODULES = Path("/usr/lib/nginx/modules")
_MODULES = ("ndk_http_module.so", "ngx_http_lua_module.so")  # in load order
# What apt-get download fetches: the server, the Lua module and what it loads. Each group
# is one package, its first name that apt knows (Debian and Ubuntu name LuaJIT apart).
_REQUIRED = (
    ("nginx",),
    ("libnginx-mod-http-ndk",),
    ("libnginx-mod-http-lua",),
    ("lua-resty-core",),
    ("lua-resty-lrucache",),
    ("libluajit2-5.1-2", "libluajit-5.1-2"),
)
_OPTIONAL = ("libpcre3",)  # the Lua module's PCRE, where the system lacks it
_TIMEOUT = 300.0
_DONE = "unpacked"  # written last: a folder without it is an interrupted install


class NginxUnavailable(Exception):
    """nginx with its Lua module cannot be found or installed here; the message says why."""


@dataclass(frozen=True)
class Installation:
    """An nginx binary with the Lua module: what to run and with which paths.

    Attributes:
        binary: the ``nginx`` executable.
        modules: the dynamic modules to load, in order (the development kit, then Lua).
        lua_path: a ``lua_package_path`` entry for ``resty.core``, or ``""`` (the default).
        library_path: a folder for ``LD_LIBRARY_PATH``, or ``""`` (the system's).
        source: ``"system"`` or the cache folder it was unpacked into.
    """

    binary: Path
    modules: tuple[Path, ...]
    lua_path: str
    library_path: str
    source: str

    def environment(self) -> dict[str, str]:
        """The environment the binary runs in (this process's, with the library path)."""
        env = dict(os.environ)
        if self.library_path:
            extra = env.get("LD_LIBRARY_PATH")
            env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [self.library_path, extra]))
        return env


def cache_folder() -> Path:
    """Where Debian's nginx is unpacked: ``$XDG_CACHE_HOME`` (or ``~/.cache``)
    /asyncstream-tests/nginx-debian."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "asyncstream-tests" / "nginx-debian"


def _system() -> Installation | None:
    binary = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/sbin")
    modules = tuple(_SYSTEM_MODULES / name for name in _MODULES)
    if binary is None or not all(m.is_file() for m in modules):
        return None
    return Installation(Path(binary), modules, "", "", "system")


def _unpacked(folder: Path) -> Installation | None:
    root = folder / "root"
    if not (folder / _DONE).is_file():
        return None
    arch = [p for p in (root / "usr" / "lib").glob("*-linux-gnu*") if p.is_dir()]
    libraries = [str(p) for p in arch] + [str(p) for p in (root / "lib").glob("*-linux-gnu*")]
    return Installation(
        root / "usr" / "sbin" / "nginx",
        tuple(root / "usr" / "lib" / "nginx" / "modules" / name for name in _MODULES),
        f"{root}/usr/share/lua/5.1/?.lua;",
        os.pathsep.join(libraries),
        str(folder),
    )


def _download(package: str, into: Path) -> tuple[bool, str]:
    try:
        done = subprocess.run(
            ["apt-get", "download", "-q", package],
            cwd=into,
            capture_output=True,
            text=True,
            timeout=_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False, f"apt-get download {package} took over {_TIMEOUT:.0f} s"
    return done.returncode == 0, (done.stderr or done.stdout).strip()[-300:]


def _unpack(folder: Path) -> None:
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        debs = Path(scratch)
        for names in _REQUIRED:
            errors = []
            for name in names:
                ok, said = _download(name, debs)
                if ok:
                    break
                errors.append(said)
            else:
                raise NginxUnavailable(
                    f"nginx is not installed with its Lua module, and apt-get download "
                    f"{' or '.join(names)} failed: {errors[-1]}"
                )
        for name in _OPTIONAL:
            _download(name, debs)
        root = folder / "root"
        shutil.rmtree(root, ignore_errors=True)
        for deb in sorted(debs.glob("*.deb")):
            done = subprocess.run(
                ["dpkg-deb", "-x", str(deb), str(root)],
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                raise NginxUnavailable(f"dpkg-deb -x {deb.name} failed: {done.stderr[-300:]}")
    (folder / _DONE).write_text("")


def install(folder: Path | None = None) -> Installation:
    """nginx with its Lua module: the system's, or Debian's unpacked into ``folder``
    (default :func:`cache_folder`) first if need be (module docstring).

    Raises:
        NginxUnavailable: no system nginx with the Lua module, and no ``apt-get`` and
            ``dpkg-deb`` to fetch one, or the download failed (offline, say).
    """
    found = _system()
    if found is not None:
        return found
    folder = folder or cache_folder()
    found = _unpacked(folder)
    if found is not None:
        return found
    for tool in ("apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise NginxUnavailable(
                f"nginx with libnginx-mod-http-lua is not installed, and {tool} is not on "
                "PATH to fetch Debian's"
            )
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f"{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session may be unpacking it right now
        found = _unpacked(folder)
        if found is None:
            with contextlib.suppress(FileNotFoundError):
                (folder / _DONE).unlink()
            _unpack(folder)
            found = _unpacked(folder)
    if found is None:  # pragma: no cover - _unpack wrote the marker
        raise NginxUnavailable(f"nginx could not be unpacked into {folder}")
    return found
