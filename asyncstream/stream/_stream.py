"""ShardStream: the public stream of samples.

It imports PyTorch (it is an ``IterableDataset``), so :mod:`asyncstream` loads it lazily:
the engine process, which imports the package too, never pays for torch.
"""

from __future__ import annotations

import functools
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar, Unpack, cast

from torch.utils.data import IterableDataset, get_worker_info

from .._config import CacheConfig, FetchConfig, FlatSettings, IndexConfig, OrderConfig, group
from .._exceptions import StateError
from ..dataset._count import CountProgress
from ..dataset._sources import Source
from ..engine._engine import Engine
from ..engine._ring import check_node_room, local_ranks
from ..metrics._hook import StreamMetrics
from ..order._plan import Topology, reader_samples
from ..stores._s3 import S3Options
from . import _malloc
from ._checkpoint import Checkpoint, StateSnapshot
from ._epochs import Pending
from ._iteration import Iteration, SampleViews
from ._mapped import MappedStream
from ._open import open_settings, start_engine_process
from ._run import EpochRun, worker_topology
from ._stall import new_meter
from ._state import Start, fresh, resume
from ._workers import LOCAL, Refused, SharedEpoch

__all__ = ["ShardStream"]

T = TypeVar("T")

# torchdata 0.11's StatefulDataLoader calls torch.set_vital, which torch 2.13 deprecates:
# one UserWarning per loader, about torchdata's code, that no user can act on.
warnings.filterwarnings("ignore", "'set_vital' is deprecated", UserWarning, "torchdata")

_PLAIN_DATALOADER = (
    "ShardStream.state_dict() was called in the main process while DataLoader workers "
    "read this stream: the workers read the samples, and what they have handed out is "
    "known only to a loader that tracks it. Use torchdata's StatefulDataLoader "
    "(torchdata.stateful_dataloader) and save its state_dict(), or DALIImageLoader's; "
    "see the README's checkpointing section. (Between epochs, set_epoch() makes this "
    "stream's own state valid again.)"
)


