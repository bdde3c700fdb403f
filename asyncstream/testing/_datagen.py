"""Synthetic datasets on disk: :func:`generate_imagefolder` writes the photographs of
:func:`~._photos.make_jpeg` in ``torchvision`` ImageFolder layout, over a process pool.

Used by ``asyncstream generate``, ``asyncstream demo``, the benchmark and the tests.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import pathlib
from collections.abc import Callable

from ._photo_parts import _check_int, class_names
from ._photos import make_jpeg

__all__ = ["class_names", "generate_imagefolder", "make_jpeg"]


def _write_one(job: tuple[str, int, int, int, int]) -> str:
    """Process-pool worker: render one image and write it atomically. Top level: spawn-safe."""
    path, seed, class_index, index, n_classes = job
    data = make_jpeg(seed, class_index, index, n_classes)
    target = pathlib.Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def generate_imagefolder(
    dest: str | os.PathLike[str],
    n_images: int,
    n_classes: int,
    *,
    seed: int = 0,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[pathlib.Path]:
    """Write a synthetic dataset in ``torchvision`` ImageFolder layout.

    Image ``i`` (``0 <= i < n_images``) belongs to class ``i % n_classes`` (round-robin, so the
    classes are balanced to within one image) and is written to
    ``dest/<class_name>/<class_name>_<i:06d>.jpg`` with the bytes of
    ``make_jpeg(seed, i % n_classes, i, n_classes)``. Because an image depends only on its own
    index, a larger ``n_images`` gives a superset of a smaller one.

    The call is idempotent: files are rewritten atomically with the same bytes. Files that
    are already in ``dest`` and not part of this dataset are left alone. When ``n_classes >
    n_images`` only the first ``n_images`` class folders are created.

    Args:
        dest: Root folder; created if missing.
        n_images: Number of images, an int >= 1.
        n_classes: Number of classes, an int >= 1.
        seed: Dataset seed, an int >= 0.
        workers: Worker processes. ``None`` means ``os.cpu_count()``; ``1`` renders in this
            process. The pool uses the ``spawn`` start method on every platform, so it is
            safe to call from a process that runs threads (an event loop, an S3 server, ...)
            and the bytes do not depend on the platform's default; as with any spawned
            pool, a calling *script* needs the ``if __name__ == "__main__":`` guard.
        progress: called as ``progress(images_written, n_images)`` after each image
            (from this thread), e.g. to drive a progress bar.

    Returns:
        The paths of the ``n_images`` files written, sorted.

    Raises:
        ValueError: If an argument is out of range.
    """
    n_images = _check_int("n_images", n_images, 1)
    names = class_names(n_classes)
    n_classes = len(names)
    seed = _check_int("seed", seed, 0)
    n_workers = (os.cpu_count() or 1) if workers is None else _check_int("workers", workers, 1)
    n_workers = min(n_workers, n_images)

    root = pathlib.Path(dest)
    jobs: list[tuple[str, int, int, int, int]] = []
    for c in range(min(n_classes, n_images)):
        (root / names[c]).mkdir(parents=True, exist_ok=True)
    for i in range(n_images):
        c = i % n_classes
        path = root / names[c] / f"{names[c]}_{i:06d}.jpg"
        jobs.append((os.fspath(path), seed, c, i, n_classes))

    written: list[str] = []
    if n_workers == 1:
        for job in jobs:
            written.append(_write_one(job))
            if progress is not None:
                progress(len(written), n_images)
    else:
        chunksize = max(1, min(32, len(jobs) // (n_workers * 8)))
        ctx = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(max_workers=n_workers, mp_context=ctx) as pool:
            for done in pool.map(_write_one, jobs, chunksize=chunksize):
                written.append(done)
                if progress is not None:
                    progress(len(written), n_images)
    return sorted(pathlib.Path(p) for p in written)
