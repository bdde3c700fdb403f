"""Where ``pack`` writes: a folder of any store (a local folder, an S3 prefix, ...).

Shards are built in a temporary file and then handed to the store
(:meth:`~asyncstream.stores._store.Store.upload`): moved into a local folder (a rename:
the temporary folder is inside the destination), or uploaded (S3: one PUT below 64 MiB, a
multipart upload above, aborted if any part fails, so no half-uploaded shard is ever
visible).
"""

from __future__ import annotations

from pathlib import Path

from ..dataset._index import MANIFEST_NAME
from ..shards._compressed import is_shard_name
from ..stores._localstore import local_path
from ..stores._registry import folder_url, is_local
from ..stores._s3 import S3Options
from ..stores._s3upload import MULTIPART_THRESHOLD
from ..stores._stores import Stores

__all__ = ["MULTIPART_THRESHOLD", "PackSink"]


class PackSink:
    """Where shards go: a folder of a store.

    Args:
        dest: the folder's URL or path.
        options: how to reach S3.
        part_workers: the most parts of one upload at once.
    """

    def __init__(self, dest: str, options: S3Options | None, part_workers: int) -> None:
        self.dest = dest
        self.stores = Stores(options, connections=max(1, part_workers))
        self.store = self.stores.for_url(dest)
        self.folder_url = folder_url(dest)
        self.store.prepare(self.folder_url + "/")
        #: a local folder to build shards in (a rename moves them into place), or None
        self.local_folder = local_path(self.folder_url) if is_local(dest) else None

    def url(self, name: str) -> str:
        return f"{self.folder_url}/{name}"

    def existing(self) -> list[str]:
        """URLs of the shards (``.tar``, compressed too) and manifest directly in the
        destination folder."""
        folder = self.folder_url + "/"
        found = [o.url for o in self.store.list(folder) if "/" not in o.url[len(folder) :]]
        return sorted(u for u in found if is_shard_name(u) or u.endswith("/" + MANIFEST_NAME))

    def put_file(self, name: str, path: Path) -> str | None:
        """Store a shard (``path`` is then gone); returns its ETag where the store has one."""
        return self.store.upload(self.url(name), path)

    def put_bytes(self, name: str, data: bytes) -> None:
        self.stores.write(self.url(name), data)

    def close(self) -> None:
        self.stores.close()
