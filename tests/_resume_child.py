"""Resume saved loader states in a fresh process: ``python tests/_resume_child.py SPEC OUT``.

SPEC (JSON): ``folder`` (or ``sources``, a list of ``asyncstream.Source`` keyword
arguments, ``urls`` included, to mix), ``stream`` (ShardStream keyword arguments), ``loader``
(StatefulDataLoader keyword arguments), ``epochs`` and ``saves``, a list of ``{"epoch":
e, "state": loader state}``. For each save, a new stream and loader load the state and read
from epoch ``e`` to the last; OUT gets the batches each read (lists of sample keys).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from torchdata.stateful_dataloader import StatefulDataLoader

from asyncstream import ShardStream, Source


def keys(batch: list[dict[str, Any]]) -> list[str]:
    """The collate function: a batch's sample keys."""
    return [sample["__key__"] for sample in batch]


def record_epochs(
    stream: ShardStream, loader: StatefulDataLoader, epochs: int = 2
) -> tuple[list[list[list[str]]], list[list[str]]]:
    """Run ``epochs`` epochs: each epoch's batches (keys, with :func:`keys` as the collate
    function), and the loader's state after each batch, as JSON (plain JSON, a copy)."""
    batches: list[list[list[str]]] = []
    states: list[list[str]] = []
    for epoch in range(epochs):
        stream.set_epoch(epoch)
        batches.append([])
        states.append([])
        for batch in loader:
            batches[-1].append(batch)
            states[-1].append(json.dumps(loader.state_dict()))
    return batches, states


def main(spec_path: str, out_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    results = []
    urls: Any = spec.get("folder")
    if "sources" in spec:
        urls = [Source(**source) for source in spec["sources"]]
    for save in spec["saves"]:
        with ShardStream(urls, **spec["stream"]) as stream:
            loader = StatefulDataLoader(stream, collate_fn=keys, **spec["loader"])
            loader.load_state_dict(save["state"])
            batches = []
            for epoch in range(save["epoch"], spec["epochs"]):
                stream.set_epoch(epoch)
                batches.extend(loader)
            del loader
        results.append(batches)
    with open(out_path, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
