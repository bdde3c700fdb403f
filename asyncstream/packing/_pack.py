"""Pack an ImageFolder tree into webdataset-layout tar shards, locally or on S3.

``SRC/<class>/<image>`` becomes shards of samples ``KEY.jpg`` (or ``.png``, ``.webp``,
``.bmp``: see :mod:`._images`), ``KEY.cls`` (the class index as ASCII digits) and
``KEY.json``, ``{"source": "cat/img_0007.png", "class": "cat", "label": 0}`` (plus
``"converted_from": "GIF"`` for a converted image): keys are renumbered in pack order, so
the source path is what ties a sample, and an error naming it, back to its file. Beside
the shards go ``classes.json``, mapping class names to indices, and
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

Every image is decoded before anything is written (:mod:`._images` says how and why). A
bad one (truncated, not an image, undecodable) is, with ``on_error="skip"`` (the default),
left out, named in a :class:`~asyncstream.SkippedImageWarning` and listed in
:attr:`PackResult.skipped`; with ``on_error="fail"`` the pack is refused with a
:class:`~asyncstream.DecodeError` naming every bad file and why, before any shard is
written or uploaded. The check comes first because a shard is closed by its byte size,
which depends on what is left out and on conversions.

Symbolic links are followed only while they stay inside ``SRC``; one that points outside
is refused, so packing cannot leak files from elsewhere on the machine. A link to a folder
that is packed already (a loop, or a second path to the same folder) is refused too.
"""

from __future__ import annotations

import io
import json
import os
import random
import sys
import tarfile
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal

from .._exceptions import DecodeError, SkippedImageWarning
from ..dataset._index import MANIFEST_NAME, manifest_bytes
from ..stores._s3 import S3Options
from ._images import Conversion, PackImage, SkippedImage, SourceImage, check_images, listing
from ._packbars import pack_bars, pack_summary
from ._packsink import PackSink

__all__ = ["IMAGE_EXTENSIONS", "PackResult", "PackedShard", "SkippedImage", "pack"]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")
_HEADER = 512


@dataclass(frozen=True)
class PackedShard:
    """One written shard: where, how many samples, how many bytes, its ETag (S3 only)."""

    url: str
    samples: int
    size: int
    etag: str | None = None


@dataclass(frozen=True)
class PackResult:
    """What :func:`pack` wrote, and the source images it left out.

    Attributes:
        classes: class names; a class's index is its position.
        shards: the shards written, in order.
        skipped: images left out because they do not decode (``on_error="skip"``), each
            with its path relative to the source folder and the reason.
    """

    classes: list[str]
    shards: list[PackedShard] = field(default_factory=list)
    skipped: list[SkippedImage] = field(default_factory=list)

    @property
    def samples(self) -> int:
        """Total samples over all shards."""
        return sum(s.samples for s in self.shards)

    @property
    def size(self) -> int:
        """Total bytes over all shards."""
        return sum(s.size for s in self.shards)


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


def _scan(src: Path) -> tuple[list[str], list[SourceImage]]:
    if not src.is_dir():
        raise ValueError(f"pack source {src} is not a folder (expected SRC/<class>/<image>)")
    root = src.resolve()
    classes = sorted(p.name for p in src.iterdir() if not p.name.startswith(".") and p.is_dir())
    found: list[SourceImage] = []
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
                if fname.startswith(".") or path.suffix.lower() not in IMAGE_EXTENSIONS:
                    continue
                if not _inside(path.resolve(), root):
                    raise ValueError(f"refusing {path}: a symbolic link pointing outside {src}")
                found.append(SourceImage(path, label, path.relative_to(src).as_posix()))
    if not found:
        raise ValueError(f"pack source {src} holds no image in any class folder")
    return classes, found


