"""The decode stages of ``asyncstream probe``: ``python -m dali_ops._probe``.

asyncstream never imports DALI, so its probe (``asyncstream.probe``) runs this module in
a process of its own. It reads one JSON request on its standard input (``url``, ``s3``:
the store's options, ``seconds``, ``inflight``, ``chunk_bytes``) and prints one line of
JSON:

``feed``
    The loader's producer building DALI's batches from a stream of the URL, no decode
    (as ``bench.feed``'s *feed alone*): ``images_per_s`` measured, and
    ``ceiling_images_per_s``: images per CPU second of this process (the fetch engine runs
    in its own), what it reaches when the network never makes it wait.
``decoder``
    The training pipeline (:func:`build_pipeline`, default settings, 224 px) over images
    of the URL held in memory, so that no reading is measured: ``images_per_s`` on the
    GPU (``mixed``) where there is one, else on the CPU with a thread per core.

Where DALI (or torch) cannot be imported: ``{"not_measured": "DALI not installed"}``; a
stage that fails says so in its own ``not_measured``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Literal

_BATCH = 64
_HELD = 256  # images kept in memory for the decoder


def _options(raw: dict[str, Any]) -> Any:
    from asyncstream import S3Options
    from asyncstream.stores._s3 import S3Credentials

    fields = dict(raw)
    credentials = fields.pop("credentials", None)
    return S3Options(**fields, credentials=S3Credentials(**credentials) if credentials else None)


def _stream(request: dict[str, Any]) -> Any:
    from asyncstream import ShardStream

    return ShardStream(
        request["url"],
        s3=_options(request["s3"]),
        seed=0,
        inflight=int(request["inflight"]),
        chunk_bytes=int(request["chunk_bytes"]),
    )


def feed(request: dict[str, Any], seconds: float) -> dict[str, Any]:
    """Batches built for DALI, no decode, for ``seconds`` after the first."""
    from ._batch import BatchBuilder, read_batches
    from ._checks import IMAGE_KEYS

    builder = BatchBuilder(
        _BATCH, on_error="skip", precheck="markers", image_keys=IMAGE_KEYS, label_key="cls"
    )
    images = skipped = 0
    deadline = None
    cpu0 = started = 0.0
    with _stream(request) as stream:
        for epoch in range(1000):
            stream.set_epoch(epoch)
            got = 0
            for batch in read_batches(stream, builder, drop_last=False, track=lambda s: None):
                got += len(batch) + len(batch.skipped)
                skipped += len(batch.skipped)
                if deadline is None:  # the open and the engine's start are not counted
                    started, cpu0 = time.perf_counter(), time.process_time()
                    deadline = started + seconds
                    continue
                images += len(batch)
                if time.perf_counter() >= deadline:
                    break
            if not got or (deadline is not None and time.perf_counter() >= deadline):
                break
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu0
    if not images:
        return {"not_measured": f"no image passed the loader's checks ({skipped} skipped)"}
    return {
        "batch": _BATCH,
        "images": images,
        "seconds": wall,
        "images_per_s": images / wall if wall > 0 else 0.0,
        "ceiling_images_per_s": images / cpu if cpu > 0 else None,
    }


def _held_images(request: dict[str, Any]) -> tuple[list[bytes], int]:
    """The first images of the stream that pass the loader's header check (bytes from the
    store are anyone's: DALI is never handed one that fails it), and how many failed."""
    from ._checks import IMAGE_KEYS, check_image

    held: list[bytes] = []
    refused = 0
    with _stream(request) as stream:
        for sample in stream:
            key = next((k for k in IMAGE_KEYS if k in sample), None)
            if key is not None:
                image = bytes(sample[key])
                if check_image(image, "header") is None:
                    held.append(image)
                else:
                    refused += 1
            if len(held) >= _HELD or refused >= _HELD:
                break
    return held, refused


def decoder(request: dict[str, Any], seconds: float) -> dict[str, Any]:
    """DALI's training pipeline over images held in memory, for ``seconds``."""
    import numpy as np
    import torch

    from ._pipeline import PipelineSettings, build_pipeline

    held, refused = _held_images(request)
    if not held:
        return {
            "not_measured": f"no decodable image in the samples read ({refused} refused by "
            "the header check)"
        }
    arrays = [np.frombuffer(b, dtype=np.uint8) for b in held]
    labels = np.zeros(_BATCH, dtype=np.int64)
    gpu = torch.cuda.is_available()
    device: Literal["cpu", "mixed"] = "mixed" if gpu else "cpu"
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    threads = 4 if gpu else max(1, cpus)
    at = 0

    def source() -> Any:
        nonlocal at
        batch = [arrays[(at + i) % len(arrays)] for i in range(_BATCH)]
        at = (at + _BATCH) % len(arrays)
        return batch, labels

    settings = PipelineSettings(num_threads=threads)
    pipe = build_pipeline(settings, source, batch_size=_BATCH, device=device)
    pipe.run()  # the first batch builds and warms the pipeline
    images, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        images += len(pipe.run()[1])
    if gpu:
        torch.cuda.synchronize()
    wall = time.perf_counter() - started
    del pipe
    return {
        "device": device,
        "threads": threads,
        "gpu": torch.cuda.get_device_name() if gpu else None,
        "batch": _BATCH,
        "images": images,
        "images_per_s": images / wall,
        "distinct_images": len(held),
        "refused_images": refused,
    }


def _stage(run: Any, request: dict[str, Any], seconds: float) -> dict[str, Any]:
    try:
        result: dict[str, Any] = run(request, seconds)
    except Exception as exc:  # one stage's failure is reported, the other still runs
        return {"not_measured": f"{type(exc).__name__}: {exc}"}
    return result


def main() -> int:
    request = json.loads(sys.stdin.read())
    try:
        import nvidia.dali  # noqa: F401
        import torch  # noqa: F401
    except ImportError as exc:
        print(json.dumps({"not_measured": f"DALI not installed ({exc})"}))
        return 0
    half = float(request["seconds"]) / 2
    out = {"feed": _stage(feed, request, half), "decoder": _stage(decoder, request, half)}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
