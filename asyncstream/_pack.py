"""Pack an ImageFolder tree into webdataset-layout tar shards, locally or on S3.

``SRC/<class>/<image>`` becomes shards of ``KEY.jpg`` + ``KEY.cls`` (the class index as
ASCII digits), with ``classes.json`` beside them mapping class names to indices, and
``asyncstream.json``, the manifest: every shard's samples, size and ETag (S3 returns the
ETag of each upload; local files have none), which a stream opens with one read. Classes
are numbered in sorted folder order, as torchvision's ImageFolder does. Shards are
deterministic: same input, same options, same bytes (mtime 0, no owner names).

A destination that already holds ``.tar`` shards (or a manifest) is refused unless
``overwrite=True``: two packs into one place would leave the first one's extra shards
behind, which a prefix listing would then read as data. With ``overwrite``, the shards
of the folder that the new pack did not write are removed, after the new shards and the
manifest are written (so a pack that fails half-way leaves the old manifest, or the new
one, never a mix that is read as one dataset). Only the destination folder itself is
cleared: ``.tar`` files in folders below it are left alone (a stream over the prefix
warns about them as stale).

Symbolic links are followed only while they stay inside ``SRC``; one that points outside
is refused, so packing cannot leak files from elsewhere on the machine. A link to a folder
that is packed already (a loop, or a second path to the same folder) is refused too.
"""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import tarfile
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ._index import MANIFEST_NAME, manifest_bytes
from ._s3 import S3Options
from ._s3store import S3Store
from ._store import Stores
from ._urls import local_path, parse_s3_url, scheme_of

__all__ = ["IMAGE_EXTENSIONS", "PackResult", "PackedShard", "pack"]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")
_HEADER = 512
_MULTIPART_THRESHOLD = 64 << 20
_PART_BYTES = 16 << 20


@dataclass(frozen=True)
class PackedShard:
    """One written shard: where, how many samples, how many bytes, its ETag (S3 only)."""

    url: str
    samples: int
    size: int
    etag: str | None = None


@dataclass(frozen=True)
class PackResult:
    """What :func:`pack` wrote."""

    classes: list[str]
    shards: list[PackedShard] = field(default_factory=list)

    @property
    def samples(self) -> int:
        """Total samples over all shards."""
        return sum(s.samples for s in self.shards)

    @property
    def size(self) -> int:
        """Total bytes over all shards."""
        return sum(s.size for s in self.shards)


@dataclass(frozen=True)
class _Sample:
    path: Path
    label: int
    ext: str
    size: int


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _enter(folder: Path, root: Path, src: Path, walked: set[Path]) -> None:
    """Check a folder about to be walked: inside ``root``, and not walked before."""
    real = folder.resolve()
    if not _inside(real, root):
        raise ValueError(f"refusing {folder}: a symbolic link pointing outside {src}")
    if real in walked:
        raise ValueError(
            f"refusing {folder}: it leads to {real}, a folder already packed "
            "(a symbolic link loop, or two paths to the same folder)"
        )
    walked.add(real)


def _scan(src: Path) -> tuple[list[str], list[_Sample]]:
    if not src.is_dir():
        raise ValueError(f"pack source {src} is not a folder (expected SRC/<class>/<image>)")
    root = src.resolve()
    classes = sorted(p.name for p in src.iterdir() if not p.name.startswith(".") and p.is_dir())
    samples: list[_Sample] = []
    # Each real folder is walked once: os.walk(followlinks=True) does not notice link loops,
    # so a link to an ancestor would repeat its images (two such links: exponentially).
    walked: set[Path] = {root}
    for label, name in enumerate(classes):
        class_dir = src / name
        _enter(class_dir, root, src, walked)
        for dirpath, dirnames, filenames in os.walk(class_dir, followlinks=True):
            here = Path(dirpath)
            dirnames.sort()
            for d in dirnames:
                _enter(here / d, root, src, walked)
            for fname in sorted(filenames):
                path = here / fname
                ext = path.suffix.lower()
                if fname.startswith(".") or ext not in IMAGE_EXTENSIONS:
                    continue
                real = path.resolve()
                if not _inside(real, root):
                    raise ValueError(f"refusing {path}: a symbolic link pointing outside {src}")
                ext = "jpg" if ext in (".jpg", ".jpeg") else ext[1:]
                samples.append(_Sample(path, label, ext, real.stat().st_size))
    if not samples:
        raise ValueError(f"pack source {src} holds no image in any class folder")
    return classes, samples


def _group(
    samples: Sequence[_Sample], shard_bytes: int | None, shard_samples: int | None
) -> Iterator[list[tuple[int, _Sample]]]:
    group: list[tuple[int, _Sample]] = []
    size = 0
    for index, sample in enumerate(samples):
        cost = 4 * _HEADER + sample.size
        full_by_count = shard_samples is not None and len(group) >= shard_samples
        full_by_bytes = shard_bytes is not None and group and size + cost > shard_bytes
        if full_by_count or full_by_bytes:
            yield group
            group, size = [], 0
        group.append((index, sample))
        size += cost
    if group:
        yield group


def _add(archive: tarfile.TarFile, name: str, data: bytes | IO[bytes], size: int) -> None:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = 0o644
    info.mtime = 0
    fileobj = io.BytesIO(data) if isinstance(data, bytes) else data
    archive.addfile(info, fileobj)


def _write_shard(out: IO[bytes], members: list[tuple[int, _Sample]], width: int) -> None:
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        for index, sample in members:
            key = f"{index:0{width}d}"
            with sample.path.open("rb") as image:
                _add(archive, f"{key}.{sample.ext}", image, sample.size)
            _add(archive, f"{key}.cls", str(sample.label).encode("ascii"), len(str(sample.label)))


