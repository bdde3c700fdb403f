"""The kill and interrupt matrix, against the real S3 server through the fault proxy.

Every way a run gets cut short (a killed engine, consumer or DataLoader worker, Ctrl-C,
an exception in user code) must end in a clear error or a clean exit within bounded
time, and leave no process and no ring behind (held by any process, or named in /dev/shm).

Each row runs in a fresh process (``tests/_kill_child.py``), started in a session of its
own so that a Ctrl-C sent to its process group reaches nothing else, with a unique
``ASYNCSTREAM_KILL_TOKEN`` in its environment: every process it starts inherits the
token (the engine process, DataLoader workers, multiprocessing's resource tracker), so
"nothing left" is checked by looking for that token in ``/proc/*/environ``, whoever the
survivors' parent is by then. Rings have no name but are labelled
``asyncstream-<creator pid>-<hex>`` (``/proc/PID/fd`` and ``maps`` show ``/memfd:<label>``,
see ``asyncstream/engine/_ring.py``): one is left while any process holds it; the child
reports the pids that may have created one.

Every row acts at a fixed sample, so the outcome does not depend on timing; time bounds
are generous (seconds where the work takes milliseconds).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from _jpegs import jpeg_of
from _procs import segments

from asyncstream import LocalS3, pack
from asyncstream.testing import FaultPlan, FaultProxy, generate_imagefolder

CHILD = Path(__file__).with_name("_kill_child.py")
N_SAMPLES = 48
AT = 10  # every row acts at this sample (a fifth of the epoch)
ROW_DEADLINE_S = 60.0  # the child prints its stacks and exits after this
EXIT_S = 5.0  # the child's interpreter must exit within this once its work is done
GONE_S = 15.0  # processes and rings of a finished row must be gone within this
LEAK_WARNING = "leaked shared_memory"  # multiprocessing's resource tracker cleaned up


@dataclass
class Data:
    url: str
    images_url: str
    keys: set[str]


@dataclass
class Outcome:
    """What one row did, and what it left behind."""

    returncode: int
    events: dict[str, list[dict[str, Any]]]
    stderr: str
    pids: list[int]
    processes_left: list[str] = field(default_factory=list)
    segments_left: list[str] = field(default_factory=list)

    def event(self, name: str) -> dict[str, Any]:
        """The last event of this name (the row must have reported one)."""
        assert name in self.events, f"no {name!r} event; stderr:\n{self.stderr[-4000:]}"
        return self.events[name][-1]


@pytest.fixture(scope="module")
def data(s3_server: LocalS3, tmp_path_factory: pytest.TempPathFactory) -> Data:
    """48 samples (JPEGs of noise padded to random sizes) in ~10 shards, and 24 small
    photo-like JPEGs in 4 shards."""
    root = tmp_path_factory.mktemp("kill")
    rng = random.Random(1)
    for i in range(N_SAMPLES):
        folder = root / "src" / f"c{i % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"img{i:04d}.jpg").write_bytes(jpeg_of(rng, rng.choice([100, 600, 1500, 3000])))
    generate_imagefolder(root / "images", 24, 3, seed=0, workers=1)
    s3_server.client().create_bucket(Bucket="kill-matrix")
    options = s3_server.options()
    result = pack(
        root / "src", "s3://kill-matrix/train/", shard_bytes=8000, shuffle_seed=3, options=options
    )
    assert len(result.shards) >= 8
    pack(
        root / "images",
        "s3://kill-matrix/images/",
        shard_samples=6,
        shard_bytes=None,
        options=options,
        workers=1,
    )
    keys = {f"{i:06d}" for i in range(N_SAMPLES)}
    return Data("s3://kill-matrix/train/", "s3://kill-matrix/images/", keys)


@pytest.fixture(scope="module")
def proxy(s3_server: LocalS3) -> Iterator[FaultProxy]:
    """Every shard GET answers 10 ms late: downloads are in flight whenever a row acts."""
    plan = FaultPlan(latency=1.0, latency_seconds=0.01, match=".tar")
    with FaultProxy(s3_server.endpoint_url, faults=plan, seed=0) as p:
        yield p


def token_processes(token: str) -> list[str]:
    """Live processes whose environment carries ``token`` (zombies are dead)."""
    marker = f"ASYNCSTREAM_KILL_TOKEN={token}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rpartition(")")[2].split()[0]
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in environ and state != "Z":
            found.append(f"{entry}: {cmdline[:160]}")
    return found


def ring_segments(pids: list[int]) -> list[str]:
    """Rings created by any of these processes that a live process (any) still holds, or
    named in /dev/shm."""
    prefixes = tuple(f"asyncstream-{pid}-" for pid in pids)
    return sorted(segments(prefixes))


def leftovers(token: str, pids: list[int], within: float) -> tuple[list[str], list[str]]:
    """Processes and rings of a finished row still there after up to ``within`` seconds.

    Polls: they are other processes' (an orphaned engine, a resource tracker) and no event
    announces that they are gone.
    """
    deadline = time.monotonic() + within
    while True:
        procs, rings = token_processes(token), ring_segments(pids)
        if not (procs or rings) or time.monotonic() > deadline:
            return procs, rings
        time.sleep(0.05)


_tokens = iter(range(1 << 30))


def run_row(
    data: Data,
    proxy: FaultProxy,
    row: str,
    *,
    on_pids: Callable[[subprocess.Popen[str], dict[str, Any]], None] | None = None,
    **settings: Any,
) -> Outcome:
    """Run one row in a fresh process; return what it reported and what it left.

    Args:
        on_pids: called in this process when the row reports its pids (to act on it).
        settings: the row's settings (see ``tests/_kill_child.py``).
    """
    token = f"{os.getpid()}-{next(_tokens)}-{row}"
    config = {
        "row": row,
        "url": data.url,
        "images_url": data.images_url,
        "endpoint_url": proxy.endpoint_url,
        "at": AT,
        "deadline_s": ROW_DEADLINE_S,
        "exit_s": EXIT_S,
        **settings,
    }
    env = dict(os.environ, ASYNCSTREAM_KILL_TOKEN=token)
    events: dict[str, list[dict[str, Any]]] = {}
    with (
        tempfile.TemporaryFile("w+") as stderr,
        subprocess.Popen(
            [sys.executable, str(CHILD), json.dumps(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
            start_new_session=True,  # its own process group, for the Ctrl-C rows
        ) as proc,
    ):
        # The child has a deadline, but a process it started could keep its stdout open:
        # past this, its whole process group is killed, so the test itself never hangs.
        hung = threading.Event()

        def kill_group() -> None:
            hung.set()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

        killer = threading.Timer(ROW_DEADLINE_S + GONE_S, kill_group)
        killer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:  # ends when the child exits (it has a deadline)
                event = json.loads(line)
                events.setdefault(event.pop("event"), []).append(event)
                if "pids" in event and on_pids is not None:
                    on_pids(proc, event)
            returncode = proc.wait(timeout=ROW_DEADLINE_S)
        finally:
            killer.cancel()
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        assert not hung.is_set(), f"row {row} still running after {ROW_DEADLINE_S + GONE_S} s"
        stderr.seek(0)
        text = stderr.read()
    pids = events["pids"][-1]["pids"] if "pids" in events else [proc.pid]
    outcome = Outcome(returncode, events, text, pids)
    outcome.processes_left, outcome.segments_left = leftovers(token, pids, GONE_S)
    return outcome


def assert_nothing_left(outcome: Outcome) -> None:
    assert not outcome.processes_left, f"processes left: {outcome.processes_left}"
    assert not outcome.segments_left, f"rings left: {outcome.segments_left}"


def assert_clean_in_process(outcome: Outcome) -> None:
    """Right after the exception, in the process itself: engine gone, ring closed (no
    other process holds it; here, the stream's last views may keep it mapped until the
    stream moves on: the ``done`` and ``leftovers`` checks see it gone)."""
    after = outcome.event("after")
    assert after["segments"] == [], "the ring outlived the exception elsewhere"
    assert after["open_rings"] == 0, "the ring is still open after the exception"
    assert after["engines"] == [], "the engine process outlived the exception (10 s)"
    assert after["workers"] == []
    assert LEAK_WARNING not in outcome.stderr  # removed by the stream, not the tracker


# -- (a) the engine dies -------------------------------------------------------------


def test_sigkill_of_the_engine_is_a_clear_error_and_resume_recovers(
    data: Data, proxy: FaultProxy
) -> None:
    outcome = run_row(data, proxy, "engine_sigkill")
    raised = outcome.event("raised")
    assert raised["type"] == "EngineError"
    assert "fetch engine process was killed by signal 9" in raised["message"]
    assert_clean_in_process(outcome)
    resumed = outcome.event("resumed")
    assert len(resumed["after_kill"]) < N_SAMPLES - AT  # the error came mid-epoch
    # The state saved before the kill resumes in a fresh engine: every sample once.
    assert Counter(resumed["before"] + resumed["rest"]) == Counter(data.keys)
    assert outcome.event("done")["segments"] == []
    assert outcome.returncode == 0, outcome.stderr
    assert_nothing_left(outcome)


# -- (b) the consumer dies -----------------------------------------------------------


@pytest.mark.parametrize("signame", ["SIGKILL", "SIGTERM"])
def test_killed_consumer_takes_its_engine_and_ring_along(
    data: Data, proxy: FaultProxy, signame: str
) -> None:
    outcome = run_row(data, proxy, "consumer_dies", signal=signame)
    pids = outcome.event("pids")
    assert len(pids["segments"]) == 1  # the ring existed while it ran
    assert outcome.returncode == -getattr(signal, signame)
    assert_nothing_left(outcome)  # the engine exited by itself, the ring was removed


def test_consumer_killed_while_the_engine_is_stuck_in_a_stalled_download(
    data: Data, proxy: FaultProxy
) -> None:
    def stall_then_kill(proc: subprocess.Popen[str], event: dict[str, Any]) -> None:
        stalls = proxy.stats()["stall"]
        proxy.inject("stall", count=1000, match=".tar")  # one hour each
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        deadline = time.monotonic() + 20
        while proxy.stats()["stall"] == stalls:  # until a download is stuck
            assert time.monotonic() < deadline, "no download stalled"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)

    try:
        outcome = run_row(data, proxy, "consumer_stalled", on_pids=stall_then_kill)
    finally:
        proxy.clear()
    assert outcome.returncode == -signal.SIGKILL
    assert len(outcome.event("pids")["segments"]) == 1
    # Every retry of the stuck download stalls too: only the consumer's death (end of
    # file on the engine's pipe) can end the engine.
    assert_nothing_left(outcome)


# -- (c) a DataLoader worker dies ----------------------------------------------------


def test_sigkill_of_a_dataloader_worker(data: Data, proxy: FaultProxy) -> None:
    outcome = run_row(data, proxy, "worker_sigkill")
    victim = outcome.event("pids")["victim"]
    raised = outcome.event("raised")
    assert raised["type"] == "RuntimeError"
    assert "DataLoader worker" in raised["message"]
    assert str(victim) in raised["message"]
    assert outcome.event("after")["workers"] == []
    assert outcome.returncode == 0, outcome.stderr
    assert_nothing_left(outcome)


# -- (d) Ctrl-C ----------------------------------------------------------------------

CTRL_C: dict[str, dict[str, Any]] = {
    "consumer": {"group": False, "workers": 0},  # kill -INT <pid>
    "group": {"group": True, "workers": 0},  # a terminal's Ctrl-C: the engine gets it too
    "group-workers": {"group": True, "workers": 2},  # ... and so do DataLoader workers
}
_ctrl_c_outcomes: dict[str, Outcome] = {}


def ctrl_c(data: Data, proxy: FaultProxy, case: str) -> Outcome:
    if case not in _ctrl_c_outcomes:
        _ctrl_c_outcomes[case] = run_row(data, proxy, "sigint", **CTRL_C[case])
    return _ctrl_c_outcomes[case]


@pytest.mark.parametrize("case", list(CTRL_C))
def test_ctrl_c_during_iteration(data: Data, proxy: FaultProxy, case: str) -> None:
    outcome = ctrl_c(data, proxy, case)
    raised = outcome.event("raised")
    assert raised["type"] == "KeyboardInterrupt"
    assert "\nKeyboardInterrupt\n" in outcome.stderr  # the traceback of the interrupt
    assert outcome.returncode == -signal.SIGINT  # Python's exit by an unhandled Ctrl-C
    assert "Timeout (" not in outcome.stderr  # exited within EXIT_S
    if not CTRL_C[case]["workers"]:  # workers' rings: see the test of loader epochs
        assert_clean_in_process(outcome)
    assert_nothing_left(outcome)


def test_ctrl_c_prints_one_traceback(data: Data, proxy: FaultProxy) -> None:
    outcome = ctrl_c(data, proxy, "group")
    assert outcome.stderr.count("Traceback (most recent call last)") == 1, outcome.stderr


# -- (e), (f) user code raises -------------------------------------------------------


@pytest.mark.parametrize("how", ["with", "without", "loader", "dali"])
def test_user_exception_mid_epoch(data: Data, proxy: FaultProxy, how: str) -> None:
    at = 1 if how == "dali" else AT  # DALI: batch 1, after a whole first batch
    outcome = run_row(data, proxy, "user_raises", how=how, at=at)
    raised = outcome.event("raised")
    assert raised["type"] == "UserBug"
    assert f"failed at {'batch' if how == 'dali' else 'sample'} {at}" in raised["message"]
    if how != "loader":  # workers' rings: see the test of loader epochs
        assert_clean_in_process(outcome)
    assert "done" in outcome.events
    assert outcome.returncode == 0, outcome.stderr
    assert "Timeout (" not in outcome.stderr
    assert_nothing_left(outcome)


@pytest.mark.parametrize(
    ("row", "how", "returncode"),
    [("user_raises", "uncaught", 1), ("exit_unclosed", None, 0)],
    ids=["uncaught-exception", "normal-exit"],
)
def test_script_exits_with_an_unclosed_stream(
    data: Data, proxy: FaultProxy, row: str, how: str | None, returncode: int
) -> None:
    outcome = run_row(data, proxy, row, how=how)
    assert "Timeout (" not in outcome.stderr, f"hung at exit:\n{outcome.stderr[-3000:]}"
    assert outcome.returncode == returncode, outcome.stderr
    if how == "uncaught":
        assert outcome.stderr.rstrip().endswith("UserBug: user code failed at sample 10")
    assert LEAK_WARNING not in outcome.stderr
    assert_nothing_left(outcome)


def test_dataloader_workers_remove_their_rings(data: Data, proxy: FaultProxy) -> None:
    outcome = run_row(data, proxy, "loader_epochs", epochs=2)
    assert outcome.returncode == 0, outcome.stderr
    epochs = outcome.events.get("epoch", [])
    assert [e["epoch"] for e in epochs] == [0, 1]
    for report in epochs:
        assert Counter(report["keys"]) == Counter(data.keys)
        assert len(report["workers"]) == 2
    assert_nothing_left(outcome)  # at the latest once the whole process has exited
    # The bug: each epoch's workers leave their rings behind until the process exits.
    for report in epochs:
        assert report["segments"] == [], f"epoch {report['epoch']}: rings of gone workers"
    assert LEAK_WARNING not in outcome.stderr
