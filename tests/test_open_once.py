"""A job opens its dataset once: under torchrun, rank 0 opens and the other ranks take its
result, so the requests of an open, counted at the web server, do not grow with ranks or
workers; every rank still reads its share, and a failed open fails on every rank alike."""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _torchrun import torchrun

from asyncstream import pack
from asyncstream._exceptions import NotFoundError
from asyncstream.dataset._dataset import DatasetPlan, IndexInfo
from asyncstream.dataset._shared import _raised
from asyncstream.shards._urls import Shard
from asyncstream.testing import ServedRequest, WebServer, generate_imagefolder

SAMPLES, SHARD_SAMPLES = 64, 8
PROBES = 7  # index files an open looks for beside shards named one by one
MARK = "/mark-opened"  # requested once every rank has opened: before it, the opens

# Every rank constructs the stream (the open), then rank 0 asks the server for MARK once
# all have, then each rank reads one epoch through 2 DataLoader workers.
JOB = textwrap.dedent(
    """
    import json, sys, urllib.request, urllib.error
    import torch.distributed as dist
    from asyncstream import ShardLoader, ShardStream

    if __name__ == "__main__":
        urls, base, out = sys.argv[1], sys.argv[2], sys.argv[3]
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        try:
            stream = ShardStream(urls, window=3, inflight=2, seed=1)
        except Exception as exc:
            stream, error = None, [type(exc).__name__, str(exc)]
        else:
            error = None
        dist.barrier()
        if rank == 0:
            try:
                urllib.request.urlopen(base + "MARK").close()
            except urllib.error.HTTPError:
                pass
        dist.barrier()
        keys = []
        if stream is not None:
            loader = ShardLoader(stream, batch_size=4, num_workers=2, collate_fn=lambda b: b)
            keys = [sample["__key__"] for batch in loader for sample in batch]
        with open(f"{out}/rank{rank}.json", "w") as f:
            json.dump({"keys": keys, "error": error}, f)
        dist.destroy_process_group()
    """
).replace("MARK", MARK)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[WebServer, Path]]:
    root = tmp_path_factory.mktemp("open-once")
    generate_imagefolder(root / "images", SAMPLES, 4, seed=0, workers=1)
    pack(root / "images", str(root / "ds"), shard_samples=SHARD_SAMPLES, shard_bytes=None)
    script = root / "job.py"
    script.write_text(JOB)
    with WebServer(root) as web:
        yield web, root


def _run(
    web: WebServer, root: Path, urls: str, nproc: int
) -> tuple[list[ServedRequest], list[ServedRequest], list[dict[str, Any]]]:
    """The requests before the mark (the opens), those after it (the reading), and what
    each rank wrote."""
    out = root / f"out{nproc}"
    out.mkdir(exist_ok=True)
    web.clear()
    result = torchrun(root / "job.py", urls, web.url, str(out), nproc=nproc, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    log = web.requests()
    marks = [i for i, r in enumerate(log) if r.path == MARK]
    assert len(marks) == 1
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]
    return log[: marks[0]], log[marks[0] + 1 :], ranks


def _kinds(requests: list[ServedRequest]) -> Counter[tuple[str, str]]:
    return Counter((r.method, r.path) for r in requests)


