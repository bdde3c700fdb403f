"""Local folders the library keeps state in: where they are by default, and whether to
trust them.

The chunk cache (:mod:`asyncstream.engine._cachedir`) and the index cache
(:mod:`asyncstream.dataset._index_cache`) keep files that later runs read back as if they
were the shards' own bytes and counts, so a folder anyone else can write into is a way to
feed the reader forged data. Both therefore use a folder only if it is *private*:

* owned by the effective user (``st_uid``; root too uses only its own folders);
* not writable by group or others (no ``0o022`` bit; a sticky bit does not help: others
  could still create the names the cache would open);
* a folder they create is ``0o700``, a file ``0o600``; every file is opened with
  ``O_NOFOLLOW`` (a planted symlink is refused, never written through) and its owner
  checked after the open, on the descriptor (:func:`check_file`).

The default folder is per user: ``$ASYNCSTREAM_CACHE_DIR``, else
``$XDG_CACHE_HOME/asyncstream``, else ``~/.cache/asyncstream`` (never a shared ``/tmp``).
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path

__all__ = [
    "NOFOLLOW",
    "UnsafeFolderError",
    "check_file",
    "check_folder",
    "default_cache_dir",
    "load_secret",
    "open_private",
    "private_folder",
]

# Flags for every open of a cache file: never through a symlink, never inherited by a
# child, never blocking on a planted FIFO (no effect on a regular file).
NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class UnsafeFolderError(OSError):
    """A cache folder, or a file in it, that another user could have written."""


def default_cache_dir() -> Path:
    """``$ASYNCSTREAM_CACHE_DIR``, else ``$XDG_CACHE_HOME/asyncstream``, else ``~/.cache/...``."""
    explicit = os.environ.get("ASYNCSTREAM_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "asyncstream"


def check_folder(path: str | os.PathLike[str], st: os.stat_result, what: str) -> None:
    """Refuse the folder ``path`` (as ``st`` describes it) unless it is private.

    Raises:
        UnsafeFolderError: not a folder, owned by another user, or writable by group or
            others; the message says how to fix it.
    """
    path = os.fspath(path)
    uid = os.geteuid()
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeFolderError(f"{what} {path!r} is not a folder")
    if st.st_uid != uid:
        raise UnsafeFolderError(
            f"{what} {path!r} is owned by uid {st.st_uid}, not by this user (uid {uid}), "
            f"so another user could plant or change its files: choose a folder of your "
            f"own, or, if it is yours, `chown {uid} {path}`"
        )
    if st.st_mode & 0o022:
        raise UnsafeFolderError(
            f"{what} {path!r} is writable by group or others (mode "
            f"{stat.S_IMODE(st.st_mode):#o}), so another user could plant or change its "
            f"files: `chmod 700 {path}`, or choose another folder"
        )


def private_folder(path: str | os.PathLike[str], what: str) -> None:
    """Create ``path`` (``0o700``) if missing, then refuse it unless it is private.

    Raises:
        UnsafeFolderError: see :func:`check_folder`.
        OSError: it cannot be created or read.
    """
    os.makedirs(path, mode=0o700, exist_ok=True)
    check_folder(path, os.stat(path), what)


def check_file(fd: int, name: str) -> os.stat_result:
    """The ``fstat`` of an opened cache file, refused unless a regular file of this user.

    Raises:
        UnsafeFolderError: another user's file, or not a regular file.
    """
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeFolderError(f"{name} is not a regular file")
    if st.st_uid != os.geteuid():
        raise UnsafeFolderError(
            f"{name} is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
        )
    return st


def open_private(path: str, flags: int, folder: int | None = None, shown: str = "") -> int:
    """Open ``path`` (relative to the descriptor ``folder``, if given) with
    :data:`NOFOLLOW`, created ``0o600`` with ``O_CREAT``, and check it (:func:`check_file`);
    ``shown``: its name in errors, where not ``path``.

    Raises:
        UnsafeFolderError: a symlink, another user's file or not a regular file.
    """
    shown = shown or path
    try:
        fd = os.open(path, flags | NOFOLLOW, 0o600, dir_fd=folder)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeFolderError(f"{shown} is a symbolic link: remove it") from exc
        raise
    try:
        check_file(fd, shown)
    except BaseException:
        os.close(fd)
        raise
    return fd


def load_secret(name: str, folder: int, shown: str, size: int = 32) -> bytes:
    """The secret in the file ``name`` of the descriptor ``folder``: ``size`` random bytes,
    created (``O_EXCL``, ``0o600``) if missing. Call it under a lock that every user of the
    folder takes, so that none reads one half written; one that others could read, or cut
    short (a crash while it was written), is replaced. ``shown``: its name in errors.

    Raises:
        UnsafeFolderError: a symlink or another user's file in its place.
    """
    while True:
        try:
            fd = open_private(name, os.O_RDONLY, folder, shown)
        except FileNotFoundError:
            pass
        else:
            try:
                private = not os.fstat(fd).st_mode & 0o077
                secret = os.read(fd, size + 1)
            finally:
                os.close(fd)
            if private and len(secret) == size:
                return secret
            os.unlink(name, dir_fd=folder)
        secret = secrets.token_bytes(size)
        try:
            fd = open_private(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, folder, shown)
        except FileExistsError:
            continue  # made meanwhile by a process that ignores the lock: read it
        try:
            if os.write(fd, secret) == size:
                return secret
        finally:
            os.close(fd)
