"""CPU decode and transforms in DataLoader workers: asyncstream's map stage against
webdataset's ``decode("pil")`` pipeline, and what a resume costs each.

The ``cpu_decode`` scenario of ``python -m bench`` (:func:`run`). Every system decodes each
JPEG with Pillow in its DataLoader workers (one per core, up to 4), resizes it to 160 x 160
and makes a uint8 CHW tensor (:func:`transform`), in batches of 64, in a process of its
own (``python -m bench.cpudecode SPEC OUT``), through the loader scenario's network:

* asyncstream: ``ShardLoader(ShardStream(url, ...).map(decode_and_transform), ...)``, the
  stage forwarding the stream's state;
* webdataset: ``WebDataset(urls, shardshuffle=100).shuffle(1000).decode("pil")
  .to_tuple("jpg", "cls").map_tuple(transform, int)`` in a StatefulDataLoader (the
  documented pipeline; :mod:`bench.peers.wds` reads the shards the same way);
* asyncstream wrapped: the stream inside a user's own ``IterableDataset`` that decodes
  but does not forward the state (what a user writes without the map stage).

Measured over one epoch from the loader's construction: images/s and the time to the
first batch; then a resume in a fresh process from the state saved halfway through the
epoch: the time to its first batch and the images decoded to get there. torchdata
restores the map stage's position (the stream's own state); it fast-forwards the other
two, decoding every image before the checkpoint again.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import IterableDataset

if TYPE_CHECKING:
    from ._bench import Bench

BATCH = 64
SIDE = 160
SYSTEMS = ("asyncstream", "webdataset", "asyncstream-wrapped")


def transform(image: Any) -> torch.Tensor:
    """A PIL image to a ``SIDE x SIDE`` uint8 CHW tensor (resize, as a crop would)."""
    import numpy as np

    pixels = np.asarray(image.convert("RGB").resize((SIDE, SIDE)))
    return torch.from_numpy(pixels.copy()).permute(2, 0, 1)


def decode_and_transform(sample: dict[str, Any]) -> tuple[torch.Tensor, int]:
    """asyncstream's stage: Pillow decode (:func:`asyncstream.decode_image`), transform."""
    from asyncstream import decode_image

    _count()
    return transform(decode_image(sample)), int(sample["cls"])


_DECODED: Any = None  # a shared counter, made before the workers fork


def _count() -> None:
    if _DECODED is not None:
        with _DECODED.get_lock():
            _DECODED.value += 1


def _counted(image: Any) -> torch.Tensor:
    _count()
    return transform(image)


def _dataset(spec: dict[str, Any]) -> Any:
    system = spec["system"]
    if system == "webdataset":
        import webdataset as wds

        from .peers._common import s3_client, split_s3_url

        client = s3_client(spec["endpoint_url"])
        urls = []
        for url in spec["shards"]:
            bucket, key = split_s3_url(url)
            urls.append(
                client.generate_presigned_url(
                    "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=6 * 3600
                )
            )
        pipeline = wds.WebDataset(urls, shardshuffle=100, seed=0).shuffle(1000, seed=0)
        return pipeline.decode("pil").to_tuple("jpg", "cls").map_tuple(_counted, int)
    from asyncstream import S3Options, ShardStream

    stream = ShardStream(
        spec["url"], s3=S3Options(endpoint_url=spec["endpoint_url"]), **spec["stream"]
    )
    if system == "asyncstream":
        return stream.map(decode_and_transform)
    return _Wrapped(stream)


class _Wrapped(IterableDataset[tuple[torch.Tensor, int]]):
    """A user's own stage: decodes, but forwards no state (torchdata fast-forwards it)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int]]:
        return map(decode_and_transform, self.stream)


def read(spec: dict[str, Any]) -> dict[str, Any]:
    """One epoch (``state`` null: saving the state halfway), or a resume's first batch."""
    import multiprocessing

    from asyncstream import ShardLoader

    global _DECODED
    _DECODED = multiprocessing.Value("q", 0)
    started = time.perf_counter()
    dataset = _dataset(spec)
    loader = ShardLoader(dataset, batch_size=BATCH, num_workers=spec["workers"])
    if spec["state"] is not None:
        loader.load_state_dict(spec["state"])
    images = 0
    first = None
    state = None
    decoded = 0
    for batch, (pixels, _) in enumerate(loader):
        if first is None:
            first = time.perf_counter() - started
            if spec["state"] is not None:  # a resume: its first batch is the measure
                decoded = _DECODED.value
                break
        images += int(pixels.shape[0])
        if batch + 1 == spec["save_after"]:
            state = loader.state_dict()
    seconds = time.perf_counter() - started
    del loader
    return {
        "images": images,
        "seconds": seconds,
        "images_per_s": images / seconds if images else 0.0,
        "first_batch_s": first,
        "decoded": decoded,
        "state": state,
    }


def _child(b: Bench, spec: dict[str, Any], options: Any) -> dict[str, Any]:
    spec_path = b.workdir / "cpudecode-spec.json"
    out_path = b.workdir / "cpudecode-out.json"
    spec_path.write_text(json.dumps(spec))
    subprocess.run(
        [sys.executable, "-m", "bench.cpudecode", str(spec_path), str(out_path)],
        check=True,
        env=b.child_env(options),
        timeout=1800,
    )
    result: dict[str, Any] = json.loads(out_path.read_text())
    return result


def run(b: Bench) -> dict[str, Any]:
    """The scenario: each system's epoch, then its resume from halfway."""
    import os

    from asyncstream import resolve_shards

    from ._bench import LOADER_SETTINGS

    workers = min(4, os.cpu_count() or 1)
    batches = -(-b.dataset["images"] // BATCH)
    save_after = max(1, batches // 2)
    systems: dict[str, Any] = {}
    with b.endpoint() as (options, _):
        shards = [shard.url for shard in resolve_shards(b.url, b.options)]
        base = {
            "url": b.url,
            "shards": shards,
            "endpoint_url": options.endpoint_url,
            "stream": LOADER_SETTINGS,
            "workers": workers,
            "save_after": save_after,
        }
        for system in SYSTEMS:
            epoch = _child(b, {**base, "system": system, "state": None}, options)
            resumed = _child(b, {**base, "system": system, "state": epoch["state"]}, options)
            systems[system] = {
                "images": epoch["images"],
                "images_per_s": epoch["images_per_s"],
                "first_batch_s": epoch["first_batch_s"],
                "resume_first_batch_s": resumed["first_batch_s"],
                "resume_decoded": resumed["decoded"],
                "saved_after_images": save_after * BATCH,
            }
    return {"workers": workers, "batch": BATCH, "side": SIDE, "systems": systems}


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    Path(sys.argv[2]).write_text(json.dumps(read(spec)))


if __name__ == "__main__":
    main()
