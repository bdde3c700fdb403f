"""CPU decode in DataLoader workers, resumed in a fresh process: ``python
tests/_decode_child.py SPEC OUT``.

SPEC (JSON): ``folder``, ``stream`` (ShardStream keyword arguments), ``workers``,
``batch_size``, ``stage`` (``"map"``: ``stream.map(decode)``; ``"wrapper"``: a user's own
IterableDataset around the stream, which forwards no state) and ``state`` (a
StatefulDataLoader state to load, or null). OUT gets the batches read to the end of the
epoch (keys, labels and a checksum of the decoded pixels), how many samples the workers
decoded, and what torchdata logged.
"""

from __future__ import annotations

import io
import json
import logging
import multiprocessing
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset

import asyncstream
from asyncstream import ShardLoader, ShardStream

DECODED = multiprocessing.Value("q", 0)  # inherited by the forked workers


def decode(sample: dict[str, Any]) -> tuple[torch.Tensor, int, str]:
    """What a user's transform does: decode with Pillow, resize, to a CHW uint8 tensor."""
    image = asyncstream.decode_image(sample).resize((24, 24))
    with DECODED.get_lock():
        DECODED.value += 1
    pixels = torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1)
    return pixels, int(sample["cls"]), sample["__key__"]


class Wrapper(IterableDataset[tuple[torch.Tensor, int, str]]):
    """A user's own stage that does not forward the stream's state."""

    def __init__(self, stream: ShardStream) -> None:
        self.stream = stream

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int, str]]:
        return map(decode, self.stream)


def read(spec: dict[str, Any]) -> dict[str, Any]:
    log = io.StringIO()
    logging.getLogger().addHandler(logging.StreamHandler(log))
    stream = ShardStream(spec["folder"], **spec["stream"])
    dataset: Any = stream.map(decode) if spec["stage"] == "map" else Wrapper(stream)
    loader = ShardLoader(dataset, batch_size=spec["batch_size"], num_workers=spec["workers"])
    if spec["state"] is not None:
        loader.load_state_dict(spec["state"])
    batches = []
    states = []
    for pixels, labels, keys in loader:
        batches.append([list(keys), labels.tolist(), int(pixels.to(torch.int64).sum())])
        states.append(loader.state_dict())
    del loader
    stream.close()
    return {"batches": batches, "states": states, "decoded": DECODED.value, "log": log.getvalue()}


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    result = read(spec)
    with open(sys.argv[2], "w") as f:
        json.dump(result, f)
