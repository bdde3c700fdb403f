"""Chaos soak: epoch after epoch through the fault proxy, exactly once, with no growth.

Eleven epochs (one warm-up, then ten) of a :class:`~asyncstream.ShardStream` read through
a :class:`~asyncstream.testing.FaultProxy` in front of the real S3 server. A seeded
:class:`~asyncstream.testing.FaultPlan` gives about one shard GET in six a fault (503
SlowDown, 500, a TCP reset or a clean close mid-body, a stall longer than the engine's
stall timeout, a latency spike) and every epoch starts with a burst of consecutive 503s.
Chunks of 4 KB make for well over a hundred requests per epoch.

Every epoch must emit each sample exactly once, with its bytes intact, and the faults
must really have happened (retries counted). Between the first measured epoch and the
tenth, nothing may grow: RSS of the consumer and of the engine process (within a few
percent), the ring (one memfd segment of a fixed size, never more in use), open
descriptors and threads of both, and the engine's live asyncio tasks (its ``tasks``
statistic); its ``inflight`` count must return to zero after every epoch.

The consumer runs in a process of its own (``tests/_soak_child.py``), so that what is
measured is the consumer alone: this process also hosts the S3 server and the proxy,
whose threads, sockets and memory come and go with the traffic.
"""

from __future__ import annotations

import hashlib
import io
import json
import random
import subprocess
import sys
import tarfile
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from _procs import alive, segments
from PIL import Image

from asyncstream import LocalS3, pack
from asyncstream.testing import FaultPlan, FaultProxy

CHILD = Path(__file__).with_name("_soak_child.py")
EPOCHS = 11  # epoch 0 warms up (pools, lazily started threads); 1 to 10 are compared
BASELINE, FINAL = 1, 10
BURST = 6  # consecutive 503 SlowDown at the start of every epoch
MEMORY_TOLERANCE = 0.03  # RSS at epoch 10 within 3 % of epoch 1
INFLIGHT = 4
PLAN = FaultPlan(
    slowdown=0.04,
    internal_error=0.02,
    reset=0.03,
    truncate=0.03,
    stall=0.02,
    latency=0.03,
    latency_seconds=0.05,  # a spike: loopback answers in about a millisecond
    stall_seconds=3.0,  # far past the stall timeout below
    match=".tar",
)
SETTINGS: dict[str, Any] = {
    "retry": {"max_attempts": 20, "base_delay": 0.002, "max_delay": 0.02, "deadline": 60.0},
    "timeouts": {"connect": 5.0, "first_byte": 2.0, "stall": 0.25, "chunk": 20.0},
    "stream": {"chunk_bytes": 4096, "window": 4, "inflight": INFLIGHT, "seed": 0},
    "deadline_s": 150.0,  # the child prints its stacks and exits after this
}
PLAN_KINDS = ("slowdown", "internal_error", "reset", "truncate", "stall", "latency")


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