@pytest.mark.slow
def test_the_open_makes_the_same_requests_with_1_rank_and_4_ranks_of_2_workers(
    served: tuple[WebServer, Path],
) -> None:
    web, root = served
    shards = SAMPLES // SHARD_SAMPLES
    urls = f"{web.url}/ds/shard-{{000000..{shards - 1:06d}}}.tar"
    one, read_one, ranks_one = _run(web, root, urls, 1)
    four, read_four, ranks_four = _run(web, root, urls, 4)
    # The open: a HEAD per shard, and the index files probed beside each (in parallel:
    # those after the manifest found may be cancelled unsent, so their number varies from
    # one open to the next, even in one process). 4 ranks opening alone would make 4 times
    # the HEADs and manifest reads; once per job, they are the 1-rank job's.
    deterministic = {("HEAD", f"/ds/shard-{i:06d}.tar") for i in range(shards)}
    deterministic |= {("GET", "/ds/asyncstream.json"), ("GET", "/ds/classes.json")}
    kinds_one, kinds_four = _kinds(one), _kinds(four)
    assert sum(1 for r in one if r.method == "HEAD") == shards
    assert kinds_one[("GET", "/ds/asyncstream.json")] >= 1
    for kind in deterministic:
        assert kinds_four[kind] == kinds_one[kind], kind
    assert all(n <= shards for (_, path), n in kinds_four.items() if path.endswith(".json"))
    assert len(four) <= shards * (1 + PROBES)  # at most one open's requests
    print(f"requests of the open: 1 rank {len(one)}, 4 ranks x 2 workers {len(four)}")
    # Reading: ranged GETs of shards only, no worker opens again.
    for log in (read_one, read_four):
        assert {(r.method, r.path.rsplit(".", 1)[-1]) for r in log} == {("GET", "tar")}
    everything = {f"{i:06d}" for i in range(SAMPLES)}
    assert sorted(ranks_one[0]["keys"]) == sorted(everything)
    keys = [list(r["keys"]) for r in ranks_four]
    assert sorted(k for part in keys for k in part) == sorted(everything)  # each once
    assert all(len(part) == SAMPLES // 4 for part in keys)


@pytest.mark.slow
def test_a_failed_open_raises_the_same_error_on_every_rank(
    served: tuple[WebServer, Path],
) -> None:
    web, root = served
    urls = f"{web.url}/nowhere/shard-000000.tar"
    one, _, ranks_one = _run(web, root, urls, 1)
    four, _, ranks_four = _run(web, root, urls, 4)
    # One HEAD, rank 0's: 4 ranks opening alone would make 4
    assert len(one) == len(four) == 1
    assert {r.method for r in one + four} == {"HEAD"}
    print(f"requests of the failed open: 1 rank {len(one)}, 4 ranks x 2 workers {len(four)}")
    kind, message = ranks_one[0]["error"]
    assert kind == "NotFoundError"
    errors = [r["error"] for r in ranks_four]
    assert errors[0] == [kind, message]
    for other in errors[1:]:
        assert other[0] == kind
        assert other[1].startswith(message)
        assert "rank 0" in other[1]


def _plan() -> DatasetPlan:
    shards = [Shard("https://h/a.tar", 1024, '"e1"'), Shard("https://h/b.tar", 2048, None)]
    info = IndexInfo(indexes=(("asyncstream", "https://h/asyncstream.json"),), stale=1)
    return DatasetPlan(shards, {"https://h/a.tar": 3}, [1], info, "https://h/", frozenset({"x"}))


def test_a_plan_crosses_as_json_and_back_unchanged() -> None:
    plan = _plan()
    back = DatasetPlan.from_data(json.loads(json.dumps(plan.as_data())))
    assert back == plan


@pytest.mark.parametrize(
    "change",
    [
        {"counts": {"https://elsewhere/c.tar": 3}},  # a shard not in the plan
        {"uncovered": [7]},
        {"shards": [["https://h/a.tar", -1, None]]},
        {"shards": [["https://h/a.tar", True, None]]},
        {"hint": 5},
        {"withheld": [["x"]]},
    ],
)
def test_a_plan_that_does_not_hold_together_is_refused(change: dict[str, object]) -> None:
    data = {**_plan().as_data(), **change}
    with pytest.raises((TypeError, ValueError)):
        DatasetPlan.from_data(json.loads(json.dumps(data)))


def test_an_error_is_made_again_with_its_type_and_url() -> None:
    sent = {"type": "NotFoundError", "message": "gone", "url": "https://h/a.tar", "offset": None}
    error = _raised(sent)
    assert isinstance(error, NotFoundError)
    assert error.url == "https://h/a.tar"
    assert str(error).startswith("gone")
    unknown = _raised({"type": "SystemExit", "message": "no", "url": None})
    assert type(unknown).__name__ == "AsyncStreamError"
