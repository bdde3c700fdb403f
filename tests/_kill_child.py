"""One row of the kill and interrupt matrix (tests/test_kill_matrix.py), in a fresh process.

Usage::

    python tests/_kill_child.py '<json settings>'

``settings["row"]`` names the scenario. Every scenario acts at a fixed sample
(``settings["at"]``), so the same thing happens on every run. The process reports what it
saw as JSON lines on stdout, one object per line with an ``"event"`` key:

* ``pids``: the processes it knows of (itself, its engine, its DataLoader workers);
* ``raised``: the exception that reached user code (type, message, seconds it took);
* ``after``: what is left once that exception has propagated (segments, live engines);
* ``resumed``, ``epoch``: data of the rows that go on after the failure;
* ``done``: the row ended without dying.

The test process checks, once this process is gone, that nothing of it survives: no
process carrying its ``ASYNCSTREAM_KILL_TOKEN`` environment variable and no ring labelled
after one of the pids it reported, held by any process or named in /dev/shm. Hangs are
bounded: the whole row by ``settings["deadline_s"]``, the interpreter's exit by
``settings["exit_s"]`` (the faulthandler then prints every thread's stack and exits with
status 1).
"""

from __future__ import annotations

import faulthandler
import gc
import json
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from _procs import engine_pids
from _procs import segments as held_segments
from torch.utils.data import DataLoader

from asyncstream import EngineError, ShardStream
from asyncstream.engine._ring import Ring

_KEEP: list[Any] = []  # module globals that outlive the row, as in a script


class UserBug(Exception):
    """What the user's training loop raises in the ``user_raises`` rows."""


def emit(event: str, **fields: Any) -> None:
    """One report line on stdout."""
    print(json.dumps({"event": event, **fields}), flush=True)


def worker_pids() -> list[int]:
    """This process's live multiprocessing children: its DataLoader workers."""
    return sorted(p.pid for p in multiprocessing.active_children() if p.pid is not None)


def segments(pids: list[int], *, here: bool = True) -> list[str]:
    """Rings created by any of these processes that one of them still holds (a ring has
    no name: one nobody holds is gone) or that are named in /dev/shm; ``here=False``:
    held by another process than this one."""
    gc.collect()  # a ring's last views in reference cycles keep it mapped until then
    prefixes = tuple(f"asyncstream-{pid}-" for pid in pids)
    holders = {os.getpid(), *pids} - (set() if here else {os.getpid()})
    return sorted(held_segments(prefixes, holders))


def open_rings() -> int:
    """Rings still open in this process (a closed one may stay mapped a while, by the
    views of its last chunks the stream holds until it moves on or closes)."""
    gc.collect()
    return sum(isinstance(o, Ring) and not o._closed for o in gc.get_objects())


