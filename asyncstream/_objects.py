"""Small whole objects beside the shards: index files read, manifests written, shards removed.

Index files are small next to shards (a 100,000-shard manifest is about 10 MB), so they
are read and written whole, like listing and HEAD on the synchronous botocore client with
botocore's standard retries (see :mod:`._s3`). Local files are written atomically: a
temporary file in the same folder, then ``os.replace``, so a reader never sees half a
manifest and a killed writer leaves the old one.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ._exceptions import NotFoundError
from ._s3 import S3Options, fetch_error_from, sync_client
from ._urls import local_path, parse_s3_url

__all__ = ["Objects"]


class Objects:
    """Reads, writes and removes whole objects by URL (``s3://`` or local).

    Args:
        options: how to reach S3 (a client is made on first use).
        client: a synchronous botocore client to use instead.
    """

    def __init__(self, options: S3Options | None = None, client: Any = None) -> None:
        self._options = options
        self._client = client

    @property
    def client(self) -> Any:
        """The botocore client, made on first use."""
        if self._client is None:
            self._client = sync_client((self._options or S3Options()).resolve())
        return self._client

    def read(self, url: str) -> bytes | None:
        """The object's bytes, or ``None`` where there is no such object.

        Raises:
            FetchError: the store refused or could not be reached (a missing bucket too).
        """
        if not url.startswith("s3://"):
            try:
                return _path(url).read_bytes()
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                return None
        bucket, key = parse_s3_url(url)
        try:
            body = self.client.get_object(Bucket=bucket, Key=key)["Body"]
            with contextlib.closing(body):
                data: bytes = body.read()
            return data
        except Exception as exc:
            error = fetch_error_from(exc, url)
            if isinstance(error, NotFoundError) and "NoSuchBucket" not in str(error):
                return None
            raise error from exc

    def write(self, url: str, data: bytes) -> None:
        """Write the whole object: one PUT, or an atomic replace of a local file.

        Raises:
            FetchError: the store refused the PUT (a read-only bucket, say).
            OSError: the local file could not be written.
        """
        if url.startswith("s3://"):
            bucket, key = parse_s3_url(url)
            try:
                self.client.put_object(Bucket=bucket, Key=key, Body=data)
            except Exception as exc:
                raise fetch_error_from(exc, url) from exc
            return
        path = _path(url)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def delete(self, urls: Iterable[str]) -> None:
        """Remove objects (missing ones are fine).

        Raises:
            FetchError: the store refused a DELETE.
            OSError: a local file could not be removed.
        """
        for url in urls:
            if not url.startswith("s3://"):
                _path(url).unlink(missing_ok=True)
                continue
            bucket, key = parse_s3_url(url)
            try:
                self.client.delete_object(Bucket=bucket, Key=key)
            except Exception as exc:
                raise fetch_error_from(exc, url) from exc


def _path(url: str) -> Path:
    return local_path(url).expanduser().absolute()
