"""The local index cache: sample counts of shards that had to be counted, kept for next time.

Counting a shard means reading it whole; the count is kept so that the next open of the
same data, from any process, reads no shard. One SQLite file (stdlib ``sqlite3``),
``index.sqlite3`` in the cache folder: ``$ASYNCSTREAM_CACHE_DIR``, else
``$XDG_CACHE_HOME/asyncstream``, else ``~/.cache/asyncstream``.

Key: the shard's URL, its size and its version: the ETag for S3 (empty where the store
gives none), ``mtime_ns`` for a local file. A shard rewritten in place gets a new ETag or
mtime, so a stale count is never found; a store without ETags that replaces an object by
another of the same size is caught when the epoch reads it (a count that does not match
is a :class:`~asyncstream.DataError`), never silently.

Key without the query string: an ``http(s)`` shard URL is keyed without its query string
and fragment, so that a presigned S3 URL's or an Azure SAS's signature is never written to
disk (the samples' ``__url__`` keeps the URL as given). The size and the version still
tell objects apart; two URLs that differ only in their query and name objects of one size
without an ETag share a key, and a count that does not fit is caught when the epoch reads
the shard.

Trust: the file holds counts the stream believes, so only a private folder is used (this
user's, not writable by group or others: :mod:`asyncstream._folders`), created ``0o700``;
the file is created ``0o600`` with ``O_NOFOLLOW``, its owner checked (one readable by
others, from an older version, is made ``0o600``, with its WAL files), and a symlinked or
foreign WAL file refuses the folder. A refused folder logs one warning saying how to fix
it, and the stream carries on without the cache.

Several processes at once: WAL mode (readers never wait for a writer), a busy timeout,
and each write one transaction, so a count is either there whole or not at all; a
process killed mid-count loses only the shard it was reading. The cache is a convenience:
a folder that cannot be written, or a file that cannot be opened, logs one warning and
the stream carries on without it.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from .._folders import UnsafeFolderError, default_cache_dir, open_private, private_folder
from ..shards._urls import Shard
from ..stores._localstore import local_path
from ..stores._registry import is_local

__all__ = ["CACHE_FILE", "IndexCache", "cache_url", "default_cache_dir"]

CACHE_FILE = "index.sqlite3"
_BUSY_TIMEOUT_S = 30.0
_QUERY_BATCH = 500  # SQLite's host parameters per statement stay well under its limit

_log = logging.getLogger("asyncstream")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS counts (
    url TEXT NOT NULL,
    size INTEGER NOT NULL,
    version TEXT NOT NULL,
    samples INTEGER NOT NULL,
    written REAL NOT NULL,
    PRIMARY KEY (url, size, version)
) WITHOUT ROWID
"""


