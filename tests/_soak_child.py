"""The consumer of the chaos soak (tests/test_chaos.py), run in a process of its own.

A process of its own so that what it measures is the consumer alone: the test process
also hosts the S3 server and the fault proxy, whose threads, sockets and memory come and
go with the traffic. Usage::

    python tests/_soak_child.py '<json settings>'

It reads one epoch of a :class:`~asyncstream.ShardStream` for each line it reads on
stdin (the test injects a burst of faults first), and prints one JSON line per epoch:
the samples (key and digest of every member), the stream's statistics, and resource
counts of this process and of its engine process. At the end of stdin it closes the
stream and prints the resource counts once more.
"""

from __future__ import annotations

import faulthandler
import gc
import hashlib
import json
import os
import sys
import threading
import time
from typing import Any

from _procs import engine_pids, segment_usage

from asyncstream import RetryPolicy, ShardStream, Timeouts


def digest(data: bytes) -> str:
    """A short digest of a member's bytes."""
    return hashlib.sha256(data).hexdigest()[:16]


def proc_status(pid: int | str, field: str) -> int:
    """One numeric field of ``/proc/<pid>/status`` (``VmRSS`` in kB, ``Threads``...)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name == field:
                return int(value.split()[0])
    raise KeyError(field)


def fds(pid: int | str) -> dict[str, int]:
    """Open descriptors of a process, sockets apart from everything else."""
    sockets = other = 0
    path = f"/proc/{pid}/fd"
    for name in os.listdir(path):
        try:
            target = os.readlink(f"{path}/{name}")
        except FileNotFoundError:  # closed while we looked (listdir's own fd)
            continue
        if target.startswith("socket:"):
            sockets += 1
        else:
            other += 1
    return {"sockets": sockets, "other": other}


def shm_bytes() -> dict[str, int]:
    """This process's rings (memfds it holds a descriptor of): count, size, and bytes in
    use.

    tmpfs allocates a page when it is first written, so the bytes in use may rise up to
    the size as slots see their first chunk; the size is fixed when the ring is made.
    """
    return segment_usage(f"asyncstream-{os.getpid()}-")


def measure() -> dict[str, Any]:
    """Resources of this process and of its engine process, right now."""
    gc.collect()
    engines = engine_pids()
    out: dict[str, Any] = {
        "rss_kb": proc_status("self", "VmRSS"),
        "fds": fds("self"),
        "threads": threading.active_count(),
        "thread_names": sorted(t.name for t in threading.enumerate()),
        "os_threads": len(os.listdir("/proc/self/task")),
        "shm": shm_bytes(),
        "engines": engines,
    }
    if len(engines) == 1:
        (pid,) = engines
        out["engine"] = {
            "rss_kb": proc_status(pid, "VmRSS"),
            "fds": fds(pid),
            "os_threads": len(os.listdir(f"/proc/{pid}/task")),
        }
    return out


def main(settings: dict[str, Any]) -> None:
    faulthandler.dump_traceback_later(settings["deadline_s"], exit=True)
    stream = ShardStream(
        settings["url"],
        endpoint_url=settings["endpoint_url"],
        retry=RetryPolicy(**settings["retry"]),
        timeouts=Timeouts(**settings["timeouts"]),
        **settings["stream"],
    )
    with stream:
        for epoch, _ in enumerate(sys.stdin):
            stream.set_epoch(epoch)
            samples = [
                [sample["__key__"], {k: digest(v) for k, v in sample.items() if k[:2] != "__"}]
                for sample in stream
            ]
            report = {"epoch": epoch, "samples": samples, "stats": stream.stats()}
            report.update(measure())
            print(json.dumps(report), flush=True)
    # close() stops the engine and leaves the wait for its exit to a reaper thread,
    # which ends as soon as the process has exited.
    closed = time.monotonic()
    while engine_pids() and time.monotonic() < closed + 10.0:
        time.sleep(0.05)
    exit_s = time.monotonic() - closed
    while threading.active_count() > 1 and time.monotonic() < closed + 10.0:
        time.sleep(0.01)
    print(json.dumps({"closed": {**measure(), "engine_exit_s": exit_s}}), flush=True)
    faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
