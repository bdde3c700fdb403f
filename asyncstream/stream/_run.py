"""One epoch of one reader: the stages of a stream, driven together.

An :class:`EpochRun` chains small stages, in the manner of ``torchdata.nodes``, each of
which can be changed alone:

1. **plan source** (:mod:`._plansource`): where the reader starts (a fresh epoch's
   share, a saved position, or a share of what several saved readers left) and the
   pieces it reads, handed out in order;
2. **chunk reader** (:mod:`._lanes`): each open piece read chunk by chunk out of the
   shared-memory ring that the fetch engine (:mod:`._engine`) fills, indexed in place;
3. **prefetch** (:mod:`._prefetch`): which chunks to ask for ahead of need;
4. **window shuffle** (:mod:`._shuffle`): which sample comes next;
5. **emit** (:mod:`._emit`): each sample copied out of the ring into ``bytes``, so what
   user code holds never changes under it; a chunk's slot goes back to the engine as
   soon as its lane moves on.

Each stage owns its state (``state()`` / ``reset(state)``, plain data); one object,
:class:`~._checkpoint.Checkpoint`, builds the reader's :class:`~._state.ReaderState` from
them (:meth:`EpochRun.state`) and splits a saved one back into them; a run started from
one (``Start.position``) continues exactly where it was.

Prefetch memory: up to ``prefetch`` chunks are requested ahead; the ring has ``window +
prefetch`` slots (plus the engine's hedge slot): ``window`` for the lanes' resident
chunks, ``prefetch`` for chunks downloading or downloaded and waiting for their lane.
``prefetch`` defaults to twice ``inflight``: lanes empty in random order, so some
prefetched chunks always wait READY for their lane, and with only ``inflight`` slots for
them fewer than ``inflight`` downloads would run (measured under the S3-like profile: 6.4
of 8 on average, against 7.9 of 8 with twice the slots). Under ``prefetch="auto"`` (the
default of ``inflight="auto"``, itself the default) the ring is sized for twice the most
downloads within the 128 MiB budget (``StreamSettings.default_prefetch``) and the chunks
asked ahead are twice the engine's
concurrency of the moment (each ``ChunkReady`` says it), so the slots beyond are never
touched while the engine runs fewer; which chunks are asked ahead never changes the order.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator
from typing import Any, Literal

from .._exceptions import AsyncStreamError, StateError
from ..engine._engine import Engine
from ..engine._launch import EngineProcess
from ..order._mix import Blend
from ..order._plan import Piece, Topology
from ..order._shuffle import Lane, Need, WindowShuffle, mix_key
from ..shards._tarfast import native_deliver
from ._checkpoint import Checkpoint, StageStates, StateSnapshot
from ._emit import Emit
from ._lanes import ChunkReader, Item, LaneReader, Places
from ._plansource import PlanSource
from ._prefetch import soonest
from ._settings import StreamSettings
from ._state import BASE, Position, ReaderState, Start

__all__ = ["EpochRun", "RecordSink", "default_topology", "worker_topology"]

RUN = 64
"""The most samples :meth:`EpochRun.__next__` draws and builds at once: its runs grow 1, 2,
4 .. ``RUN``, so that a consumer that stops early has paid for few samples it never got."""

RecordSink = Callable[[memoryview, str, tuple[Any, ...]], bool]
"""What :meth:`EpochRun.take` hands each sample to: ``sink(view, url, record)``."""


def _blend(settings: StreamSettings, pieces: list[Piece], groups: list[int]) -> Blend | None:
    """A mixed stream reader's blend, over the samples its pieces hold of each source."""
    if not settings.sources:
        return None
    totals = [0] * len(settings.sources)
    for piece, group in zip(pieces, groups, strict=True):
        totals[group] += piece.count
    return Blend(totals)


