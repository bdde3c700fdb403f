"""Uploading a local file to S3 (``pack``'s shards): one PUT below 64 MiB, a multipart
upload of 16 MiB parts above, whose parts go up in parallel and which is aborted if any
part fails, so no half-uploaded object is ever visible."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ._s3 import parse_s3_url
from ._s3objects import S3Objects

__all__ = ["MULTIPART_THRESHOLD", "upload_file"]

MULTIPART_THRESHOLD = 64 << 20
_PART_BYTES = 16 << 20


def upload_file(objects: S3Objects, url: str, path: Path, pool: ThreadPoolExecutor) -> str | None:
    """Store ``path`` as the object ``url``; its ETag, where the server gives one.

    Args:
        objects: the store's blocking half (client, retries, error mapping).
        url: ``s3://bucket/key``.
        path: the local file.
        pool: threads for the parts of a multipart upload.
    """
    bucket, key = parse_s3_url(url)
    client = objects.client
    size = path.stat().st_size
    if size < MULTIPART_THRESHOLD:

        def put() -> Any:
            with path.open("rb") as body:
                return client.put_object(Bucket=bucket, Key=key, Body=body)

        answer = objects.call(url, put)
    else:
        answer = _multipart(objects, url, path, size, pool)
    etag = answer.get("ETag")
    return str(etag) if etag else None


def _multipart(
    objects: S3Objects, url: str, path: Path, size: int, pool: ThreadPoolExecutor
) -> dict[str, Any]:
    bucket, key = parse_s3_url(url)
    client, call = objects.client, objects.call
    upload = call(url, lambda: client.create_multipart_upload(Bucket=bucket, Key=key))
    upload_id = upload["UploadId"]

    def part(number: int, offset: int) -> dict[str, Any]:
        with path.open("rb") as f:
            f.seek(offset)
            body = f.read(_PART_BYTES)
        answer = call(
            url,
            lambda: client.upload_part(
                Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=body
            ),
        )
        return {"PartNumber": number, "ETag": answer["ETag"]}

    try:
        offsets = range(0, size, _PART_BYTES)
        parts = list(pool.map(part, range(1, len(offsets) + 1), offsets))
        done = {"Parts": parts}
        answer: dict[str, Any] = call(
            url,
            lambda: client.complete_multipart_upload(
                Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload=done
            ),
        )
        return answer
    except BaseException:
        client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
        raise