def engines_left(timeout: float) -> list[int]:
    """Engine processes still alive after up to ``timeout`` seconds (a closed engine's
    process exits on its own, reaped by a thread)."""
    deadline = time.monotonic() + timeout
    while (alive := engine_pids()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def report_after(pids: list[int]) -> None:
    """What is left right after the exception reached user code."""
    engines = engines_left(10.0)  # first: an engine process lets go of its ring as it exits
    emit(
        "after",
        segments=segments(pids, here=False),
        open_rings=open_rings(),
        engines=engines,
        workers=worker_pids(),
    )


def raised(exc: BaseException, since: float) -> None:
    emit("raised", type=type(exc).__name__, message=str(exc), seconds=time.monotonic() - since)


def bound_exit(settings: dict[str, Any]) -> None:
    """From here on, the interpreter must be gone within ``exit_s``."""
    faulthandler.dump_traceback_later(settings["exit_s"], exit=True)


def make_stream(settings: dict[str, Any], **kwargs: Any) -> ShardStream:
    base: dict[str, Any] = {
        "url": settings["url"],
        "endpoint_url": settings["endpoint_url"],
        "chunk_bytes": 4096,
        "window": 3,
        "inflight": 3,
        "seed": 1,
    }
    base.update(kwargs)
    url = base.pop("url")
    return ShardStream(url, **base)


def epochs(
    source: Any, stream: ShardStream, before_epoch: Callable[[], None] = lambda: None
) -> Iterator[Any]:
    """Samples of epoch after epoch, forever: a signal always lands mid-iteration.

    ``before_epoch`` runs before each epoch but the first.
    """
    epoch = 0
    while True:
        stream.set_epoch(epoch)
        yield from source
        epoch += 1
        before_epoch()


def started(stream: ShardStream, settings: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The stream's iterator ``settings["at"]`` samples in, once its pids are reported."""
    it = iter(stream)
    for _ in range(settings["at"]):
        next(it)
    (engine,) = engine_pids()
    emit("pids", pids=[os.getpid(), engine], engine=engine, segments=segments([os.getpid()]))
    return it


# -- rows ----------------------------------------------------------------------------


def engine_sigkill(settings: dict[str, Any]) -> None:
    """SIGKILL the engine process mid-epoch; then resume from the state saved before."""
    me = os.getpid()
    with make_stream(settings) as stream:
        it = iter(stream)
        before = [next(it)["__key__"] for _ in range(settings["at"])]
        state = stream.state_dict()
        (engine,) = engine_pids()
        emit("pids", pids=[me, engine], engine=engine)
        os.kill(engine, signal.SIGKILL)
        killed = time.monotonic()
        after_kill = []
        try:
            for sample in it:  # chunks already resident may still be served
                after_kill.append(sample["__key__"])
        except EngineError as exc:
            raised(exc, killed)
        report_after([me])
        stream.load_state_dict(state)  # the way back: the last checkpoint
        rest = [sample["__key__"] for sample in stream]
        emit("resumed", before=before, after_kill=after_kill, rest=rest)
    del it  # the dead iteration's last chunk views keep its ring mapped while it lives
    emit("done", segments=segments([me]))


def consumer_dies(settings: dict[str, Any]) -> None:
    """This process dies of ``settings["signal"]`` mid-epoch, its engine downloading."""
    with make_stream(settings) as stream:
        started(stream, settings)  # the stream holds the run
        os.kill(os.getpid(), getattr(signal, settings["signal"]))
        time.sleep(30)  # the signal ends this process first
    emit("done")


def consumer_stalled(settings: dict[str, Any]) -> None:
    """Blocked on a stalled download when the test kills this process."""
    with make_stream(settings) as stream:
        it = started(stream, settings)
        sys.stdin.readline()  # the test stalls every download from now on
        for _ in it:  # until a chunk that never comes: the test kills us there
            pass
    emit("done")


def worker_sigkill(settings: dict[str, Any]) -> None:
    """SIGKILL one of two DataLoader workers mid-epoch."""
    with make_stream(settings) as stream:
        loader = DataLoader(stream, batch_size=None, num_workers=2)
        it = iter(loader)
        for _ in range(settings["at"]):
            next(it)
        workers = worker_pids()
        victim = workers[0]
        emit("pids", pids=[os.getpid(), *workers], victim=victim)
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        try:
            for _ in it:
                pass
        except RuntimeError as exc:
            raised(exc, killed)
        del it, loader
        gc.collect()
    report_after([os.getpid(), *workers])
    emit("done")


def sigint(settings: dict[str, Any]) -> None:
    """Ctrl-C mid-iteration: SIGINT to this process alone, or to its process group.

    A terminal's Ctrl-C signals the foreground process group: the engine process and the
    DataLoader workers get it too. The signal comes from a timer thread while the main
    thread iterates, as a keyboard's would.

    The rest of the epoch is read slowly, so the signal lands mid-epoch, and no new epoch
    starts until it is sent: with DataLoader workers a new epoch
    forks new workers, and a SIGINT that lands during a fork is lost in CPython (raised
    inside an at-fork callback such as logging's ``_releaseLock``, it is printed as
    "Exception ignored" and dropped; the worker being started may lose its own the same
    way), so the run would just go on. That is CPython's and torch's, not ours; this row
    tests what asyncstream does with a Ctrl-C that arrives.
    """
    me = os.getpid()
    pids = [me]
    since = time.monotonic()
    sent = threading.Event()

    def send() -> None:
        os.killpg(0, signal.SIGINT) if settings["group"] else os.kill(me, signal.SIGINT)
        sent.set()

    def signal_first() -> None:
        if n >= settings["at"]:
            sent.wait(30)
            time.sleep(30)  # the KeyboardInterrupt ends this

    n = 0
    try:
        with make_stream(settings) as stream:
            source: Any = stream
            if settings["workers"]:
                source = DataLoader(stream, batch_size=None, num_workers=settings["workers"])
            for n, _ in enumerate(epochs(source, stream, before_epoch=signal_first)):
                if n == settings["at"]:
                    pids += engine_pids() + worker_pids()
                    emit("pids", pids=pids)
                    threading.Timer(0.2, send).start()
                    since = time.monotonic()
                if n >= settings["at"]:
                    time.sleep(0.02)  # the rest of the epoch lasts well past the signal
    except KeyboardInterrupt as exc:
        raised(exc, since)
        report_after(pids)
        bound_exit(settings)
        raise  # and die of it, as Python does


def user_raises(settings: dict[str, Any]) -> None:
    """User code raises mid-epoch; ``settings["how"]`` picks how the stream is held."""
    at = settings["at"]
    pids = [os.getpid()]

    def fail(n: int, what: str = "sample") -> None:
        pids.extend(engine_pids() + worker_pids())
        emit("pids", pids=pids)
        raise UserBug(f"user code failed at {what} {n}")

    def train_with() -> None:
        with make_stream(settings) as stream:
            for n, _ in enumerate(stream):
                if n == at:
                    fail(n)

    def train_without() -> None:  # no `with`, no close(): the stream dies with the frame
        stream = make_stream(settings)
        for n, _ in enumerate(stream):
            if n == at:
                fail(n)

    def train_loader() -> None:
        with make_stream(settings) as stream:
            for n, _ in enumerate(DataLoader(stream, batch_size=None, num_workers=2)):
                if n == at:
                    fail(n)

    def train_dali() -> None:
        from dali_ops import DALIImageLoader, PipelineSettings

        stream = make_stream(settings, url=settings["images_url"], chunk_bytes=1 << 20)
        pipeline = PipelineSettings(image_size=32, num_threads=1, seed=0)
        with DALIImageLoader(stream, 4, device="cpu", settings=pipeline) as loader:
            for n, _ in enumerate(loader):
                if n == at:
                    fail(n, "batch")

    train: Callable[[], None] = {
        "with": train_with,
        "without": train_without,
        "uncaught": train_without,
        "loader": train_loader,
        "dali": train_dali,
    }[settings["how"]]
    since = time.monotonic()
    if settings["how"] == "uncaught":
        try:
            train()
        except UserBug:
            bound_exit(settings)
            raise  # to the top: the interpreter prints it and exits with status 1
    try:
        train()
    except UserBug as exc:
        raised(exc, since)
    report_after(pids)
    emit("done")


def exit_unclosed(settings: dict[str, Any]) -> None:
    """A script that ends normally, mid-epoch, its stream a global never closed."""
    stream = make_stream(settings)
    it = iter(stream)
    for _ in range(settings["at"]):
        next(it)
    _KEEP.extend([stream, it])
    emit("pids", pids=[os.getpid(), *engine_pids()])
    emit("done")
    bound_exit(settings)


def loader_epochs(settings: dict[str, Any]) -> None:
    """DataLoader epochs after the main process read from the stream itself.

    The main process's read starts its multiprocessing resource tracker, which the
    forked workers then share: a ring a worker leaves behind is only removed when this
    whole process exits.
    """
    with make_stream(settings) as stream:
        next(iter(stream))  # a look at the data in the main process (a sanity check, say)
        for epoch in range(settings["epochs"]):
            stream.set_epoch(epoch)
            workers: list[int] = []
            keys = []
            for sample in DataLoader(stream, batch_size=None, num_workers=2):
                workers = workers or worker_pids()
                keys.append(sample["__key__"])
            # The loader has joined its workers: whatever they created should be gone.
            emit("epoch", epoch=epoch, keys=keys, workers=workers, segments=segments(workers))
    emit("done")


ROWS: dict[str, Callable[[dict[str, Any]], None]] = {
    "engine_sigkill": engine_sigkill,
    "consumer_dies": consumer_dies,
    "consumer_stalled": consumer_stalled,
    "worker_sigkill": worker_sigkill,
    "sigint": sigint,
    "user_raises": user_raises,
    "exit_unclosed": exit_unclosed,
    "loader_epochs": loader_epochs,
}


if __name__ == "__main__":
    # As a terminal's Ctrl-C finds it: a test run started in the background by a shell
    # without job control (`make check &`) inherits SIGINT ignored, and Python keeps it so.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    config = json.loads(sys.argv[1])
    faulthandler.dump_traceback_later(config["deadline_s"], exit=True)
    ROWS[config["row"]](config)