class ShardStream(IterableDataset[dict[str, Any]]):
    """Samples of webdataset-style tar shards, streamed from any store (S3, Google Cloud
    Storage, Azure Blob, web URLs) or local files.

    Iterating yields one dict per sample: ``{"__key__": "000017", "__url__": shard URL,
    "jpg": bytes, "cls": bytes, ...}`` (one entry per member extension; the bytes are the
    stream's own copies, safe to keep).

    The order is a pure function of (``seed``, epoch, rank, world size, worker): a seeded
    shard permutation per epoch, split exactly across ranks and DataLoader workers, then
    a window shuffle over ``window`` open shards with one block each resident. Call
    :meth:`set_epoch` before each epoch for a new order; it reaches DataLoader workers,
    ``persistent_workers=True`` included. :meth:`state_dict` taken after any sample
    resumes, in a new process, with exactly the samples that would have come next.

    Memory: the ring holds ``(window + prefetch + 1)`` blocks per reader (each DataLoader
    worker runs its own engine and ring; a block is ``OrderConfig.block_bytes``, else a
    loaded state's, else ``chunk_bytes``, capped at the largest shard), ``window`` capped
    at the number of shards plus two and ``prefetch`` at the dataset's number of blocks;
    the 1 is the engine's hedge slot, none with ``hedge=False`` (:attr:`ring_bytes`). A
    ring larger than the memory rings can take is refused at construction: rings are
    ``memfd`` segments, bound by the machine's or the container's memory, not by
    /dev/shm (which they use, named for no longer than their opening, only where
    ``memfd_create`` is refused).

    The fetch engine runs in a process of its own, started at construction so that its
    start overlaps the dataset's open; the first iteration's engine takes it over. Not
    read within 30 s (DataLoader workers run engines of their own), closed, or on a failed
    open, that process is stopped.

    Sample counts (the plan needs them to split ranks exactly) come from an index read at
    construction (asyncstream's ``asyncstream.json`` or another tool's: a wids index,
    ``_info.json``, ``sizes.json``, img2dataset ``*_stats.json``), else the local index
    cache, else a count through the fetch engine. Under ``torch.distributed`` the job opens
    the dataset once: rank 0 opens it and the other ranks take its result (shards, sizes,
    counts), and the ranks split any counting, so every rank must build the same streams
    in the same order (docs/frameworks.md); under a prefix, a shard the index does
    not list is left out with a :class:`~asyncstream.StaleShardWarning`; ``stats()["index"]``
    says which index was used. A list of :class:`~asyncstream.Source` mixes datasets in
    one stream, each epoch taking each source's share, each sample naming its source in
    ``__source__`` (docs/mixing.md).

    Args:
        urls: shard URLs: ``s3://bucket/train-{0000..0099}.tar``, a prefix (``s3://``,
            ``gs://``, ``az://``), ``https://`` URLs (braces or a list: the web has no
            listing), local files or folders, an index file (``.../asyncstream.json``,
            ``.../_info.json``, a wids index), or a list of these; or a list of
            :class:`~asyncstream.Source` to mix.
        epoch_size: with sources, the samples of an epoch, all sources and ranks
            together; default: the absolute counts plus every weighted source's size.
        endpoint_url: an S3-compatible endpoint; default from ``AWS_ENDPOINT_URL`` or AWS.
            With sources, the default of those without their own (so is ``s3``).
        s3: full S3 options (credentials, timeouts, profile); ``endpoint_url`` overrides.
        order: what decides the sample order, and so what a checkpoint must share
            (:class:`~asyncstream.OrderConfig`: seed, shuffle, window, mode, block,
            remainder, rank, world size).
        fetch: how chunks are fetched (:class:`~asyncstream.FetchConfig`: inflight,
            prefetch, GET size, coalescing, retries, timeouts, adaptive concurrency,
            hedging, transport, ETag checks): speed only, never the order.
        cache: the local chunk cache (:class:`~asyncstream.CacheConfig`): a folder that
            keeps every remote chunk fetched, so later epochs, and other streams and
            processes given the same folder, read it from disk, in the same order and
            with the same resume; local shards are never cached (docs/cache.md).
        index: where sample counts come from (:class:`~asyncstream.IndexConfig`).
        progress: while shards with no count anywhere are read to be counted, here at
            construction: ``True`` shows a progress bar and then a one-line summary on
            stderr; a callable is called with each :class:`~asyncstream.CountProgress`
            (shards, samples, bytes, retries, seconds) and shows nothing; ``False``
            (the default), nothing is shown (a log warning still says that shards are
            counted). How the count is shown only: the stream is the same.
        **flat: each group's settings as flat keyword arguments, as before the config
            objects (the API reference lists each with its type and default): ``seed``,
            ``shuffle``, ``window``, ``shuffle_mode``, ``remainder``, ``rank``,
            ``world_size``, ``block_bytes`` (``order``); ``inflight``, ``prefetch``,
            ``chunk_bytes``,
            ``retry``, ``timeouts``, ``check_etag``, ``adaptive``, ``hedge``,
            ``max_sample_bytes``, ``on_truncated`` (``fetch``);
            ``cache_dir``, ``cache_limit`` (``cache``: ``path``, ``limit``);
            ``samples_per_shard``, ``split``, ``strict``, ``index_cache``,
            ``trust_index_urls`` (``index``: ``cache`` for ``index_cache``). A flat
            argument and the group that holds it, both given, is a ``TypeError`` naming
            both.

    Raises:
        ShardURLError, NotFoundError, AccessDeniedError: at construction, for bad URLs,
            missing objects or credentials.
        DataError: at construction, an index that disagrees with the store (naming the
            shard and the index), a stale shard with ``strict=True``, or a remote index
            that names shards beyond the origins given (see ``trust_index_urls``).
        CorruptTarError, DataError, FetchError: at construction, when samples are
            counted (no index, nothing cached) and a shard is not a readable tar, holds no
            sample, or cannot be read within the retry policy.
        ValueError: bad arguments (a ``split`` the index does not have; ``cache_dir`` not
            a folder that can be created, or one another user could write into: owned by
            another user or writable by group or others; ``cache_limit`` not a positive
            integer or given without ``cache_dir``), or a ring that does not fit the memory
            rings can take (the message gives both sizes and the fixes). With sources:
            an empty source, weights zero in total, an ``epoch_size`` the absolute counts
            do not fit, two sources of one name, or a ``window`` smaller than the number
            of sources; the message names the source. An error opening a source starts
            with its name.
        TypeError: Sources and URL strings in one list; an unknown keyword argument; a
            flat setting given with the config object that holds it.
    """

    def __init__(
        self,
        urls: str | Sequence[str] | Source | Sequence[Source],
        *,
        epoch_size: int | None = None,
        endpoint_url: str | None = None,
        s3: S3Options | None = None,
        order: OrderConfig | None = None,
        fetch: FetchConfig | None = None,
        cache: CacheConfig | None = None,
        index: IndexConfig | None = None,
        progress: bool | Callable[[CountProgress], None] = False,
        **flat: Unpack[FlatSettings],
    ) -> None:
        # The engine's process starts first, so that its start overlaps the open.
        launch = start_engine_process(urls)
        try:
            opened = open_settings(
                urls,
                epoch_size=epoch_size,
                endpoint_url=endpoint_url,
                s3=s3,
                configs=group(flat, order=order, fetch=fetch, cache=cache, index=index),
                progress=progress,
            )
            # Each reader's ring is made when it starts reading: say now if it cannot fit.
            check_node_room(opened.settings.ring_bytes, 0, "lower window, prefetch or block_bytes")
        except BaseException:
            if launch is not None:
                launch.close()
            raise
        self._launch = launch  # adopted by the first iteration's engine
        self._settings, self._index = opened.settings, opened.index
        self._rank, self._world_size = opened.rank, opened.world_size
        self._shared = SharedEpoch()
        self._run: EpochRun | None = None
        self._live: weakref.ref[Iteration] | None = None  # the iterator last handed out
        self._meter = new_meter()  # how long the loop waits in next()
        self._engine: Engine | None = None  # kept from one epoch to the next when idle
        self._loaded = Pending()  # from load_state_dict, for the next iteration
        self._loads = 0  # load_state_dict calls, numbering the marks
        self._metrics: StreamMetrics | None = None  # exporters' hooks (asyncstream.metrics)
        self._iterations = 0  # runs started by this process's copy
        self._closed = False

    def __repr__(self) -> str:
        s = self._settings
        mixed = f"{len(s.sources)} sources, " if s.sources else ""
        return (
            f"ShardStream({mixed}{len(s.shards)} shards, {s.epoch_samples} samples per epoch, "
            f"epoch={self.epoch}, "
            f"window={s.window}, inflight={s.fetch.inflight}, prefetch={s.prefetch_slots}, "
            f"chunk_bytes={s.chunk_bytes}, "
            f"shuffle={s.shuffle}, rank={self._rank}/{self._world_size})"
        )

    def __getstate__(self) -> dict[str, Any]:  # a DataLoader worker starts its own engine
        return {**self.__dict__, "_run": None, "_engine": None, "_launch": None, "_live": None}

    @property
    def epoch(self) -> int:
        """The epoch being read, while an iteration of this process is open; else the
        epoch the next iteration reads (the loaded state's, the one :meth:`set_epoch`
        chose, or the one after the latest begun)."""
        if self._run is not None and not self._run.closed:
            return self._run.epoch
        states = self._loaded.unspent(self._shared)
        if states is not None:
            return states[0].epoch
        return self._shared.upcoming

    @property
    def rank(self) -> int:
        """This process's rank."""
        return self._rank

    @property
    def world_size(self) -> int:
        """The number of ranks."""
        return self._world_size

    @property
    def ring_bytes(self) -> int:
        """Shared memory of one reader's ring, ``(window + prefetch + 1) x chunk`` (each
        capped by what the dataset can use; see the class docstring)."""
        return self._settings.ring_bytes

    @property
    def num_samples(self) -> int:
        """Samples in the dataset (all shards; of every source)."""
        return sum(self._settings.counts)

    @property
    def epoch_samples(self) -> int:
        """Samples in an epoch, all ranks together: :attr:`num_samples`, or for a stream
        of sources the sum of their quotas (``epoch_size`` where given)."""
        return self._settings.epoch_samples

    @property
    def sources(self) -> dict[str, int]:
        """A stream of sources' samples per epoch from each, by name (empty otherwise)."""
        return {s.name: s.quota for s in self._settings.sources}

    def __len__(self) -> int:
        """Samples this reader yields in a full epoch: this rank's share (the remainder
        policy applied), or in a DataLoader worker that worker's share of it. A
        DataLoader's ``len()`` divides it by the batch size, which with workers is short
        of the batches they make; :meth:`batches` (and :class:`~asyncstream.ShardLoader`)
        count those."""
        topology = worker_topology(self._rank, self._world_size)
        return reader_samples(self.epoch_samples, topology, self._settings.remainder)

    def node_ring_bytes(self, workers: int = 0, *, check: bool = True) -> int:
        """The shared memory every reader of this node takes: ranks on the node
        (``LOCAL_WORLD_SIZE``) x readers per rank (``max(1, workers)``: each DataLoader
        worker runs its own engine and ring) x :attr:`ring_bytes`.

        Args:
            workers: DataLoader workers per rank.
            check: refuse a total larger than the memory rings can take (the machine's
                or the container's; do it before the readers start: their rings take it).

        Raises:
            ValueError: ``check`` and the memory cannot hold the total (the message
                gives it).
        """
        _count_at_least("workers", workers, 0)
        if not check:
            return local_ranks() * max(1, workers) * self._settings.ring_bytes
        return check_node_room(
            self._settings.ring_bytes, workers, "lower workers, window, prefetch or block_bytes"
        )

    def worker_samples(self, num_workers: int) -> list[int]:
        """Samples each of ``num_workers`` DataLoader workers of this rank reads in a full
        epoch (``[len(self)]`` for 0 workers: the rank reads in its own process).

        With workers every worker ends its share on its own, so a DataLoader's batches per
        epoch are ``sum(ceil(n / batch_size) for n in worker_samples(workers))``.
        """
        _count_at_least("num_workers", num_workers, 0)
        readers = max(1, num_workers)
        return [
            reader_samples(
                self.epoch_samples,
                Topology(self._rank, self._world_size, worker, readers),
                self._settings.remainder,
            )
            for worker in range(readers)
        ]

    def batches(self, batch_size: int, *, num_workers: int = 0, drop_last: bool = False) -> int:
        """Batches of ``batch_size`` that a DataLoader with ``num_workers`` workers makes of
        this rank's epoch: each worker batches its own share (:meth:`__len__` in the
        worker), so each ends with its own short batch, or drops it with ``drop_last``.
        :class:`~asyncstream.ShardLoader`'s ``len()``; a plain DataLoader's is
        ``ceil(len(stream) / batch_size)``, short of the truth with workers.

        Raises:
            ValueError: ``batch_size`` below 1 or ``num_workers`` below 0.
        """
        _count_at_least("batch_size", batch_size, 1)
        shares = self.worker_samples(num_workers)
        return sum(n // batch_size if drop_last else -(-n // batch_size) for n in shares)

    def map(self, fn: Callable[[dict[str, Any]], T]) -> MappedStream[T]:
        """A stage that yields ``fn(sample)`` for each sample, where the samples are read
        (in DataLoader workers: CPU decode and transforms), keeping this stream's exact
        resume: its ``state_dict`` is this stream's, so StatefulDataLoader restores the
        position instead of fast-forwarding (see :class:`~asyncstream.MappedStream`)."""
        return MappedStream(self, fn)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch (and so the order) of the next iteration.

        Without it, every iteration reads the epoch after the one before (the first reads
        epoch 0), in the main process and in DataLoader workers alike; call it with the
        same epoch again to read that epoch twice. A state loaded by
        :meth:`load_state_dict` (or by a StatefulDataLoader) is kept when ``epoch`` is
        its epoch; for another epoch the next iteration raises :class:`StateError`
        naming both, unless the state has nothing left (it was saved at the end of its
        epoch), which then counts as that epoch read.
        """
        if not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be an integer >= 0, got {epoch!r}")
        self._check_open()
        self._stop_run()
        if not self._shared.owned:
            self._shared = SharedEpoch()  # a worker's copy choosing its own epoch keeps it
        self._shared.publish(epoch)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self._check_open()
        live = self._live() if self._live is not None else None
        if live is not None and live.live and live.thread != threading.get_ident():
            raise StateError(
                "another thread is reading this ShardStream: a stream serves one iterator "
                "at a time; give each thread a stream of its own"
            )
        self._stop_run()
        topology = worker_topology(self._rank, self._world_size)
        try:
            start, claim = self._loaded.next_start(self._shared, self._settings, topology)
        except StateError as exc:
            if get_worker_info() is None:
                raise
            return Refused(exc)
        if not self._shared.owned:
            self._shared.worker_started()
        _malloc.tune()  # freed memory kept in the process (see there)
        # Before the run is made: an exporter reading meanwhile sees no run, never the new
        # run under the old number or the old epoch's stall figures under the new.
        self._meter.new_epoch()
        self._iterations += 1
        engine, self._engine = self._engine, None
        if engine is not None and not engine.owned:  # a forked copy of the parent's
            engine.close()
            engine = None
        launch, self._launch = self._launch, None
        try:
            self._run = EpochRun(
                self._settings, start=start, topology=topology, engine=engine, launch=launch
            )
        except BaseException:
            if launch is not None:
                launch.close()
            raise
        begin = (
            None if claim is None else functools.partial(self._loaded.begin, self._shared, claim)
        )
        iteration = Iteration(self._run, owner=self, meter=self._meter, on_begin=begin)
        self._live = weakref.ref(iteration)
        if self._metrics is not None:
            self._run.on_end = self._metrics.ended
            info = get_worker_info()
            self._metrics.begin(self, None if info is None else info.id)
        return iteration

    def iter_views(self) -> SampleViews:
        """``iter(stream)`` with each member a ``memoryview`` of the ring instead of a copy
        in ``bytes``, valid only until the next call (``next()`` or ``take``): for a
        consumer that copies what it keeps at once (``DALIImageLoader``'s workers copy each
        image straight into the batch's shared buffer), it saves the one copy. Order, state
        and statistics are ``iter``'s. Its ``take(n, sink)`` hands the next ``n`` samples
        to ``sink`` as records of offsets in the ring, with no dict per sample
        (:meth:`SampleViews.take`)."""
        iteration = iter(self)
        if isinstance(iteration, Iteration):
            iteration.run.emit.views = True
        return cast(SampleViews, iteration)

    def _stop_iteration(self, iteration: Iteration) -> None:
        """``iteration.close()``: stop its run if it is still this stream's live one."""
        if self._live is not None and self._live() is iteration:
            self._stop_run()

    def state_dict(self) -> dict[str, Any]:
        """This reader's exact position: plain JSON-able data.

        Taken after any sample (or before the first), it makes :meth:`load_state_dict`
        resume with exactly the samples that would have come next.

        Raises:
            StateError: in the main process, while DataLoader workers read the stream
                (use ``torchdata.stateful_dataloader.StatefulDataLoader``'s state, which
                collects the workers' own; see the README).
        """
        self._check_open()
        if self._run is not None:
            return self._run.save()
        checkpoint, start = self._idle_start()
        return checkpoint.at(start)

    def state_snapshot(self) -> StateSnapshot:
        """:meth:`state_dict` now, made into its dict later (``snapshot.to_dict()``), for
        a consumer that keeps the position before every batch and hands out one now and
        then: taking it copies nothing that grows with the window (``state_dict()`` copies
        every open shard's undrawn samples), and the dict it makes is equal, value for
        value, to what :meth:`state_dict` returned at the time. The snapshot never
        changes as the stream goes on, and ``to_dict()`` may be called in any thread.

        Raises:
            StateError: as :meth:`state_dict`.
        """
        self._check_open()
        if self._run is not None:
            return self._run.snapshot()
        checkpoint, start = self._idle_start()
        return StateSnapshot(checkpoint.topology, lambda: checkpoint.at(start))

    def _idle_start(self) -> tuple[Checkpoint, Start]:
        """Where the next run starts, with no run going, and its reader's checkpoint."""
        if self._shared.owned and self._shared.worker_iterations:
            raise StateError(_PLAIN_DATALOADER)
        topology = worker_topology(self._rank, self._world_size)
        states = self._loaded.unspent(self._shared)
        if states is not None:
            start = resume(states, self._settings, topology)
        else:
            start = fresh(self._settings, self.epoch, topology)
        return Checkpoint(self._settings, topology), start

    def load_state_dict(self, state: Any) -> None:
        """Resume from saved state; the next iteration continues where it was.

        ``state`` is what :meth:`state_dict` returned (the same topology), or the states of
        every reader of one save, in any order: a list of them, or of the state dicts of
        the loaders that hold them (``StatefulDataLoader``: one per rank, its workers'
        states inside; ``DALIImageLoader``). With the same ranks and workers each reader
        continues exactly where it was; with others, what all old readers had left is
        split over the new ones (see the README's checkpointing section).

        With DataLoader workers, load before the DataLoader starts them: persistent workers
        started earlier cannot receive the state, and refuse the next epoch.

        Raises:
            StateError: the state belongs to another dataset or configuration, has an
                unknown version, is corrupted, or does not cover every old reader.
        """
        self._check_open()
        topology = worker_topology(self._rank, self._world_size)
        settings = Checkpoint(self._settings, topology).adopted(state)
        states = Checkpoint(settings, topology).load_all(state)
        self._stop_run()
        if settings is not self._settings:  # the state's block: another ring
            check_node_room(settings.ring_bytes, 0, "lower window, prefetch or block_bytes")
            self._settings = settings
            if self._engine is not None:
                self._engine.close()
                self._engine = None
        if self._shared.owned:
            self._loads += 1
            self._shared.loaded(self._loads)  # workers started before refuse
            self._loaded.load(states, self._loads)
        else:  # a DataLoader worker's copy: its state, then the main process's epochs again
            self._loaded.load(states, LOCAL)

    def _check_state(self, state: Any) -> None:
        """Raise what :meth:`load_state_dict` would for ``state``, loading nothing: a
        loader checks its workers' states in the main process, where the error is
        plain (a worker's would come at the first batch, inside its traceback)."""
        self._check_open()
        topology = worker_topology(self._rank, self._world_size)
        settings = Checkpoint(self._settings, topology).adopted(state)
        Checkpoint(settings, topology).load_all(state)

    def stats(self) -> dict[str, Any]:
        """Statistics: samples, shuffle radius and remainder of the current epoch;
        ``fetch``, the engine's counters since it started (kept from one clean epoch to
        the next): bytes, chunks, retries by cause, downloads in flight, the adaptive
        limit and its cuts, hedges, latencies, the engine's CPU and peak RSS, ``stores``
        (each store opened, its own counters under its scheme) and ``starved_s`` (this
        reader's wait for chunks); from another thread than the reader's, the engine's
        last answer. ``index``: where the sample counts came from
        (:class:`~._dataset.IndexInfo`). ``stall``: the loop's wait in ``next()`` against
        its time between calls (:class:`~asyncstream.StallMeter`).
        ``tar_general_members``: this epoch's tar members read by the general parser
        rather than the (native) walk: pax and GNU headers, long names, sparse members and
        names the walk refuses (a plain member a chunk's end cuts is the walk's). With sources:
        ``sources`` (each one's samples ``drawn``, ``planned``, ``epoch_quota`` and
        ``shards``), ``index`` by source name, and ``fetch["endpoints"]``. ``ring``: the
        reader's ring slots and those held (open shards' chunks and chunks asked for
        ahead). ``malloc``: whether this process keeps freed memory rather than faulting
        it in again (``"tuned"``, see :mod:`._malloc`, or why not). From another thread,
        the reader asks the engine again at its next chunk, so that a thread that polls (a
        metrics exporter) sees figures at most one interval old."""
        self._check_open()
        if self._run is None:
            stats = {
                "epoch": self.epoch,
                "samples": 0,
                "remainder_policy": self._settings.remainder,
            }
        else:
            # Only the thread reading the stream talks to its engine; from another thread
            # (a loader's producer reads it), ``fetch`` is the engine's last answer.
            live = self._live() if self._live is not None else None
            mine = live is None or not live.live or live.thread == threading.get_ident()
            stats = self._run.stats(fetch=mine)
            if not mine:
                self._run.stats_wanted = True  # asked of the engine at the reader's next chunk
        return {
            **stats,
            "index": self._index,
            "stall": self._meter.report(),
            "malloc": _malloc.state(),
        }

    def _export_stats(self) -> dict[str, Any]:
        """:meth:`stats` for a metrics exporter, from any thread: only the thread that made
        the last iterator talks to the engine (another, between epochs, might race a new
        ``iter()`` on the engine's pipe); elsewhere ``fetch`` is the engine's last answer,
        asked again at the reader's next chunk and at the end of each epoch. ``iteration``
        numbers this process's iterations (an exporter's epoch figures start again at a
        new one)."""
        self._check_open()
        run = self._run
        if run is None:
            stats = {"epoch": self.epoch, "samples": 0}
        else:
            live = self._live() if self._live is not None else None
            mine = live is not None and live.thread == threading.get_ident()
            stats = run.stats(fetch=mine)
            if not mine:
                run.stats_wanted = True
        return {**stats, "iteration": self._iterations, "stall": self._meter.report()}

    def _metrics_hook(self) -> StreamMetrics:
        """The exporters' hook of this stream (made at the first exporter)."""
        self._check_open()
        if self._metrics is None:
            self._metrics = StreamMetrics()
        return self._metrics

    def _stop_run(self) -> None:
        if self._run is not None:
            self._engine = self._run.finish()
            self._run = None
        live = self._live() if self._live is not None else None
        if live is not None:
            live.replaced = True  # if it is used again, it says why it ended
        self._live = None

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this ShardStream is closed")

    def close(self) -> None:
        """Stop the engine and free the ring; the stream cannot be used afterwards."""
        if not self._closed:
            if self._metrics is not None:
                self._metrics.close()
            self._stop_run()
            if self._engine is not None:
                self._engine.close()
                self._engine = None
            if self._launch is not None:
                self._launch.close()
                self._launch = None
            self._closed = True

    def __del__(self) -> None:
        if "_closed" in self.__dict__:  # not when __init__ failed
            self.close()  # last resort: the engine process must not outlive its stream

    def __enter__(self) -> ShardStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _count_at_least(name: str, value: object, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
