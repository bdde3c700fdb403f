"""One rank of a many-node job under torchrun: ``python tests/_nodes_child.py SPEC OUT``.

SPEC (JSON): ``url``, ``stream`` (ShardStream keyword arguments), ``batch``, ``workers``
(StatefulDataLoader workers) and ``phase``:

* ``"save"``: one whole epoch (0), then, once every rank is done with it, rank 0 asks the
  store for ``mark`` (a line in its log between the epochs), then ``batches[rank]``
  batches of epoch 1 and the loader's state;
* ``"resume"``: every old rank's state (``old_world`` of them, from OUT), then the rest of
  epoch 1.

Each reader (DataLoader worker) tells, with every batch, its process id and its engine's
connections opened so far (:func:`with_reader`, the collate function). While every rank's
workers are reading, local rank 0 counts the rings alive on its node (:func:`node_rings`).
OUT gets ``rank{RANK}.json`` (``phase`` in its name): the node (torchrun's ``GROUP_RANK``)
and its network namespace, the keys read, the readers' last reports, the rings, the
state, each worker's exit code, and every rank's samples of epoch 1.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any

import torch.distributed as dist
from torch.utils.data import get_worker_info
from torchdata.stateful_dataloader import StatefulDataLoader

from asyncstream import ShardStream

RING = "/memfd:asyncstream-"  # a ring's segment in /proc/PID/fd (engine/_segment.py)


def with_reader(batch: list[dict[str, Any]]) -> dict[str, Any]:
    """The collate function: the batch's keys, and its reader's pid and connections."""
    info = get_worker_info()
    assert info is not None, "run with DataLoader workers"
    fetch = info.dataset.stats().get("fetch", {})  # type: ignore[attr-defined]
    opened = sum(store.get("connections_opened", 0) for store in fetch.get("stores", []))
    return {"keys": [s["__key__"] for s in batch], "pid": os.getpid(), "connections": opened}


def node_rings() -> dict[str, int]:
    """The rings alive in this network namespace (this node), by label: their segments'
    sizes, from every process's descriptors (a reader's and its engine's: one ring)."""
    mine = os.readlink("/proc/self/ns/net")
    rings: dict[str, int] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/ns/net") != mine:
                continue
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith(RING):
                    label = target.removeprefix("/memfd:").removesuffix(" (deleted)")
                    rings[label] = os.stat(f"/proc/{pid}/fd/{fd}").st_size
        except OSError:  # gone meanwhile
            continue
    return rings


def read(loader: StatefulDataLoader, batches: int | None) -> tuple[list[str], dict[str, int], Any]:
    """``batches`` batches (all: None): keys, each reader's last connections, and the
    iterator (its workers still up until it is shut down)."""
    it = iter(loader)
    keys: list[str] = []
    readers: dict[str, int] = {}
    for n, batch in enumerate(it):
        keys.extend(batch["keys"])
        readers[str(batch["pid"])] = batch["connections"]
        if batches is not None and n + 1 == batches:
            break
    return keys, readers, it


def exit_codes(it: Any) -> list[int | None]:
    """Shut the iterator's workers down; their exit codes (torch's iterator keeps them)."""
    it._shutdown_workers()
    return [w.exitcode for w in it._workers]


def load(path: str) -> Any:
    with open(path) as f:
        return json.load(f)


def main(spec_path: str, out: str) -> None:
    spec = load(spec_path)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    report: dict[str, Any] = {
        "rank": rank,
        "node": int(os.environ["GROUP_RANK"]),
        "netns": os.readlink("/proc/self/ns/net"),
    }
    stream = ShardStream(spec["url"], **spec["stream"])  # rank and world: torch.distributed
    workers = spec["workers"]
    report["node_ring_bytes"] = stream.node_ring_bytes(workers)
    loader = StatefulDataLoader(
        stream, batch_size=spec["batch"], num_workers=workers, collate_fn=with_reader
    )
    codes: list[int | None] = []
    if spec["phase"] == "save":
        stream.set_epoch(0)
        report["epoch0"], report["readers0"], it = read(loader, None)
        codes += exit_codes(it)
        dist.barrier()
        if rank == 0:
            # a 404: the line in the store's log is what counts
            with contextlib.suppress(urllib.error.HTTPError):
                urllib.request.urlopen(spec["mark"], timeout=30).close()
        dist.barrier()
        stream.set_epoch(1)
        keys, _, it = read(loader, spec["batches"][rank])
        report["state"] = loader.state_dict()
    else:
        old = [load(f"{out}/save{r}.json") for r in range(spec["old_world"])]
        stream.load_state_dict([o["state"] for o in old])  # every old rank's state
        keys, _, it = read(loader, 1)  # the rest once the rings are counted
    dist.barrier()  # every rank's workers are up and reading: count this node's rings
    if int(os.environ["LOCAL_RANK"]) == 0:
        report["rings"] = node_rings()
    dist.barrier()
    if spec["phase"] == "resume":
        keys.extend(k for batch in it for k in batch["keys"])
    codes += exit_codes(it)
    report["epoch1"], report["worker_exit_codes"] = keys, codes
    samples: list[Any] = [None] * world
    dist.all_gather_object(samples, len(keys))
    report["samples"] = samples  # every rank's samples of epoch 1 in this phase
    stream.close()
    with open(f"{out}/{spec['phase']}{rank}.json", "w") as f:
        json.dump(report, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
