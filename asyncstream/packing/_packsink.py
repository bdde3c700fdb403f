"""Where ``pack`` writes: a local folder or an S3 prefix, through the stores.

Shards are built in a temporary file and then moved into the folder (a rename: the
temporary folder is inside the destination) or uploaded, in one PUT below 64 MiB and as a
multipart upload of 16 MiB parts above, whose parts go up in parallel and which is aborted
if any part fails, so no half-uploaded shard is ever visible.
"""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..dataset._index import MANIFEST_NAME
from ..shards._compressed import is_shard_name
from ..shards._urls import local_path, parse_s3_url, scheme_of
from ..stores._s3 import S3Options
from ..stores._s3store import S3Store
from ..stores._stores import Stores

__all__ = ["MULTIPART_THRESHOLD", "PackSink"]

MULTIPART_THRESHOLD = 64 << 20
_PART_BYTES = 16 << 20


class PackSink:
    """Where shards go: a local folder or an S3 prefix, through the stores."""

    def __init__(self, dest: str, options: S3Options | None, part_workers: int) -> None:
        self.dest = dest
        self.stores = Stores(options)
        self.s3 = scheme_of(dest) == "s3"
        self._pool = ThreadPoolExecutor(part_workers) if self.s3 else None
        if self.s3:
            self.bucket, prefix = parse_s3_url(dest)
            self.prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
            store = self.stores.for_url(dest)
            assert isinstance(store, S3Store)
            self.objects = store.objects
            self.client = self.objects.client
            self.objects.call(dest, lambda: self.client.head_bucket(Bucket=self.bucket))
        else:
            self.folder = local_path(dest)
            self.folder.mkdir(parents=True, exist_ok=True)

    def url(self, name: str) -> str:
        if self.s3:
            return f"s3://{self.bucket}/{self.prefix}{name}"
        return (self.folder / name).absolute().as_uri()

    @property
    def folder_url(self) -> str:
        if self.s3:
            return f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        return self.folder.absolute().as_uri()

    def existing(self) -> list[str]:
        """URLs of the shards (``.tar``, compressed too) and manifest directly in the
        destination folder."""
        if not self.s3:
            return sorted(
                p.absolute().as_uri()
                for p in self.folder.iterdir()
                if p.is_file() and (is_shard_name(p.name) or p.name == MANIFEST_NAME)
            )
        listing = self.stores.for_url(self.folder_url + "/").list(self.folder_url + "/")
        found = [o.url for o in listing if "/" not in o.url[len(self.folder_url) + 1 :]]
        return sorted(u for u in found if is_shard_name(u) or u.endswith("/" + MANIFEST_NAME))

    def put_file(self, name: str, path: Path) -> str | None:
        """Store a shard; returns its ETag (S3) or None (local)."""
        if not self.s3:
            shutil.move(path, self.folder / name)
            return None
        size = path.stat().st_size
        key = self.prefix + name
        if size < MULTIPART_THRESHOLD:

            def put() -> Any:
                with path.open("rb") as body:
                    return self.client.put_object(Bucket=self.bucket, Key=key, Body=body)

            answer = self.objects.call(self.url(name), put)
        else:
            answer = self._multipart(key, path, size)
        etag = answer.get("ETag")
        return str(etag) if etag else None

    def put_bytes(self, name: str, data: bytes) -> None:
        self.stores.write(self.url(name), data)

    def _multipart(self, key: str, path: Path, size: int) -> dict[str, Any]:
        assert self._pool is not None
        url = f"s3://{self.bucket}/{key}"
        call = self.objects.call
        upload = call(url, lambda: self.client.create_multipart_upload(Bucket=self.bucket, Key=key))
        upload_id = upload["UploadId"]

        def part(number: int, offset: int) -> dict[str, Any]:
            with path.open("rb") as f:
                f.seek(offset)
                body = f.read(_PART_BYTES)
            answer = call(
                url,
                lambda: self.client.upload_part(
                    Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=body
                ),
            )
            return {"PartNumber": number, "ETag": answer["ETag"]}

        try:
            offsets = range(0, size, _PART_BYTES)
            parts = list(self._pool.map(part, range(1, len(offsets) + 1), offsets))
            done = {"Parts": parts}
            answer: dict[str, Any] = call(
                url,
                lambda: self.client.complete_multipart_upload(
                    Bucket=self.bucket, Key=key, UploadId=upload_id, MultipartUpload=done
                ),
            )
            return answer
        except BaseException:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            raise

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
