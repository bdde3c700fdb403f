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
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from ..shards._urls import Shard
from ..stores._localstore import local_path
from ..stores._registry import is_local

__all__ = ["CACHE_FILE", "IndexCache", "default_cache_dir"]

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


def default_cache_dir() -> Path:
    """``$ASYNCSTREAM_CACHE_DIR``, else ``$XDG_CACHE_HOME/asyncstream``, else ``~/.cache/...``."""
    explicit = os.environ.get("ASYNCSTREAM_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "asyncstream"


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
            self.path.parent.mkdir(parents=True, exist_ok=True)
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
        wanted = {}
        for shard in shards:
            version = _version(shard)
            if version is not None:
                wanted[shard.url] = (shard.size, version)
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
                for url, size, version, samples in rows:
                    if wanted[url] == (size, version):
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
                rows.append((shard.url, shard.size, version, samples, now))
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