def default_topology(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Rank and world size: as given, else torch.distributed, else RANK/WORLD_SIZE, else 0/1."""
    if rank is not None and world_size is not None:
        return rank, world_size
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return (
                dist.get_rank() if rank is None else rank,
                dist.get_world_size() if world_size is None else world_size,
            )
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    env_rank = int(os.environ.get("RANK", "0"))
    env_world = int(os.environ.get("WORLD_SIZE", "1"))
    return (env_rank if rank is None else rank, env_world if world_size is None else world_size)


def worker_topology(rank: int, world_size: int) -> Topology:
    """The topology of the calling process, DataLoader worker included."""
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    if info is None:
        return Topology(rank, world_size)
    return Topology(rank, world_size, info.id, info.num_workers)


def shuffle_key(seed: int, start: Start, topology: Topology) -> int:
    """The window shuffle's key: the epoch's own for its plan, a fresh one per resume."""
    parts = [seed, start.epoch, topology.rank, topology.worker]
    if start.lineage != BASE:
        parts.append(int(start.lineage[:16], 16))
    return mix_key(*parts)


class EpochRun(Iterator[dict[str, Any]]):
    """One epoch of one reader; iterate it for samples. Close it to stop the engine.

    Args:
        settings: the stream's settings.
        start: where the reader starts (see :mod:`._state`).
        topology: the reader's rank and worker.
        engine: an idle engine of the previous epoch, to reuse.
        launch: an engine process started ahead, for the engine to adopt when there is
            none to reuse (closed if unused).
    """

    def __init__(
        self,
        settings: StreamSettings,
        *,
        start: Start,
        topology: Topology,
        engine: Engine | None = None,
        launch: EngineProcess | None = None,
    ) -> None:
        if engine is not None and launch is not None:
            launch.close()  # an engine is reused: no process is needed
            launch = None
        self.launch = launch
        self.settings = settings
        self.start = start
        self.epoch = start.epoch
        self.topology = topology
        self.remainder_samples = start.extra
        self.plan = PlanSource(settings, start)
        self.pieces = self.plan.pieces
        self.groups = [settings.source_of(piece.shard) for piece in self.pieces]
        self.blend = _blend(settings, self.pieces, self.groups)
        self.shuffle: WindowShuffle[Item] = WindowShuffle(
            len(self.pieces),
            window=settings.lanes,
            key=shuffle_key(settings.seed, start, topology),
            mode=settings.mode,
            shuffle=settings.shuffle,
            groups=self.groups,
            blend=self.blend,
        )
        self.engine = engine  # an idle engine of the previous epoch, reused
        self.reader = ChunkReader(settings, self.pieces, self._engine)
        self.emit = Emit([source.name for source in settings.sources])
        self.places = Places()  # where each lane's resident samples are, for the draws
        self.checkpoint = Checkpoint(settings, topology)
        self.last_fetch: dict[str, Any] | None = None  # the engine's counters, last asked
        # Set by stats() from another thread: the reader asks the engine at its next chunk.
        self.stats_wanted = False
        self.on_end: Callable[[], None] | None = None  # called once, when the epoch ends
        self.closed = False
        self.primed = False
        # Samples drawn and built by __next__, not yet handed out, last first (pop()): not
        # emitted as far as the state goes (_settle puts them back before it is read).
        self.ready: list[dict[str, Any]] = []
        self._drawn: tuple[list[int], list[Item]] = ([], [])  # the draws ready came of
        self._run_size = 1  # the next run's draws: doubles up to RUN
        self._save_gap: int | None = None  # samples handed out between the last two saves
        self._settled_at = 0  # emit.emitted at the last _settle
        self._restore_pending = start.position
        self._engine()  # boots while the caller sets up (a DALI pipeline, say)

    def _engine(self) -> Engine:
        if self.engine is None:
            s = self.settings
            config = s.engine_config(
                mix_key(s.seed, self.epoch, self.topology.rank, self.topology.worker)
            )
            # DataLoader workers are daemonic and may not start processes.
            mode: Literal["thread", "process"] = (
                "thread" if multiprocessing.current_process().daemon else "process"
            )
            launch, self.launch = self.launch, None
            self.engine = Engine(
                config,
                n_slots=s.lanes + s.prefetch_slots,
                slot_bytes=s.chunk_bytes,
                mode=mode,
                process=launch,
            )
        return self.engine

    # -- stages -------------------------------------------------------------------------

    @staticmethod
    def _lane(lane: Lane[Item]) -> LaneReader:
        reader: LaneReader = lane.meta["reader"]
        return reader

    def _prefetch(self) -> None:
        """Ask for the chunks the prefetch stage ranks soonest, within the budget, once an
        eighth of the budget is free: ranking and asking once a chunk, with 1 MiB chunks
        over 64 lanes, cost more of the consumer's CPU than walking the chunks (the
        requests still waiting are those needed furthest ahead; a chunk needed now and
        not asked for is asked for by the lane that needs it)."""
        budget = self.settings.prefetch_slots
        if self.settings.fetch.auto_prefetch and self.engine is not None:
            budget = max(1, min(budget, 2 * self.engine.limit))
        room = budget - len(self.reader.requested)
        if room < max(1, budget // 8):
            # The chunks released since are told with the next request, or before a wait
            # blocks (Engine.wait). Told here too, they made a message for nearly every
            # chunk with 1 MiB blocks, and the engine, whose ring holds a slot for
            # every chunk asked ahead and every lane, never waits for one of them: it sees
            # a released slot in the ring whenever it looks for one.
            return
        outlook = self.shuffle.outlook(budget)
        wanted = soonest(
            [(remaining, meta["reader"].ahead) for remaining, meta in outlook.lanes],
            [self.reader.piece_ahead(p) for p in outlook.upcoming],
            window=outlook.window,
            budget=budget,
        )
        fresh = [key for key in wanted if key not in self.reader.requested][:room]
        self.reader.request(fresh)  # with the chunks released since
        self.reader.flush()  # (if nothing was fresh)

    def _release(self, lane: Lane[Item]) -> None:
        if self.engine is not None:
            self.reader.close(self._lane(lane))

    # -- iteration ----------------------------------------------------------------------

    def __iter__(self) -> EpochRun:
        return self

    def __next__(self) -> dict[str, Any]:
        ready = self.ready
        if ready:
            return ready.pop()
        if self.closed:
            raise StopIteration
        try:
            return self._draw_run()
        except StopIteration:
            self.closed = True  # the engine is idle again: finish() hands it back
            self._ended()
            raise
        except BaseException as exc:
            self._fail(exc)
            raise

    def _draw_run(self) -> dict[str, Any]:
        """Draw a run of samples (:meth:`WindowShuffle.draw_many`, after whatever the
        shuffle needs first, priming the run before its first draw), build their dicts,
        return the first and keep the rest in :attr:`ready`. Raises StopIteration at the
        end."""
        if not self.primed:
            self._prime()
        shuffle = self.shuffle
        need = shuffle.need()
        while need.kind != "draw":
            self._serve(need)
            need = shuffle.need()
        size = self._run_size
        if size < RUN:
            self._run_size = 2 * size
        gap = self._save_gap
        if gap is not None:  # the state is saved every gap samples: draw up to the next save
            since = self.emit.emitted - self._settled_at
            if since < gap:
                size = min(size, gap - since)
            else:
                self._save_gap = None  # saved no longer that often
        indices, samples = shuffle.draw_many(size)
        try:
            built = self.emit.run(shuffle.lanes, self.places.of(shuffle), indices, samples)
        except BaseException:
            shuffle.undraw(indices, samples)  # drawn, not emitted
            raise
        sample = built.pop()
        if built:
            self._drawn = (indices, samples)  # first: stats() from another thread reads both
            self.ready += built
        return sample

    def _settle(self) -> None:
        """Put the drawn samples not yet handed out back into the shuffle, uncounted: the
        run's state is then exactly as if they had never been drawn. The next runs stop
        where the next save is due if saves keep coming as often as the last two came
        (a loader that saves its state every batch then draws no sample it puts back)."""
        ready = self.ready
        if ready:
            n = len(ready)
            indices, samples = self._drawn
            self.shuffle.undraw(indices[-n:], samples[-n:])
            self.emit.unemit(n)
            ready.clear()
            self._drawn = ([], [])
        gap = self.emit.emitted - self._settled_at
        if gap > 0:
            self._save_gap = gap
            self._settled_at = self.emit.emitted

    def take(self, n: int, sink: RecordSink) -> int:
        """Draw up to ``n`` samples as :meth:`__next__` would, handing each to ``sink``
        as ``sink(view, url, record)`` instead of building its dict: ``record`` is
        ``(key, header offset, *fields)``, each field ``(extension, start, stop,
        owned)``, the member's bytes being ``owned`` if not ``None``, else
        ``view[start:stop]`` (valid only until ``sink`` returns). The samples are counted
        as emitted before ``sink`` sees them, so the state is the same as after as many
        ``next()``. ``sink`` returns whether to go on; it must not raise. Natively the
        loop runs in C (``_tarwalk.deliver``), and a sink that exposes the C sink
        protocol (``__records_sink__``, see ``asyncstream/shards/_records.h``) is handed
        each record of a records table with no Python call.

        Returns:
            The samples drawn: fewer than ``n`` only where ``sink`` stopped or the epoch
            ended (0 then: nothing was left).
        """
        if self.closed:
            return 0
        self._settle()  # the samples of a run of next() not handed out are drawn again
        taken = 0
        emit = self.emit
        shuffle = self.shuffle
        deliver = native_deliver()
        try:
            if not self.primed:
                self._prime()
            while taken < n:
                need = shuffle.need()
                if need.kind != "draw":
                    self._serve(need)
                    continue
                indices, samples = shuffle.draw_many(n - taken)
                # Each lane's records, ring view, url and first sample, looked up once a run.
                lanes = self.places.of(shuffle)
                if deliver is not None:  # the loop in C (asyncstream/shards/_records.c)
                    done, going, error = deliver(lanes, indices, samples, sink)
                    emit.emitted += done
                    taken += done
                    if error is not None or not going:
                        shuffle.undraw(indices[done:], samples[done:])  # drawn, not emitted
                        if error is not None:
                            raise error
                        return taken
                    continue
                for at, (index, sample) in enumerate(zip(indices, samples, strict=True), 1):
                    records, view, url, first = lanes[index]
                    emit.emitted += 1
                    taken += 1
                    try:
                        going = sink(view, url, records[sample - first])
                    except BaseException:
                        shuffle.undraw(indices[at:], samples[at:])  # drawn, not emitted
                        raise
                    if not going:
                        shuffle.undraw(indices[at:], samples[at:])
                        return taken
            return taken
        except StopIteration:
            self.closed = True  # the engine is idle again: finish() hands it back
            self._ended()
            return taken
        except BaseException as exc:
            self._fail(exc)
            raise

    def _ended(self) -> None:
        """The epoch ended: tell :attr:`on_end` (a metrics exporter's last reading)."""
        on_end, self.on_end = self.on_end, None
        if on_end is not None:
            on_end()

    def _fail(self, exc: BaseException) -> None:
        """The run failed: stop it, and name a mixed stream's source in the error."""
        self.close()
        if isinstance(exc, AsyncStreamError):
            self._name_source(exc)

    def _prime(self) -> None:
        """Before the first sample: restore the saved position, or ask for the first
        window's chunks all at once."""
        if self._restore_pending is not None:
            self.reset(self._restore_pending)
            self._restore_pending = None
        else:
            self._prefetch()
        self.primed = True

    def _name_source(self, exc: AsyncStreamError) -> None:
        """Put the source of the shard an error names at the start of its message."""
        if not self.settings.sources or not exc.args or not isinstance(exc.args[0], str):
            return
        message, url = exc.args[0], getattr(exc, "url", None)
        named = [
            (len(shard.url), i)
            for i, shard in enumerate(self.settings.shards)
            if shard.url == url or (url is None and shard.url in message)
        ]
        if named:
            source = self.settings.sources[self.settings.source_of(max(named)[1])]
            exc.args = (f"source {source.name!r}: {message}", *exc.args[1:])

    def _serve(self, need: Need) -> None:
        """Do what the shuffle needs before its next draw: open the next piece, refill a
        lane with its next chunk or close it; then top up the prefetch. Raises
        StopIteration at the end of the epoch."""
        shuffle = self.shuffle
        if self.stats_wanted and self.engine is not None:  # at a chunk, never per sample
            self.stats_wanted = False
            self.last_fetch = self.engine.stats()
        if need.kind == "done":
            raise StopIteration
        if need.kind == "open":
            position, _ = self.plan.next()
            if position != need.piece:
                raise StateError(f"the plan source is at piece {position}, not {need.piece}")
            lane = self.reader.lane(position)
            shuffle.open(self.reader.load(lane), {"reader": lane})
            self.places.opened(shuffle, lane)
        else:
            lane = self._lane(shuffle.lanes[need.lane])
            if lane.wants_more:
                shuffle.refill(need.lane, self.reader.load(lane))
                self.places.refilled(shuffle, need.lane, lane)
            else:
                self._release(shuffle.close(need.lane))
                self.places.closed(shuffle, need.lane)
        self._prefetch()

    # -- state --------------------------------------------------------------------------

    @property
    def emitted(self) -> int:
        """Samples emitted in this epoch by this reader (the saved ones included); not
        those drawn and not handed out."""
        return self.emit.emitted - len(self.ready)

    def stages(self) -> StageStates:
        """The state of each stage, as each gives it (the samples drawn and not handed
        out put back first)."""
        self._settle()
        return StageStates(
            plan=self.plan.state(),
            reader=self.reader.state(),
            shuffle=self.shuffle.state(),
            blend=self.blend.state() if self.blend is not None else None,
            emit=self.emit.state(),
        )

    def position(self) -> Position:
        """Where the reader is."""
        if self._restore_pending is not None:
            return self._restore_pending
        return self.checkpoint.position(self.stages())

    def state(self) -> ReaderState:
        """The reader's exact state (see :mod:`._state`), built by its checkpoint."""
        if self._restore_pending is not None:
            return self.checkpoint.build(Checkpoint.split(self.start, self._restore_pending))
        return self.checkpoint.build(self.stages())

    def save(self) -> dict[str, Any]:
        """:meth:`state` as plain JSON data (``state_dict()``), each lane's undrawn
        samples copied once."""
        if self._restore_pending is not None:
            return self.checkpoint.save(Checkpoint.split(self.start, self._restore_pending))
        return self.checkpoint.save(self.stages())

    def snapshot(self) -> StateSnapshot:
        """:meth:`save` to be made later: the small stages' states taken now, the
        shuffle's as a snapshot (:meth:`WindowShuffle.snapshot`), nothing copied that
        the run changes afterwards."""
        checkpoint = self.checkpoint
        start, pending = self.start, self._restore_pending
        if pending is not None:
            return StateSnapshot(
                self.topology, lambda: checkpoint.save(Checkpoint.split(start, pending))
            )
        self._settle()
        plan, reader, emit = self.plan.state(), self.reader.state(), self.emit.state()
        blend = self.blend.state() if self.blend is not None else None
        shuffle = self.shuffle.snapshot()
        return StateSnapshot(
            self.topology,
            lambda: checkpoint.save(StageStates(plan, reader, shuffle.state(), blend, emit)),
        )

    def reset(self, position: Position) -> None:
        """Give each stage its part of a saved position: the lanes reopen, each with its
        undrawn samples resident."""
        states = Checkpoint.split(self.start, position)
        self.plan.reset(states.plan)
        held = self.reader.reset(states.reader)
        meta = []
        for saved in states.shuffle["lanes"]:
            lane = self.reader.open[saved["piece"]]
            missing = [i for i in saved["remaining"] if i not in held[saved["piece"]]]
            if missing:
                raise StateError(
                    f"state_dict names sample {missing[0]} that the resident chunk of "
                    f"{lane.shard.url} does not hold"
                )
            meta.append({"reader": lane})
        try:
            self.shuffle.reset(states.shuffle, meta)
            if self.blend is not None and states.blend is not None:
                self.blend.reset(states.blend)
        except ValueError as exc:
            raise StateError(f"state_dict is corrupted: {exc}") from None
        self.emit.reset(states.emit)
        self._prefetch()

    def stats(self, fetch: bool = True) -> dict[str, Any]:
        """Fetch statistics plus the shuffle's: radius, emitted, remainder.

        Args:
            fetch: ask the engine for its counters (a round trip on the engine's pipe,
                which only the thread reading the run may make).
        """
        out: dict[str, Any] = {
            "epoch": self.epoch,
            "samples": self.emitted,
            "shuffle_radius": self.shuffle.resident() + len(self.ready),
            "open_shards": len(self.shuffle.lanes),
            "remainder_policy": self.settings.remainder,
            "remainder_samples": self.remainder_samples,
            "tar_general_members": self.reader.general_members,
            # The ring's slots (the engine's hedge slot aside) and those held: each open
            # shard's resident chunk, and the chunks asked for ahead.
            "ring": {
                "slots": self.settings.lanes + self.settings.prefetch_slots,
                "used": len(self.shuffle.lanes) + len(self.reader.requested),
            },
        }
        if self.blend is not None:
            drawn = list(self.blend.drawn)
            ahead = len(self.ready)  # drawn, not handed out: not counted
            if ahead:
                lanes = self.shuffle.lanes
                for index in self._drawn[0][-ahead:]:
                    drawn[lanes[index].group] -= 1
            out["sources"] = {
                source.name: {
                    "drawn": drawn[i],
                    "planned": self.blend.totals[i],
                    "epoch_quota": source.quota,
                    "shards": source.stop - source.first,
                }
                for i, source in enumerate(self.settings.sources)
            }
        if self.start.lineage != BASE:
            out["resumed_from"] = self.start.lineage
        if fetch and self.engine is not None:
            out["fetch"] = self.last_fetch = self.engine.stats()
        elif self.last_fetch is not None:
            out["fetch"] = self.last_fetch
        return out

    # -- lifetime -----------------------------------------------------------------------

    def __del__(self) -> None:
        if "closed" in self.__dict__:  # not when __init__ failed
            self.close()  # last resort; ShardStream closes runs explicitly

    def finish(self) -> Engine | None:
        """End the run; return its engine if it is idle (all chunks taken, all slots free)."""
        self._settle()
        self.closed = True
        self._close_launch()
        engine, self.engine = self.engine, None
        if engine is not None and engine.idle:
            engine.flush()
            return engine
        if engine is not None:
            engine.close()
        return None

    def _close_launch(self) -> None:
        if self.launch is not None:
            self.launch.close()
            self.launch = None

    def close(self) -> None:
        """Stop the engine and free the ring. Idempotent."""
        if "ready" in self.__dict__:  # not when __init__ failed before it
            self._settle()
        self.closed = True
        self._close_launch()
        if self.engine is not None:
            self.engine.close()
            self.engine = None