def _set_up(db: sqlite3.Connection) -> None:
    """WAL mode and the table. Switching a new file to WAL while other processes open it
    can answer "database is locked" at once, without the busy handler's wait (SQLite
    does not wait where waiting could deadlock): tried again until the busy timeout."""
    db.execute(f"PRAGMA busy_timeout = {int(_BUSY_TIMEOUT_S * 1000)}")
    deadline = time.monotonic() + _BUSY_TIMEOUT_S
    while True:
        try:
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = NORMAL")
            db.execute(_SCHEMA)
            return
        except sqlite3.OperationalError as exc:
            busy = "locked" in str(exc) or "busy" in str(exc)
            if not busy or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def cache_url(url: str) -> str:
    """The URL as the cache keys it: an ``http(s)`` URL without its query and fragment."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https") or not (parts.query or parts.fragment):
        return url
    return urlunsplit(parts._replace(query="", fragment=""))


def _private_file(path: Path) -> None:
    """Create the database file ``0o600`` (never through a symlink) if missing; refuse one
    that is not this user's regular file, as its WAL files; make them all ``0o600``.

    Raises:
        UnsafeFolderError: what is wrong and how to fix it.
    """
    fd = open_private(str(path), os.O_RDWR | os.O_CREAT)
    try:
        if os.fstat(fd).st_mode & 0o077:  # SQLite gives its WAL files the database's mode
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    for suffix in ("-wal", "-shm", "-journal"):
        side = Path(f"{path}{suffix}")
        try:
            st = side.lstat()
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise UnsafeFolderError(
                f"{side} is not a file of this user (uid {st.st_uid}, mode {st.st_mode:#o}):"
                " remove it, or choose another folder"
            )
        if st.st_mode & 0o077:
            os.chmod(side, 0o600)


def _version(shard: Shard) -> str | None:
    """The part of the key that changes when the object does (None: not cacheable now)."""
    if not is_local(shard.url):
        return shard.etag or ""
    try:
        return f"mtime_ns:{local_path(shard.url).stat().st_mtime_ns}"
    except OSError:
        return None


class IndexCache:
    """Sample counts by (URL, size, version), in one SQLite file shared by processes.

    The file is opened on first use, so a dataset that an index covers never touches it;
    one that cannot be opened logs a warning once, and the cache then finds nothing and
    keeps nothing.

    Args:
        folder: the folder of ``index.sqlite3``; default :func:`default_cache_dir`.
    """

    def __init__(self, folder: str | os.PathLike[str] | None = None) -> None:
        self.path = (default_cache_dir() if folder is None else Path(folder)) / CACHE_FILE
        self._db: sqlite3.Connection | None = None
        self._broken = False

    def __repr__(self) -> str:
        return f"IndexCache({str(self.path)!r})"

    @classmethod
    def open(cls, where: str | os.PathLike[str] | bool | None = None) -> IndexCache | None:
        """The cache at ``where``, or ``None`` where it is disabled.

        Args:
            where: ``None`` or ``True``: the default folder (module docstring); ``False``:
                no cache; a path: the folder to keep ``index.sqlite3`` in.
        """
        if where is False:
            return None
        return cls(None if where is None or where is True else where)

    def _connect(self) -> sqlite3.Connection | None:
        if self._db is not None or self._broken:
            return self._db
        try:
            private_folder(self.path.parent, "the index cache's folder")
            _private_file(self.path)
            db = sqlite3.connect(self.path, timeout=_BUSY_TIMEOUT_S, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            self._fail("opened", exc)
            return None
        try:
            _set_up(db)
        except sqlite3.Error as exc:
            db.close()
            self._fail("opened", exc)
            return None
        self._db = db
        return db

    def _fail(self, what: str, exc: Exception) -> None:
        """Warn once, and carry on without the cache."""
        if not self._broken:
            _log.warning(
                "the local index cache %s cannot be %s (%s): counted shards are not kept",
                self.path,
                what,
                exc,
            )
        self._broken = True
        if self._db is not None:
            self._db.close()
            self._db = None

    def get(self, shards: Sequence[Shard]) -> dict[str, int]:
        """Counts known for these shards, by URL (shards not found are left out)."""
        wanted: dict[str, list[tuple[int, str, str]]] = {}  # key -> (size, version, URL)
        for shard in shards:
            version = _version(shard)
            if version is not None:
                wanted.setdefault(cache_url(shard.url), []).append((shard.size, version, shard.url))
        found: dict[str, int] = {}
        urls = list(wanted)
        db = self._connect() if urls else None
        if db is None:
            return found
        try:
            for start in range(0, len(urls), _QUERY_BATCH):
                batch = urls[start : start + _QUERY_BATCH]
                marks = ",".join("?" * len(batch))
                rows = db.execute(
                    f"SELECT url, size, version, samples FROM counts WHERE url IN ({marks})",
                    batch,
                )
                for key, size, version, samples in rows:
                    for url in (u for s, v, u in wanted[key] if (s, v) == (size, version)):
                        found[url] = int(samples)
        except sqlite3.Error as exc:
            self._fail("read", exc)
            return {}
        return found

    def put(self, counts: Iterable[tuple[Shard, int]]) -> None:
        """Keep counts, in one transaction (a failure is logged, not raised)."""
        now = time.time()
        rows = []
        for shard, samples in counts:
            version = _version(shard)
            if version is not None:
                rows.append((cache_url(shard.url), shard.size, version, samples, now))
        db = self._connect() if rows else None
        if db is None:
            return
        try:
            with db:  # BEGIN ... COMMIT, or ROLLBACK on an error
                db.execute("BEGIN IMMEDIATE")
                db.executemany(
                    "INSERT OR REPLACE INTO counts (url, size, version, samples, written) "
                    "VALUES (?, ?, ?, ?, ?)",
                    rows,
                )
        except sqlite3.Error as exc:
            self._fail("written", exc)

    def close(self) -> None:
        """Close the database connection (a later use opens it again). Idempotent."""
        if self._db is not None:
            self._db.close()
            self._db = None

    def __enter__(self) -> IndexCache:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