def _blocks(size: int) -> int:
    """Bytes a member of ``size`` bytes takes in a tar: its header and padded data."""
    return _HEADER + -(-size // _HEADER) * _HEADER


def _sample_bytes(sample: PackImage) -> int:
    return _blocks(sample.size) + _blocks(len(str(sample.label))) + _blocks(len(sample.meta))


def _group(
    samples: Sequence[PackImage], shard_bytes: int | None, shard_samples: int | None
) -> Iterator[list[tuple[int, PackImage]]]:
    group: list[tuple[int, PackImage]] = []
    size = 0
    for index, sample in enumerate(samples):
        cost = _sample_bytes(sample)
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


def _write_shard(out: IO[bytes], members: list[tuple[int, PackImage]], width: int) -> None:
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        for index, sample in members:
            key = f"{index:0{width}d}"
            with sample.data_path.open("rb") as image:
                _add(archive, f"{key}.{sample.ext}", image, sample.size)
            label = str(sample.label).encode("ascii")
            _add(archive, f"{key}.cls", label, len(label))
            _add(archive, f"{key}.json", sample.meta, len(sample.meta))


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
    progress: Callable[[int, int, int], None] | bool | None = None,
    overwrite: bool = False,
    on_error: Literal["skip", "fail"] = "skip",
    to_jpeg: bool = False,
    jpeg_quality: int = 95,
    check_progress: Callable[[int, int], None] | None = None,
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
        workers: images checked, and shards built and uploaded, in parallel.
        progress: called as ``progress(samples_done, bytes_done, samples_total)`` after
            each shard; ``True`` shows progress bars (images checked, samples packed) and
            then a one-line summary on stderr; ``None`` or ``False`` (the default),
            nothing is shown.
        overwrite: pack into a destination that already holds shards, and remove its
            shards that this pack does not write (see the module docstring).
        on_error: what to do with an image that does not decode: ``"skip"`` leaves it out,
            names it in a :class:`~asyncstream.SkippedImageWarning` and lists it in
            :attr:`PackResult.skipped`; ``"fail"`` refuses the pack before anything is
            written.
        to_jpeg: store every image as a JPEG (JPEGs as they are, others encoded at
            ``jpeg_quality``); by default JPEG, PNG, WebP and BMP are stored as they are
            and other formats (GIF, TIFF, ...) converted to PNG.
        jpeg_quality: the quality of images converted to JPEG, 1 to 100.
        check_progress: called as ``check_progress(images_checked, images_total)`` while
            the images are decoded, before any shard is written.

    Returns:
        The shards written, in order, the class names and the images left out.

    Raises:
        ValueError: a bad argument, an empty source, a symlink out of ``src`` or to a
            folder already packed (a loop), or a destination that holds shards already
            (without ``overwrite``).
        DecodeError: with ``on_error="fail"``, an image that does not decode; with
            ``"skip"``, a source in which no image decodes. Each bad file is named (relative
            to ``src``) with the reason, and nothing is written.
        FetchError: the destination bucket is missing or not writable.
        OSError: a source file that cannot be read.
    """
    if progress is True:
        with pack_bars(True) as (checked, packed):
            result = pack(
                src,
                dest,
                shard_bytes=shard_bytes,
                shard_samples=shard_samples,
                shuffle_seed=shuffle_seed,
                name_prefix=name_prefix,
                options=options,
                workers=workers,
                progress=packed,
                overwrite=overwrite,
                on_error=on_error,
                to_jpeg=to_jpeg,
                jpeg_quality=jpeg_quality,
                check_progress=check_progress or checked,
            )
        summary = pack_summary(
            result.samples, len(result.shards), result.size, str(dest), len(result.skipped)
        )
        print(f"asyncstream: {summary}", file=sys.stderr, flush=True)
        return result
    if progress is not None and not isinstance(progress, bool) and not callable(progress):
        raise TypeError(f"progress must be a callable, True or False, got {progress!r}")
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
    if on_error not in ("skip", "fail"):
        raise ValueError(f"on_error must be 'skip' or 'fail', got {on_error!r}")
    if isinstance(jpeg_quality, bool) or not isinstance(jpeg_quality, int):
        raise ValueError(f"jpeg_quality must be an integer from 1 to 100, got {jpeg_quality!r}")
    if not 1 <= jpeg_quality <= 100:
        raise ValueError(f"jpeg_quality must be an integer from 1 to 100, got {jpeg_quality!r}")
    classes, found = _scan(Path(src))
    sink = PackSink(str(dest), options, part_workers=workers)
    try:
        before = sink.existing()
        if before and not overwrite:
            shown = ", ".join(before[:3])
            shown += f", ... ({len(before)} in all)" if len(before) > 3 else ""
            raise ValueError(
                f"{dest} already holds a dataset ({shown}): pack refuses to write over it, "
                "since its extra shards would be left behind; pass overwrite=True "
                "(--overwrite) to replace it and remove the shards the new pack does not write"
            )
        tmp_root = sink.local_folder
        with tempfile.TemporaryDirectory(prefix=".asyncstream-pack-", dir=tmp_root) as tmp:
            spool = Path(tmp) / "converted"
            spool.mkdir()
            conversion = Conversion(to_jpeg, jpeg_quality, spool)
            samples, bad = check_images(found, classes, conversion, workers, check_progress)
            if bad and (on_error == "fail" or not samples):
                hint = "; fix or remove them, or pass on_error='skip' (--on-error skip)"
                raise DecodeError(
                    f"pack refused: {len(bad)} of {len(found)} images in {src} do not decode, "
                    f"so nothing was written: {listing(bad)}{hint if samples else ''}"
                )
            if bad:
                warnings.warn(
                    SkippedImageWarning(
                        f"pack skipped {len(bad)} of {len(found)} images in {src} that do not "
                        f"decode: {listing(bad)}"
                    ),
                    stacklevel=2,
                )
            shards = _write(
                sink,
                samples,
                classes,
                before,
                Path(tmp),
                _Writing(
                    shard_bytes,
                    shard_samples,
                    shuffle_seed,
                    name_prefix,
                    workers,
                    progress if callable(progress) else None,
                ),
            )
    finally:
        sink.close()
    return PackResult(classes=classes, shards=shards, skipped=bad)


@dataclass(frozen=True)
class _Writing:
    shard_bytes: int | None
    shard_samples: int | None
    shuffle_seed: int | None
    name_prefix: str
    workers: int
    progress: Callable[[int, int, int], None] | None


def _write(
    sink: PackSink,
    samples: list[PackImage],
    classes: list[str],
    before: list[str],
    tmp: Path,
    how: _Writing,
) -> list[PackedShard]:
    """Write the shards, ``classes.json`` and the manifest; remove stale shards."""
    if how.shuffle_seed is not None:
        random.Random(how.shuffle_seed).shuffle(samples)
    width = max(6, len(str(len(samples) - 1)))
    groups = list(_group(samples, how.shard_bytes, how.shard_samples))
    lock = threading.Lock()
    done = [0, 0]
    results: list[PackedShard | None] = [None] * len(groups)

    def build(number: int, members: list[tuple[int, PackImage]]) -> None:
        name = f"{how.name_prefix}{number:06d}.tar"
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
            if how.progress is not None:
                how.progress(done[0], done[1], len(samples))

    with ThreadPoolExecutor(how.workers) as pool:
        futures: list[Future[None]] = [pool.submit(build, i, g) for i, g in enumerate(groups)]
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
    return shards
