"""Resume a DALIImageLoader state in a fresh process: ``python _dali_resume_child.py SPEC OUT``.

SPEC (JSON): ``folder``, ``workers``, ``batch_size``, ``epochs`` (the last epoch to read,
exclusive), ``epoch`` (the state's) and ``state``. The child builds a stream and a loader
with ``workers``, loads the state, and reads from ``epoch`` to ``epochs``; OUT gets each
epoch's batches as lists of ``(shard URL, key)`` and the loader's pipeline builds.
"""

from __future__ import annotations

import json
import sys

from asyncstream import ShardStream
from dali_ops import DALIImageLoader, PipelineSettings

SETTINGS = PipelineSettings(image_size=32, num_threads=2, seed=7, train=False)


def main(spec_path: str, out_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    stream = ShardStream(spec["folder"], window=4, inflight=2, seed=0)
    epochs: list[list[list[list[str]]]] = []
    with DALIImageLoader(
        stream, spec["batch_size"], device="cpu", settings=SETTINGS, workers=spec["workers"]
    ) as loader:
        loader.load_state_dict(spec["state"])
        for epoch in range(spec["epoch"], spec["epochs"]):
            if epoch != spec["epoch"]:
                loader.set_epoch(epoch)
            epochs.append([[list(k) for k in loader.last_keys] for _ in loader])
        builds = loader.stats()["builds"]
    with open(out_path, "w") as f:
        json.dump({"epochs": epochs, "builds": builds}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