@pytest.fixture(scope="module")
def dataset(s3_server: LocalS3, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """120 samples of PNGs of noise, 100 B to 6 KB, in shards of at most 24 KB.

    Returns the URL and, read back with :mod:`tarfile` straight from the server, the
    digest of every member of every sample.
    """
    root = tmp_path_factory.mktemp("chaos")
    rng = random.Random(1)
    for i in range(120):
        folder = root / f"c{i % 5}"
        folder.mkdir(parents=True, exist_ok=True)
        size = rng.choice([100, 600, 1500, 3000, 6000])
        side = max(1, int(((size - 70) / 3) ** 0.5))  # a PNG of noise: ~3 bytes a pixel
        noise = Image.frombytes("RGB", (side, side), rng.randbytes(3 * side * side))
        noise.save(folder / f"img{i:04d}.png")  # pack decodes every image: a real one
    client = s3_server.client()
    client.create_bucket(Bucket="chaos-soak")
    url = "s3://chaos-soak/train/"
    result = pack(root, url, shard_bytes=24_000, shuffle_seed=3, options=s3_server.options())
    expected: dict[str, dict[str, str]] = {}
    for shard in result.shards:
        body = client.get_object(Bucket="chaos-soak", Key=shard.url.split("/", 3)[3])["Body"]
        with tarfile.open(fileobj=io.BytesIO(body.read())) as tar:
            for member in tar.getmembers():
                key, _, ext = member.name.partition(".")
                data = tar.extractfile(member)
                assert data is not None
                expected.setdefault(key, {})[ext] = digest(data.read())
    assert len(expected) == 120
    return {"url": url, "expected": expected}


def within(final: float, baseline: float, tolerance: float) -> bool:
    return abs(final - baseline) <= tolerance * baseline


@pytest.mark.timeout(240)
def test_ten_epochs_through_chaos(s3_server: LocalS3, dataset: dict[str, Any]) -> None:
    reports: list[dict[str, Any]] = []
    injected: list[dict[str, int]] = []
    with (
        FaultProxy(s3_server.endpoint_url, faults=PLAN, seed=3) as proxy,
        tempfile.TemporaryFile("w+") as stderr,
    ):
        settings = {**SETTINGS, "url": dataset["url"], "endpoint_url": proxy.endpoint_url}
        with subprocess.Popen(
            [sys.executable, str(CHILD), json.dumps(settings)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        ) as child:
            assert child.stdin is not None
            assert child.stdout is not None
            try:
                before = proxy.stats()
                for _ in range(EPOCHS):
                    proxy.inject("slowdown", count=BURST, match=".tar")
                    child.stdin.write("go\n")
                    child.stdin.flush()
                    line = child.stdout.readline()  # bounded by the child's deadline
                    if not line:
                        stderr.seek(0)
                        pytest.fail(f"the consumer died:\n{stderr.read()[-5000:]}")
                    reports.append(json.loads(line))
                    assert proxy.pending() == 0  # the burst was consumed in that epoch
                    after = proxy.stats()
                    injected.append({k: after[k] - before[k] for k in after})
                    before = after
                child.stdin.close()
                closed = json.loads(child.stdout.readline())["closed"]
                returncode = child.wait(timeout=30)
            finally:
                if child.poll() is None:
                    child.kill()
            stderr.seek(0)
            errors = stderr.read()
    assert returncode == 0, errors

    # Every epoch: exactly once, bytes intact, faults really met and retried.
    expected = dataset["expected"]
    retries_before = 0
    for epoch, (report, faults) in enumerate(zip(reports, injected, strict=True)):
        samples = report["samples"]
        assert Counter(key for key, _ in samples) == Counter(expected.keys()), f"epoch {epoch}"
        assert all(expected[key] == members for key, members in samples), f"epoch {epoch}"
        fetch = report["stats"]["fetch"]
        assert fetch["inflight"] == 0, f"epoch {epoch}: downloads still running"
        assert fetch["retries_total"] > retries_before, f"epoch {epoch}: no retry"
        retries_before = fetch["retries_total"]
        assert faults["slowdown"] >= BURST, f"epoch {epoch}"
        assert sum(faults[k] for k in PLAN_KINDS if k != "slowdown") > 0, f"epoch {epoch}"
    orders = [[key for key, _ in r["samples"]] for r in reports]
    assert len({tuple(order) for order in orders}) == EPOCHS  # a new order every epoch

    # Over the soak: every kind of fault happened, and the engine met each kind.
    total = {kind: sum(f[kind] for f in injected) for kind in PLAN_KINDS}
    assert all(total.values()), total
    retries = reports[-1]["stats"]["fetch"]["retries"]
    for cause in ("slowdown", "server_error", "truncated", "stall"):
        assert retries.get(cause, 0) > 0, (cause, retries)

    # One engine process, kept from epoch to epoch; one ring, of constant size.
    engines = {tuple(r["engines"]) for r in reports}
    assert len(engines) == 1, engines
    ((engine_pid,),) = engines
    ring = reports[0]["shm"]
    assert ring["segments"] == 1
    for epoch, report in enumerate(reports):
        assert report["shm"]["segments"] == 1, f"epoch {epoch}"
        assert report["shm"]["size"] == ring["size"], f"epoch {epoch}: the ring was resized"
        assert report["shm"]["used"] <= ring["size"], f"epoch {epoch}"

    # No growth from the first measured epoch to the tenth.
    base, final = reports[BASELINE], reports[FINAL]
    assert within(final["rss_kb"], base["rss_kb"], MEMORY_TOLERANCE), (
        f"consumer RSS {base['rss_kb']} -> {final['rss_kb']} kB"
    )
    assert within(final["engine"]["rss_kb"], base["engine"]["rss_kb"], MEMORY_TOLERANCE), (
        f"engine RSS {base['engine']['rss_kb']} -> {final['engine']['rss_kb']} kB"
    )
    for epoch in range(BASELINE, EPOCHS):
        report = reports[epoch]
        # Consumer: exactly the same descriptors (the engine's pipe, the ring's...) and
        # threads after every epoch.
        assert report["fds"] == base["fds"], f"epoch {epoch}: consumer fds"
        assert report["threads"] == base["threads"], f"epoch {epoch}"
        assert report["thread_names"] == base["thread_names"], f"epoch {epoch}"
        assert report["os_threads"] == base["os_threads"], f"epoch {epoch}"
        # Engine: the same non-socket descriptors; sockets are its connection pool, which
        # opens and closes connections as faults cut them, never beyond its size.
        engine = report["engine"]
        assert engine["fds"]["other"] == base["engine"]["fds"]["other"], f"epoch {epoch}"
        assert engine["fds"]["sockets"] <= 2 * INFLIGHT + 1, f"epoch {epoch}: sockets"
        assert engine["os_threads"] == base["engine"]["os_threads"], f"epoch {epoch}"
        # The engine's live asyncio tasks: no download, hedge or timer left behind.
        tasks = report["stats"]["fetch"]["tasks"]
        assert tasks == base["stats"]["fetch"]["tasks"], f"epoch {epoch}: engine tasks"

    # Closed: the ring is gone at once, the engine process soon after, and the
    # consumer's threads and descriptors are back to what they were.
    assert closed["shm"] == {"segments": 0, "size": 0, "used": 0}
    assert closed["engines"] == [], "the engine process outlived close() by 10 s"
    assert closed["threads"] == base["threads"]
    assert closed["fds"]["sockets"] == 0
    assert not alive(engine_pid)
    assert not segments((f"asyncstream-{child.pid}-",))  # held by no process, named nowhere
