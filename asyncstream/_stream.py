"""ShardStream: the public stream of samples.

It imports PyTorch (it is an ``IterableDataset``), so :mod:`asyncstream` loads it lazily:
the engine process, which imports the package too, never pays for torch.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator, Sequence
from dataclasses import replace
from multiprocessing.context import get_spawning_popen
from multiprocessing.sharedctypes import RawArray
from typing import Any, Literal

from torch.utils.data import IterableDataset, get_worker_info

from ._count import CountSettings
from ._dataset import open_dataset
from ._engine import Engine
from ._exceptions import StateError
from ._plan import Topology
from ._retry import RetryPolicy, Timeouts
from ._run import (
    EpochRun,
    StreamSettings,
    check_state,
    default_topology,
    json_state,
    worker_topology,
)
from ._s3 import S3Options

__all__ = ["ShardStream"]

_LOCAL = -1  # the pending mark of a state loaded by a copy itself, not by the stream it copies


class _SharedEpoch:
    """The epoch a stream publishes to its DataLoader workers, read live by them.

    Persistent workers keep the copy of the stream they started with, so a plain attribute
    set by :meth:`ShardStream.set_epoch` in the main process would never reach them. Two
    int64 cells in shared memory do: the epoch, and the mark of the state
    :meth:`ShardStream.load_state_dict` left pending (0 for none). Only the process that
    created the cells (the owner) writes them. Forked workers inherit them; spawned ones
    get them while being spawned. Plain pickling and ``copy.deepcopy`` make an independent
    copy with cells of its own.
    """

    def __init__(self, epoch: int = 0, mark: int = 0) -> None:
        self._cells = RawArray(ctypes.c_int64, [epoch, mark])
        self._owner = os.getpid()

    @classmethod
    def _attach(cls, cells: ctypes.Array[ctypes.c_int64], owner: int) -> _SharedEpoch:
        shared = cls.__new__(cls)
        shared._cells, shared._owner = cells, owner
        return shared

    def __reduce__(self) -> tuple[Any, ...]:
        if get_spawning_popen() is not None:  # multiprocessing can pass shared memory only then
            return _SharedEpoch._attach, (self._cells, self._owner)
        return _SharedEpoch, (self.epoch, self.mark)

    @property
    def owned(self) -> bool:
        """Whether this process created the cells (a DataLoader worker only reads them)."""
        return self._owner == os.getpid()

    @property
    def epoch(self) -> int:
        return int(self._cells[0])

    @property
    def mark(self) -> int:
        return int(self._cells[1])

    def publish(self, epoch: int, mark: int) -> None:
        self._cells[0], self._cells[1] = epoch, mark


class _Refused(Iterator[dict[str, Any]]):
    """Iterated by a DataLoader worker instead of an epoch it refuses. Torch reports an error
    raised by ``next()`` in the main process, but one raised by ``iter()`` at the start of a
    later epoch kills a persistent worker."""

    def __init__(self, error: Exception) -> None:
        self._error = error

    def __next__(self) -> dict[str, Any]:
        raise self._error


class ShardStream(IterableDataset[dict[str, Any]]):
    """Samples of webdataset-style tar shards, streamed from S3 or local files.

    Iterating yields one dict per sample: ``{"__key__": "000017", "__url__": shard URL,
    "jpg": bytes, "cls": bytes, ...}`` (one entry per member extension; the bytes are the
    stream's own copies, safe to keep).

    The order is a pure function of (``seed``, epoch, rank, world size, worker): a seeded
    shard permutation per epoch, split exactly across ranks and DataLoader workers, then
    a window shuffle over ``window`` open shards with one chunk each resident. Call
    :meth:`set_epoch` before each epoch for a new order; it reaches DataLoader workers,
    ``persistent_workers=True`` included. :meth:`state_dict` taken after any sample
    resumes, in a new process, with exactly the samples that would have come next.

    Memory: the ring holds ``(window + prefetch + 1) x chunk_bytes`` (chunk_bytes capped at
    the largest shard; the 1 is the engine's hedge slot, none with ``hedge=False``), per
    reader: each DataLoader worker runs its own engine and ring (:attr:`ring_bytes`).

    Sample counts (the plan needs them to split ranks exactly) come from an index, read at
    construction: asyncstream's ``asyncstream.json`` or another tool's (a wids shard index,
    timm / Hugging Face ``_info.json``, OpenCLIP ``sizes.json``, img2dataset
    ``*_stats.json``) beside the shards or given as ``urls``; else from the local index
    cache; else the shards are counted once through the fetch engine (logged, and kept in
    the cache; under ``torch.distributed`` the ranks split that work, so every rank must
    build the stream). Under a prefix, the index decides which shards are read: a
    ``.tar`` it does not list is left out with a :class:`~asyncstream.StaleShardWarning`.
    ``stats()["index"]`` says which index was used (:mod:`asyncstream._dataset`).

    Args:
        urls: shard URLs: ``s3://bucket/train-{0000..0099}.tar``, an ``s3://`` prefix,
            local files or folders, an index file (``.../asyncstream.json``,
            ``.../_info.json``, a wids index), or a list of these.
        endpoint_url: an S3-compatible endpoint; default from ``AWS_ENDPOINT_URL`` or AWS.
        inflight: K, chunk downloads in flight at most (fewer while throttled).
        window: shards open at once for the window shuffle.
        prefetch: chunks requested ahead of need, downloading or waiting for their
            shard's turn; default ``2 * inflight``, so ``inflight`` downloads keep running
            while some finished chunks wait (at least ``inflight`` to use them all).
        chunk_bytes: bytes per ranged GET and per ring slot.
        shuffle: ``False`` reads shards in order and samples in shard order.
        seed: the run's seed.
        rank: this process's rank; default torch.distributed, else ``RANK``, else 0.
        world_size: number of ranks; default torch.distributed, else ``WORLD_SIZE``, else 1.
        samples_per_shard: samples in each shard (one number or a list); default: an
            index, else the local index cache, else counted once. Given, no index is read.
        shuffle_mode: pick the next sample uniformly over resident samples
            (``"samples"``) or over open shards (``"shards"``).
        remainder: when the total does not divide by ``world_size``: ``"drop"`` the last
            few samples of the epoch, or ``"pad"`` by repeating the first few.
        s3: full S3 options (credentials, timeouts, profile); ``endpoint_url`` overrides.
        retry: the chunk download retry policy.
        timeouts: the chunk download timeouts.
        check_etag: require every chunk to come from the object version that was listed.
        adaptive: halve the downloads in flight on throttling (503 SlowDown) and grow
            them back when it stops (see :mod:`asyncstream._engine`).
        hedge: send a second request for a chunk far slower than recent ones; the first
            to finish wins.
        split: the split to read, for an index with splits (``_info.json``; required
            when it has several).
        strict: a ``.tar`` under the prefix that the index does not list is a
            ``DataError`` rather than a warning.
        index_cache: the local index cache of counted shards: ``None`` for the default
            folder (``$ASYNCSTREAM_CACHE_DIR``, else ``~/.cache/asyncstream``),
            ``False`` for none, or a folder.

    Raises:
        ShardURLError, NotFoundError, AccessDeniedError: at construction, for bad URLs,
            missing objects or credentials.
        DataError: at construction, an index that disagrees with the store (naming the
            shard and the index), or a stale shard with ``strict=True``.
        CorruptTarError, DataError, FetchError: at construction, when samples are
            counted (no index, nothing cached) and a shard is not a readable tar, holds no
            sample, or cannot be read within the retry policy.
        ValueError: bad arguments (a ``split`` the index does not have, too).
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        endpoint_url: str | None = None,
        inflight: int = 8,
        window: int = 64,
        prefetch: int | None = None,
        chunk_bytes: int = 16 << 20,
        shuffle: bool = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        samples_per_shard: int | Sequence[int] | None = None,
        shuffle_mode: Literal["samples", "shards"] = "shards",
        remainder: Literal["drop", "pad"] = "drop",
        s3: S3Options | None = None,
        retry: RetryPolicy | None = None,
        timeouts: Timeouts | None = None,
        check_etag: bool = True,
        adaptive: bool = True,
        hedge: bool = True,
        split: str | None = None,
        strict: bool = False,
        index_cache: str | os.PathLike[str] | bool | None = None,
    ) -> None:
        for name, value in (
            ("inflight", inflight),
            ("window", window),
            ("chunk_bytes", chunk_bytes),
            ("prefetch", 2 if prefetch is None else prefetch),
        ):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if shuffle_mode not in ("samples", "shards"):
            raise ValueError(f"shuffle_mode must be 'samples' or 'shards', got {shuffle_mode!r}")
        if remainder not in ("drop", "pad"):
            raise ValueError(f"remainder must be 'drop' or 'pad', got {remainder!r}")
        options = s3 or S3Options()
        if endpoint_url is not None:
            options = replace(options, endpoint_url=endpoint_url)
        options = options.resolve()
        self._rank, self._world_size = default_topology(rank, world_size)
        Topology(self._rank, self._world_size)  # validates
        settings = StreamSettings(
            shards=(),
            counts=(),
            window=window,
            inflight=inflight,
            prefetch=2 * inflight if prefetch is None else prefetch,
            chunk_bytes=chunk_bytes,
            shuffle=shuffle,
            seed=seed,
            mode=shuffle_mode,
            remainder=remainder,
            s3=options,
            retry=retry or RetryPolicy(),
            timeouts=timeouts or Timeouts(),
            check_etag=check_etag,
            adaptive=adaptive,
            hedge=hedge,
        )
        dataset = open_dataset(
            urls,
            options,
            samples_per_shard=samples_per_shard,
            split=split,
            strict=strict,
            index_cache=index_cache,
            counting=CountSettings.like(settings),  # counted as an epoch reads
        )
        self._index = dataset.info
        self._settings = replace(settings, shards=dataset.shards, counts=dataset.counts)
        self._shared = _SharedEpoch()
        self._run: EpochRun | None = None
        self._engine: Engine | None = None  # kept from one epoch to the next when idle
        self._pending: dict[str, Any] | None = None  # from load_state_dict, for the next epoch
        self._pending_mark = 0  # the shared mark it was published with, or _LOCAL
        self._loads = 0  # load_state_dict calls, numbering the marks
        self._closed = False

    def __repr__(self) -> str:
        s = self._settings
        return (
            f"ShardStream({len(s.shards)} shards, {sum(s.counts)} samples, epoch={self.epoch}, "
            f"window={s.window}, inflight={s.inflight}, prefetch={s.prefetch}, "
            f"chunk_bytes={s.slot_bytes}, "
            f"shuffle={s.shuffle}, rank={self._rank}/{self._world_size})"
        )

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_run"] = None  # a DataLoader worker starts its own engine
        state["_engine"] = None
        return state

    @property
    def epoch(self) -> int:
        """The epoch the next iteration reads."""
        if self._pending is not None and self._pending_mark == _LOCAL:
            return int(self._pending["epoch"])
        return self._shared.epoch

    @property
    def ring_bytes(self) -> int:
        """Shared memory of one reader's ring, ``(window + prefetch + 1) x chunk``."""
        return self._settings.ring_bytes

    @property
    def num_samples(self) -> int:
        """Samples in the dataset (all shards)."""
        return sum(self._settings.counts)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch (and so the order) of the next iteration."""
        if not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be an integer >= 0, got {epoch!r}")
        self._check_open()
        self._stop_run()
        if not self._shared.owned:
            self._shared = _SharedEpoch()  # a worker's copy choosing its own epoch keeps it
        self._shared.publish(epoch, 0)
        self._pending = None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self._check_open()
        self._stop_run()
        topology = worker_topology(self._rank, self._world_size)
        try:
            epoch, state = self._next_start(topology)
        except StateError as exc:
            if get_worker_info() is None:
                raise
            return _Refused(exc)
        engine, self._engine = self._engine, None
        self._run = EpochRun(
            self._settings,
            epoch=epoch,
            topology=topology,
            state=None if state is None else state["position"],
            engine=engine,
        )
        return self._run

    def _next_start(self, topology: Topology) -> tuple[int, dict[str, Any] | None]:
        """The epoch and the loaded state (if any) the next iteration starts from.

        The owner of the shared epoch, or a copy that loaded a state itself, uses its
        pending state once. A DataLoader worker's copy follows the main process: its epoch,
        and the state pending there, which the copy holds if it was made after
        load_state_dict (as every epoch's workers are without ``persistent_workers``).

        Raises:
            StateError: the state was saved by another reader, or the main process loaded
                a state after this worker was started.
        """
        shared, state = self._shared, self._pending
        own = state is not None and (shared.owned or self._pending_mark == _LOCAL)
        if not own:
            mark = 0 if shared.owned else shared.mark
            if mark == 0:
                state = self._pending = None  # the main process holds none (any more)
            elif state is None or mark != self._pending_mark:
                raise StateError(
                    "load_state_dict() was called after this DataLoader's persistent workers "
                    "had started, and a state cannot reach them: create the DataLoader after "
                    "load_state_dict(), or use persistent_workers=False"
                )
        if state is None:
            return shared.epoch, None
        saved = Topology(*state["topology"])
        if saved != topology:
            raise StateError(
                f"state_dict was saved by reader {saved}, this one is {topology}: "
                "resume with the same ranks and workers"
            )
        epoch = int(state["epoch"])
        if own:
            self._pending = None
            if shared.owned:
                shared.publish(epoch, 0)
        # else: kept, as the main process keeps it until its next set_epoch
        return epoch, state

    def state_dict(self) -> dict[str, Any]:
        """The exact position: plain JSON-able data.

        Taken after any sample (or before the first), it makes :meth:`load_state_dict`
        resume with exactly the samples that would have come next.
        """
        self._check_open()
        if self._run is not None:
            return json_state(
                self._settings, self._run.epoch, self._run.topology, self._run.state()
            )
        if self._pending is not None:
            return self._pending
        topology = worker_topology(self._rank, self._world_size)
        position = {"draws": 0, "next_piece": 0, "emitted": 0, "lanes": []}
        return json_state(self._settings, self.epoch, topology, position)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`; the next iteration continues where it was.

        With DataLoader workers, load before the DataLoader starts them: persistent workers
        started earlier cannot receive the state, and refuse the next epoch.

        Raises:
            StateError: the state belongs to another dataset or configuration, or is
                corrupted.
        """
        self._check_open()
        check_state(state, self._settings)
        topology = state.get("topology")
        if not (isinstance(topology, list) and len(topology) == 4):
            raise StateError("state_dict topology is corrupted")
        epoch = state.get("epoch")
        if not isinstance(epoch, int) or epoch < 0:
            raise StateError("state_dict epoch is corrupted")
        self._stop_run()
        if self._shared.owned:
            self._loads += 1
            self._shared.publish(epoch, self._loads)  # so workers started before refuse it
            self._pending, self._pending_mark = state, self._loads
        else:  # a DataLoader worker's copy: its state, then the main process's epochs again
            self._pending, self._pending_mark = state, _LOCAL

    def stats(self) -> dict[str, Any]:
        """Statistics: samples, shuffle radius and remainder of the current epoch, and
        ``fetch``, the engine's counters since it started (it is kept from one clean epoch
        to the next, so they add up over epochs): bytes, chunks, retries by cause,
        downloads in flight (peak, time-weighted mean), the adaptive concurrency limit and
        its cuts, hedges sent and won, chunk latencies, the engine's CPU and peak RSS,
        and ``starved_s``, the time this reader waited for chunks; and ``index``: which
        index gave the sample counts, and how many shards' counts came from it, from
        ``samples_per_shard``, the local cache or counting (:class:`~._dataset.IndexInfo`)."""
        self._check_open()
        if self._run is None:
            stats = {
                "epoch": self.epoch,
                "samples": 0,
                "remainder_policy": self._settings.remainder,
            }
        else:
            stats = self._run.stats()
        return {**stats, "index": self._index.as_dict()}

    def _stop_run(self) -> None:
        if self._run is not None:
            self._engine = self._run.finish()
            self._run = None

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this ShardStream is closed")

    def close(self) -> None:
        """Stop the engine and free the ring; the stream cannot be used afterwards."""
        if not self._closed:
            self._stop_run()
            if self._engine is not None:
                self._engine.close()
                self._engine = None
            self._closed = True

    def __del__(self) -> None:
        if "_closed" in self.__dict__:  # not when __init__ failed
            self.close()  # last resort: the engine process must not outlive its stream

    def __enter__(self) -> ShardStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
