"""The ``nginx`` network profile of ``python -m bench``: the benchmark's bucket served by
nginx (:class:`asyncstream.testing.Nginx`) on the S3-like link (20 to 50 ms to the first
byte, 90 MB/s per connection), pinned to a CPU of its own while the benchmark and every
reader it starts run on the others, so that the store costs the reader's cores nothing.

The bucket is copied out of the embedded server into nginx's folder once the dataset is
packed; the manifests' ETags are then rewritten to nginx's own (``"mtime-size"``, where
moto's are MD5s), read back from nginx's listing, so the open still checks every shard's
ETag against its index.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncstream import S3Options
from asyncstream.stores._s3 import sync_client
from asyncstream.testing import NetworkProfile, Nginx

__all__ = ["NginxLink", "nginx_link"]

_MANIFEST = "asyncstream.json"


@dataclass(frozen=True)
class NginxLink:
    """nginx serving the benchmark's bucket: how to reach it, its process, the pinning,
    and the number of requests it has answered so far (from its access log)."""

    options: S3Options
    pid: int | None
    pinning: dict[str, Any]
    requests: Callable[[], int]
    # Copies what the embedded server holds under an s3:// prefix into nginx's folder
    # (nginx takes no uploads: a peer converts on the embedded server, then reads the
    # copy from nginx); returns the objects copied.
    mirror: Callable[[str], int]


def _copy_bucket(client: Any, bucket: str, folder: Path, prefix: str = "") -> int:
    copied = 0
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    for page in pages:
        for obj in page.get("Contents", []):
            target = folder / obj["Key"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read())
            copied += 1
    return copied


def _retag_manifests(client: Any, bucket: str, folder: Path) -> None:
    """Give every manifest's shards the ETags nginx sends for them."""
    etags = {
        obj["Key"]: obj["ETag"]
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
        for obj in page.get("Contents", [])
    }
    for manifest in folder.rglob(_MANIFEST):
        doc = json.loads(manifest.read_text())
        prefix = manifest.parent.relative_to(folder).as_posix()
        for entry in doc.get("shards", []):
            url = entry["url"]
            if url.startswith("s3://"):
                key = url.split("/", 3)[3]
            else:
                key = url if prefix in ("", ".") else f"{prefix}/{url}"
            if entry.get("etag") and key in etags:
                entry["etag"] = etags[key]
        manifest.write_text(json.dumps(doc))


def _cpus() -> tuple[int, set[int]]:
    """nginx's CPU (the last this process may use) and the readers' (the others)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return cpus[0], set(cpus)  # one CPU: shared, and said so in the pinning
    return cpus[-1], set(cpus[:-1])


@contextlib.contextmanager
def nginx_link(options: S3Options, bucket: str, workdir: Path) -> Iterator[NginxLink]:
    """nginx serving a copy of ``bucket`` (read through ``options``) on the S3-like link,
    pinned, with this process (and so every reader it starts) pinned to the other CPUs
    until the block ends."""
    root = workdir / "nginx-root"
    (root / bucket).mkdir(parents=True, exist_ok=True)
    objects = _copy_bucket(sync_client(options), bucket, root / bucket)
    server_cpu, reader_cpus = _cpus()
    before = os.sched_getaffinity(0)
    with Nginx(root, profile=NetworkProfile.s3_like(), cpu=server_cpu) as nginx:
        link = nginx.options()
        _retag_manifests(sync_client(link), bucket, root / bucket)
        nginx.refresh()
        os.sched_setaffinity(0, reader_cpus)
        try:
            source = nginx.installation.source if nginx.installation else "?"
            pinning = {
                "server_cpus": sorted(nginx.cpus()),
                "reader_cpus": sorted(os.sched_getaffinity(0)),
                "server": f"{nginx.version()} ({source})",
                "link": "20 to 50 ms to first byte, 90 MB/s per connection (TCP pacing)",
                "objects": objects,
            }

            def mirror(url: str) -> int:
                """``s3://BUCKET/PREFIX`` of the embedded server, copied into nginx's
                folder afresh (what was there under the prefix first removed)."""
                bucket_of, _, prefix = url.removeprefix("s3://").partition("/")
                place = root / bucket_of / prefix
                if prefix and place.is_dir():
                    shutil.rmtree(place)
                copied = _copy_bucket(sync_client(options), bucket_of, root / bucket_of, prefix)
                nginx.refresh()
                return copied

            yield NginxLink(link, nginx.pid, pinning, lambda: len(nginx.requests()), mirror)
        finally:
            os.sched_setaffinity(0, before)