class _Sink:
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
        """URLs of the ``.tar`` shards and manifest directly in the destination folder."""
        wanted = (".tar", "/" + MANIFEST_NAME)
        if not self.s3:
            return sorted(
                p.absolute().as_uri()
                for p in self.folder.iterdir()
                if p.is_file() and (p.suffix == ".tar" or p.name == MANIFEST_NAME)
            )
        listing = self.stores.for_url(self.folder_url + "/").list(self.folder_url + "/")
        found = [o.url for o in listing if "/" not in o.url[len(self.folder_url) + 1 :]]
        return sorted(u for u in found if u.endswith(wanted))

    def put_file(self, name: str, path: Path) -> str | None:
        """Store a shard; returns its ETag (S3) or None (local)."""
        if not self.s3:
            shutil.move(path, self.folder / name)
            return None
        size = path.stat().st_size
        key = self.prefix + name
        if size < _MULTIPART_THRESHOLD:

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


def pack(
    src: str | os.PathLike[str],
    dest: str,
    *,
    shard_bytes: int | None = 256 << 20,
    shard_samples: int | None = None,
    shuffle_seed: int | None = None,
    name_prefix: str = "shard-",
    options: S3Options | None = None,
    workers: int = 8,
    progress: Callable[[int, int, int], None] | None = None,
    overwrite: bool = False,
) -> PackResult:
    """Pack an ImageFolder tree into tar shards.

    Args:
        src: the folder, one subfolder per class.
        dest: a local folder (or ``file://`` URL) or an ``s3://bucket/prefix/``.
        shard_bytes: close a shard before it would pass this many bytes (``None``: no limit).
        shard_samples: close a shard at this many samples (``None``: no limit). With both
            set, whichever comes first.
        shuffle_seed: shuffle the samples with this seed before sharding (``None``: keep
            class-sorted order).
        name_prefix: shard names are ``{name_prefix}{index:06d}.tar``.
        options: how to reach S3.
        workers: shards built and uploaded in parallel.
        progress: called as ``progress(samples_done, bytes_done, samples_total)`` after
            each shard.
        overwrite: pack into a destination that already holds shards, and remove its
            shards that this pack does not write (see the module docstring).

    Returns:
        The shards written, in order, and the class names.

    Raises:
        ValueError: a bad argument, an empty source, a symlink out of ``src`` or to a
            folder already packed (a loop), or a destination that holds shards already
            (without ``overwrite``).
        FetchError: the destination bucket is missing or not writable.
    """
    if shard_bytes is None and shard_samples is None:
        raise ValueError("give shard_bytes, shard_samples or both")
    if shard_bytes is not None and shard_bytes < 1:
        raise ValueError(f"shard_bytes must be >= 1, got {shard_bytes}")
    if shard_samples is not None and shard_samples < 1:
        raise ValueError(f"shard_samples must be >= 1, got {shard_samples}")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if "/" in name_prefix:
        raise ValueError(f"name_prefix must not contain '/', got {name_prefix!r}")
    classes, samples = _scan(Path(src))
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(samples)
    width = max(6, len(str(len(samples) - 1)))
    groups = list(_group(samples, shard_bytes, shard_samples))
    sink = _Sink(str(dest), options, part_workers=workers)
    try:
        before = sink.existing()
    except BaseException:
        sink.close()
        raise
    if before and not overwrite:
        sink.close()
        shown = ", ".join(before[:3]) + (f", ... ({len(before)} in all)" if len(before) > 3 else "")
        raise ValueError(
            f"{dest} already holds a dataset ({shown}): pack refuses to write over it, since "
            "its extra shards would be left behind; pass overwrite=True (--overwrite) to "
            "replace it and remove the shards the new pack does not write"
        )
    lock = threading.Lock()
    done = [0, 0]
    results: list[PackedShard | None] = [None] * len(groups)

    def build(number: int, members: list[tuple[int, _Sample]], tmp: Path) -> None:
        name = f"{name_prefix}{number:06d}.tar"
        path = tmp / name
        with path.open("wb") as out:
            _write_shard(out, members, width)
        size = path.stat().st_size
        etag = sink.put_file(name, path)
        path.unlink(missing_ok=True)
        results[number] = PackedShard(sink.url(name), len(members), size, etag)
        with lock:
            done[0] += len(members)
            done[1] += size
            if progress is not None:
                progress(done[0], done[1], len(samples))

    tmp_root = Path(dest) if not sink.s3 else None
    try:
        with (
            tempfile.TemporaryDirectory(prefix=".asyncstream-pack-", dir=tmp_root) as tmp,
            ThreadPoolExecutor(workers) as pool,
        ):
            futures: list[Future[None]] = [
                pool.submit(build, i, g, Path(tmp)) for i, g in enumerate(groups)
            ]
            try:
                for fut in futures:
                    fut.result()
            except BaseException:
                for fut in futures:
                    fut.cancel()
                raise
        shards = [r for r in results if r is not None]
        class_map = {
            "classes": classes,
            "class_to_index": {name: i for i, name in enumerate(classes)},
            "samples": sum(s.samples for s in shards),
            "shards": [{"url": s.url, "samples": s.samples, "size": s.size} for s in shards],
        }
        sink.put_bytes("classes.json", json.dumps(class_map, indent=1).encode())
        rows = [(s.url, s.samples, s.size, s.etag) for s in shards]
        sink.put_bytes(MANIFEST_NAME, manifest_bytes(sink.folder_url, rows))
        written = {s.url for s in shards} | {sink.url(MANIFEST_NAME)}
        stale = [url for url in before if url not in written]
        if stale:
            sink.stores.delete(stale)
    finally:
        sink.close()
    return PackResult(classes=classes, shards=shards)
