"""The chunked window shuffle, as a pure state machine, and measures of shuffle quality.

The window holds up to ``window`` **lanes**; a lane is one open shard (one piece of the
epoch plan) with the samples of its current chunk that are not yet emitted. Before each
draw the shuffle asks its driver for what it lacks, in this order:

1. an empty lane: the driver refills it with the shard's next chunk, or closes it when the
   shard is done;
2. fewer than ``window`` lanes and pieces left: the driver opens the next piece of the plan
   (its first chunk);
3. otherwise it draws: a lane (uniformly over resident samples, ``mode="samples"``, or
   uniformly over lanes, ``mode="shards"``), then a random sample of that lane.

One lane opens per draw, so the first sample comes as soon as the first chunk is resident
and the window fills over its first ``window`` draws: the first ``window`` samples mix
fewer shards than the rest (sample *n* < ``window`` draws from at most *n + 1* shards).

Every random number is a pure function of ``(key, draw number)`` (splitmix64), so the
order depends on the seed, the epoch, the topology and the data alone, never on when
chunks arrive, and the whole state is a few integers and lists (saved by the stream as
its ``state_dict``).

Native: :meth:`WindowShuffle.draw_many` makes a run of draws in one call of the extension
:mod:`._drawc` where it is built (every install builds it), with the shuffle on, with or
without a blend (the blend's choices made there too, on its ``drawn`` and ``credit`` lists
in place); with the shuffle off it slices the lane. :meth:`WindowShuffle.draw` stays the
reference, in Python: ``ASYNCSTREAM_NATIVE=0`` in the environment (read once, at import)
or :data:`NATIVE` set to ``False`` makes ``draw_many`` a loop of ``draw``; the tests drive
both side by side.

:meth:`WindowShuffle.snapshot` is :meth:`~WindowShuffle.state` without the copy of every
lane's undrawn samples, made into the same dict later (:mod:`._journal`): for a loader that
keeps the state before every batch.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

import numpy as np

from ._journal import Base, Journal, ShuffleSnapshot

if TYPE_CHECKING:
    from ._mix import Blend

__all__ = [
    "NATIVE",
    "Outlook",
    "ShuffleQuality",
    "WindowShuffle",
    "mix_key",
    "shuffle_quality",
    "simulate_buffer_order",
    "simulate_window_order",
]

T = TypeVar("T")
_M64 = (1 << 64) - 1


def _splitmix(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def mix_key(*parts: int) -> int:
    """A 64-bit key from integers (seed, epoch, rank, ...), order-sensitive."""
    key = 0x243F6A8885A308D3
    for part in parts:
        key = _splitmix(key ^ (part & _M64))
    return key


def _below(key: int, n: int, bound: int) -> int:
    """A uniform integer in ``[0, bound)`` for draw ``n`` (Lemire's multiply-shift)."""
    return (_splitmix(key + n) * bound) >> 64


_BATCH = 1024  # random numbers made at once: 512 draws' worth
_MUL1, _MUL2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _splitmix_batch(key: int, n: int) -> list[int]:
    """``_splitmix(key + n + i)`` for the next ``_BATCH`` values of ``i``, in numpy's
    wrapping ``uint64`` arithmetic: the same numbers as :func:`_splitmix` (which masks
    every step to 64 bits) for a tenth of its cost per number."""
    x = np.arange(_BATCH, dtype=np.uint64) + np.uint64((key + n + 0x9E3779B97F4A7C15) & _M64)
    x = (x ^ (x >> np.uint64(30))) * _MUL1
    x = (x ^ (x >> np.uint64(27))) * _MUL2
    out: list[int] = (x ^ (x >> np.uint64(31))).tolist()
    return out


# The native draw: (lanes' lists, key, draws, n, shards) -> (lane indices, samples).
_Draw = Callable[[list[list[Any]], int, int, int, bool], tuple[list[int], list[Any]]]
# With a blend: (lists, lane groups, totals, drawn, credit, key, draws, n, shards).
_DrawBlend = Callable[
    [list[list[Any]], list[int], list[int], list[int], list[int], int, int, int, bool],
    tuple[list[int], list[Any]],
]


def _native_draw() -> tuple[_Draw, _DrawBlend] | tuple[None, None]:
    """The extension's draws, or None where it was not built (a source tree never
    installed: the Python draw then makes every draw, as exactly and more slowly)."""
    try:
        # Not `from ._drawc import draw`: with no .py to find, grimp reads it as `asyncstream`.
        from . import _drawc
    except ImportError:
        return None, None
    return _drawc.draw, _drawc.draw_blend


_NATIVE_DRAW, _NATIVE_BLEND = _native_draw()
# Whether WindowShuffle.draw_many draws natively; tests set it to compare the two.
NATIVE = _NATIVE_DRAW is not None and os.environ.get("ASYNCSTREAM_NATIVE", "1") != "0"


@dataclass(eq=False)
class Lane(Generic[T]):
    """One open shard in the window (compared by identity: the window's lanes are found
    by ``list.index``)."""

    piece: int
    items: list[T]
    cursor: int = 0  # for shuffle=False: items before it are emitted
    meta: dict[str, Any] = field(default_factory=dict)
    group: int = 0  # the piece's source, for a blend (:mod:`._mix`)

    @property
    def remaining(self) -> int:
        return len(self.items) - self.cursor


@dataclass(frozen=True)
class Need:
    """What the shuffle needs before its next draw."""

    kind: Literal["refill", "open", "draw", "done"]
    lane: int = -1  # for "refill"
    piece: int = -1  # for "open"


@dataclass(frozen=True)
class Outlook:
    """What the window holds and will open next (:meth:`WindowShuffle.outlook`).

    Attributes:
        lanes: each open lane's undrawn resident items and its ``meta``, in lane order.
        upcoming: positions of the pieces still to open, soonest first.
        window: the most lanes open at once.
    """

    lanes: list[tuple[int, dict[str, Any]]]
    upcoming: range
    window: int


_DRAW, _DONE = Need("draw"), Need("done")  # the needs of every draw, made once


class WindowShuffle(Generic[T]):
    """The window shuffle over ``n_pieces`` pieces, driven by :meth:`need`.

    Args:
        n_pieces: pieces in the epoch plan, opened in order.
        window: most lanes open at once (1 when ``shuffle`` is false).
        key: the random key (see :func:`mix_key`).
        mode: ``"samples"`` or ``"shards"`` (how a lane is picked).
        shuffle: ``False`` gives plan order and in-shard order.
        groups: the source of each piece, for ``blend``.
        blend: picks the source of each draw first (:class:`._mix.Blend`); the lane is
            then picked among that source's lanes, as ``mode`` says. ``None``: any lane.
    """

    def __init__(
        self,
        n_pieces: int,
        *,
        window: int,
        key: int,
        mode: Literal["samples", "shards"] = "samples",
        shuffle: bool = True,
        groups: Sequence[int] | None = None,
        blend: Blend | None = None,
    ) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if mode not in ("samples", "shards"):
            raise ValueError(f"mode must be 'samples' or 'shards', got {mode!r}")
        self.n_pieces = n_pieces
        self.window = window if shuffle else 1
        self.key = key
        self.mode = mode
        self.shuffle = shuffle
        self.lanes: list[Lane[T]] = []
        # Each lane's items, as self.lanes (the native draw's input, kept as the lanes
        # change rather than gathered at every run: a run is a few draws with 64 lanes).
        self._lists: list[list[T]] = []
        self._empty: list[Lane[T]] = []  # lanes that may need a refill, checked by need()
        self.next_piece = 0
        self.draws = 0
        if blend is not None and (groups is None or len(groups) != n_pieces):
            raise ValueError("a blend needs the group of every piece")
        self.groups = groups
        self.blend = blend
        self._lane_groups: list[int] = []  # each open lane's group, as self.lanes
        self._open = [0] * (max(groups, default=0) + 1 if groups else 1)  # lanes per group
        self._items = 0  # len(lane.items) summed over the lanes
        self._random: list[int] = []  # _splitmix(key + n) for n from _random_from on
        self._random_from = 0
        self._journal: Journal | None = None  # since the last snapshot's base (snapshot())
        # Bumped by every open, refill, close and reset: a reader of the lanes that keeps
        # something per lane (the stream's places of their samples) knows it is current.
        self.changes = 0

    def _group(self, piece: int) -> int:
        return 0 if self.groups is None else self.groups[piece]

    def need(self) -> Need:
        """What to do next: refill a lane, open a piece, draw, or stop."""
        while self._empty:  # lanes that a draw (or an empty chunk) left with nothing
            lane = self._empty[-1]
            if lane.remaining == 0:
                try:
                    return Need("refill", lane=self.lanes.index(lane))
                except ValueError:
                    pass  # closed since
            self._empty.pop()  # refilled or closed since
        # One more lane per draw until the window is full: the first sample needs one chunk.
        open_ = len(self.lanes)
        if open_ < self.window and open_ <= self.draws and self.next_piece < self.n_pieces:
            return Need("open", piece=self.next_piece)
        return _DRAW if open_ else _DONE

    def open(self, items: list[T], meta: dict[str, Any] | None = None) -> Lane[T]:
        """Open the next piece with its first chunk's samples."""
        lane = Lane(self.next_piece, items, meta=meta or {}, group=self._group(self.next_piece))
        self.lanes.append(lane)
        self._lists.append(items)
        self._lane_groups.append(lane.group)
        self._open[lane.group] += 1
        self._items += len(items)
        self.next_piece += 1
        self.changes += 1
        if not items:
            self._empty.append(lane)
        if self._journal is not None:
            self._journal.open(lane.piece, items)
            self._noted(self._journal)
        return lane

    def refill(self, lane: int, items: list[T]) -> None:
        """Give an empty lane the samples of its shard's next chunk."""
        self._items += len(items) - len(self.lanes[lane].items)
        self.lanes[lane].items = self._lists[lane] = items
        self.lanes[lane].cursor = 0
        self.changes += 1
        if self._journal is not None:
            self._journal.refill(lane, items)
            self._noted(self._journal)

    def close(self, lane: int) -> Lane[T]:
        """Remove an empty lane whose shard is done."""
        self._open[self._lane_groups.pop(lane)] -= 1
        closed = self.lanes.pop(lane)
        del self._lists[lane]
        self._items -= len(closed.items)
        self.changes += 1
        if self._journal is not None:
            self._journal.close(lane)
            self._noted(self._journal)
        return closed

    def draw(self) -> tuple[int, T]:
        """Remove and return ``(lane index, sample)`` for the next draw."""
        if not self.shuffle:
            lane = self.lanes[0]
            if self.blend is not None:
                self.blend.choose((lane.group,))
            item = lane.items[lane.cursor]
            lane.cursor += 1
            self.draws += 1
            if lane.cursor == len(lane.items):
                self._empty.append(lane)
            if self._journal is not None:
                self._journal.draw(0)
                self._noted(self._journal)
            return 0, item
        n = 2 * self.draws
        at = n - self._random_from
        random = self._random
        if not 0 <= at < len(random) - 1:
            random = self._random = _splitmix_batch(self.key, n)
            self._random_from, at = n, 0
        lanes = self.lanes
        if self.blend is not None:
            index = self._blended(self.blend, n)
        elif self.mode == "shards":
            index = (random[at] * len(lanes)) >> 64  # _below(key, n, ...)
        else:
            r = (random[at] * self._items) >> 64
            index = 0
            for lane in lanes:
                size = len(lane.items)
                if r < size:
                    break
                r -= size
                index += 1
        items = lanes[index].items
        pick = (random[at + 1] * len(items)) >> 64  # _below(key, n + 1, len(items))
        item = items[pick]
        items[pick] = items[-1]
        items.pop()
        self.draws += 1
        self._items -= 1
        if not items:
            self._empty.append(lanes[index])
        if self._journal is not None:
            self._journal.draw(index)
            self._noted(self._journal)
        return index, item

    def draw_many(self, n: int) -> tuple[list[int], list[T]]:
        """Up to ``n`` draws in a row, as many calls of :meth:`draw` make them while
        :meth:`need` asks for nothing else: none where it asks for something now, and the
        run ends after the draw that empties a lane, or before the draw that a lane must
        open for. Returns each draw's lane index and sample, in order."""
        if n <= 0 or self.need() is not _DRAW:
            return [], []
        lanes = self.lanes
        open_ = len(lanes)
        if open_ < self.window and self.next_piece < self.n_pieces:
            n = min(n, open_ - self.draws)  # a lane opens before draw number open_
        blend = self.blend
        if not NATIVE or _NATIVE_DRAW is None or _NATIVE_BLEND is None:
            return self._draw_each(n)
        if not self.shuffle:  # lanes[0] in order, up to its end
            lane = lanes[0]
            samples = lane.items[lane.cursor : lane.cursor + n]
            lane.cursor += len(samples)
            self.draws += len(samples)
            if blend is not None:  # choose((group,)) each time: credit unchanged
                blend.drawn[lane.group] += len(samples)
            if lane.cursor == len(lane.items):
                self._empty.append(lane)
            firsts = [0] * len(samples)
            if self._journal is not None:
                self._journal.draws(firsts)
                self._noted(self._journal)
            return firsts, samples
        lists = self._lists
        if blend is None:
            indices, samples = _NATIVE_DRAW(lists, self.key, self.draws, n, self.mode == "shards")
        else:
            try:
                indices, samples = _NATIVE_BLEND(
                    lists,
                    self._lane_groups,
                    blend.totals,
                    blend.drawn,
                    blend.credit,
                    self.key,
                    self.draws,
                    n,
                    self.mode == "shards",
                )
            except OverflowError:  # the blend's numbers beyond 64 bits: Python's ints
                return self._draw_each(n)
        self.draws += len(indices)
        self._items -= len(indices)
        if indices and not lanes[indices[-1]].items:
            self._empty.append(lanes[indices[-1]])
        if self._journal is not None:
            self._journal.draws(indices)
            self._noted(self._journal)
        return indices, samples

    def _draw_each(self, n: int) -> tuple[list[int], list[T]]:
        """:meth:`draw_many` a :meth:`draw` at a time (the reference)."""
        indices: list[int] = []
        samples: list[T] = []
        while len(indices) < n and not self._empty:
            index, sample = self.draw()
            indices.append(index)
            samples.append(sample)
        return indices, samples

    def undraw(self, indices: Sequence[int], samples: Sequence[T]) -> None:
        """Put back the last draws, as :meth:`draw_many` returned them (or the tail of what
        it returned), before any lane opens, refills or closes: the state, the blend's
        included, is then exactly as before them."""
        if len(indices) != len(samples):
            raise ValueError("undraw needs one sample per lane index")
        if self._journal is not None and not self._journal.undraw(len(indices)):
            self._journal = None  # the next snapshot starts a new base
        blend = self.blend
        if not self.shuffle:
            lane = self.lanes[0]
            lane.cursor -= len(indices)
            self.draws -= len(indices)
            if blend is not None:
                blend.drawn[lane.group] -= len(indices)
            return
        available = [g for g, lanes in enumerate(self._open) if lanes] if blend else []
        for index, sample in zip(reversed(indices), reversed(samples), strict=True):
            if blend is not None:
                blend.unchoose(self._lane_groups[index], available)
            self.draws -= 1
            items = self.lanes[index].items
            pick = _below(self.key, 2 * self.draws + 1, len(items) + 1)  # as draw() picked
            if pick < len(items):  # undo the swap-remove: the last sample back at the end
                items.append(items[pick])
                items[pick] = sample
            else:
                items.append(sample)
            self._items += 1

    def _blended(self, blend: Blend, n: int) -> int:
        """The lane of draw ``n``: the blend's source, then one of its lanes."""
        groups = self._lane_groups
        group = blend.choose([g for g, lanes in enumerate(self._open) if lanes])
        if self.mode == "shards":
            index = -1
            for _ in range(_below(self.key, n, self._open[group]) + 1):
                index = groups.index(group, index + 1)
            return index
        among = [i for i, g in enumerate(groups) if g == group]
        r = _below(self.key, n, sum(len(self.lanes[i].items) for i in among))
        for index in among[:-1]:
            if r < len(self.lanes[index].items):
                return index
            r -= len(self.lanes[index].items)
        return among[-1]

    def state(self) -> dict[str, Any]:
        """The shuffle's state as plain data: ``draws``, ``next_piece`` and each open
        lane's ``piece`` and ``remaining`` (undrawn) items, in the lane's current order.
        The items must be plain data (the stream's are in-shard sample indices)."""
        return {
            "draws": self.draws,
            "next_piece": self.next_piece,
            "lanes": [
                {"piece": lane.piece, "remaining": lane.items[lane.cursor :]} for lane in self.lanes
            ],
        }

    def snapshot(self) -> ShuffleSnapshot:
        """The state now, as :meth:`state` gives it, without copying the lanes' samples:
        its ``state()`` makes that dict on demand, in any thread, and never changes as the
        shuffle goes on (:mod:`._journal`). The first snapshot copies the lanes once, as a
        base; the shuffle then notes each draw and each lane opened, refilled or closed,
        until the journal is long enough that a new base is cheaper."""
        journal = self._journal
        if journal is None:
            base = Base(
                self.draws,
                tuple(
                    (lane.piece, tuple(lane.items[lane.cursor :] if lane.cursor else lane.items))
                    for lane in self.lanes
                ),
            )
            journal = self._journal = Journal(base)
        return journal.snapshot(self.key, self.shuffle, self.draws, self.next_piece)

    def _noted(self, journal: Journal) -> None:
        """Drop a journal past its limit (the snapshots on it keep theirs)."""
        if journal.full:
            self._journal = None

    def reset(
        self, state: Mapping[str, Any] | None = None, meta: Sequence[dict[str, Any]] = ()
    ) -> None:
        """Start over (``state=None``: before the first draw) or continue exactly from a
        saved :meth:`state`; ``meta`` gives each saved lane's ``meta``, in order.

        Raises:
            ValueError: a state that does not fit this shuffle (a lane's piece not among
                the pieces opened, more lanes than the window, a malformed field).
        """
        if state is None:
            state = {"draws": 0, "next_piece": 0, "lanes": []}
        draws, next_piece, lanes = state["draws"], state["next_piece"], state["lanes"]
        if not isinstance(lanes, list) or len(lanes) > self.window:
            raise ValueError("a shuffle state's lanes must be a list of at most window lanes")
        if meta and len(meta) != len(lanes):
            raise ValueError("a shuffle reset needs the meta of every lane, or none")
        if not 0 <= next_piece <= self.n_pieces or draws < 0:
            raise ValueError("a shuffle state's draws or next_piece is out of range")
        if any(not 0 <= lane["piece"] < next_piece for lane in lanes):
            raise ValueError("a lane's piece is not among the pieces opened")
        self.draws, self.next_piece = draws, next_piece
        self._journal = None
        self.lanes = [
            Lane(
                lane["piece"],
                list(lane["remaining"]),
                meta=dict(meta[i]) if meta else {},
                group=self._group(lane["piece"]),
            )
            for i, lane in enumerate(lanes)
        ]
        self._lists = [lane.items for lane in self.lanes]
        self._lane_groups = [lane.group for lane in self.lanes]
        self._items = sum(len(lane.items) for lane in self.lanes)
        self._open = [0] * len(self._open)
        for group in self._lane_groups:
            self._open[group] += 1
        self._empty = [lane for lane in self.lanes if not lane.items]
        self.changes += 1

    def outlook(self, budget: int) -> Outlook:
        """What the window holds and opens next, for a prefetch stage to rank chunks by:
        each open lane's undrawn resident count and meta, and the next ``budget`` pieces
        it will open, in order."""
        return Outlook(
            lanes=[(lane.remaining, lane.meta) for lane in self.lanes],
            upcoming=range(self.next_piece, min(self.n_pieces, self.next_piece + budget)),
            window=self.window,
        )

    def resident(self) -> int:
        """Samples resident and not yet emitted: the effective shuffle radius."""
        return sum(lane.remaining for lane in self.lanes)


@dataclass(frozen=True)
class ShuffleQuality:
    """Measures of how well an emitted order is shuffled.

    Attributes:
        correlation: Pearson correlation between each sample's input index and its
            output position (0 for a perfect shuffle, 1 for none).
        distinct_classes_per_batch: mean number of distinct labels per batch, or ``nan``
            without labels.
        batch_size: the batch size used.
    """

    correlation: float
    distinct_classes_per_batch: float
    batch_size: int


def shuffle_quality(
    order: Sequence[int], labels: Sequence[int] | None = None, *, batch_size: int = 64
) -> ShuffleQuality:
    """Measure an emitted order against its input order.

    Args:
        order: the input indices (position in the unshuffled dataset) in emitted order.
        labels: the class of each emitted sample, in emitted order.
        batch_size: for distinct classes per batch (the last partial batch is ignored).

    Returns:
        The Pearson correlation between input index and output position, and the mean
        number of distinct classes per batch.
    """
    n = len(order)
    if n < 2:
        raise ValueError("need at least two samples to measure a shuffle")
    if labels is not None and len(labels) != n:
        raise ValueError(f"labels has {len(labels)} entries, order has {n}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    mean_x = (n - 1) / 2
    mean_y = sum(order) / n
    cov = sum((i - mean_x) * (y - mean_y) for i, y in enumerate(order))
    var_x = sum((i - mean_x) ** 2 for i in range(n))
    var_y = sum((y - mean_y) ** 2 for y in order)
    corr = cov / math.sqrt(var_x * var_y) if var_y > 0 else 0.0
    distinct = math.nan
    if labels is not None and n >= batch_size:
        batches = n // batch_size
        distinct = (
            sum(len(set(labels[b * batch_size : (b + 1) * batch_size])) for b in range(batches))
            / batches
        )
    return ShuffleQuality(corr, distinct, batch_size)


def simulate_window_order(
    samples_per_shard: Sequence[int],
    *,
    window: int,
    chunk_samples: int,
    seed: int,
    epoch: int = 0,
    mode: Literal["samples", "shards"] = "samples",
    shuffle: bool = True,
) -> list[int]:
    """The order a single reader emits, simulated with chunks counted in samples.

    Drives :class:`WindowShuffle` the way the stream does, over the epoch plan of one
    reader (``Topology()``): it opens the plan's pieces in order with their first chunk,
    refills an empty lane with its shard's next chunk or closes it when the piece is done,
    and emits each draw. A piece's samples ``first <= i < stop`` are split into consecutive
    chunks of ``chunk_samples`` samples, each in in-shard order. The memory this models is
    ``(window + prefetch) * chunk_samples`` samples (the order depends on neither ``prefetch``
    nor ``inflight``: only the memory does).

    Args:
        samples_per_shard: samples in each shard, in dataset order.
        window: most shards open at once.
        chunk_samples: samples per chunk (a shard's size or more: whole shards).
        seed: the run's seed.
        epoch: the epoch number.
        mode: ``"samples"`` or ``"shards"`` (see :class:`WindowShuffle`).
        shuffle: permute shards and samples; ``False`` gives dataset order.

    Returns:
        The emitted samples as global input indices: the shard's offset in the dataset
        (the samples of the shards before it, in dataset order) plus the in-shard index.
    """
    from asyncstream.order._plan import Topology, epoch_plan

    if chunk_samples < 1:
        raise ValueError(f"chunk_samples must be >= 1, got {chunk_samples}")
    offsets = [0]
    for count in samples_per_shard:
        offsets.append(offsets[-1] + count)
    pieces = epoch_plan(
        samples_per_shard, seed=seed, epoch=epoch, shuffle=shuffle, topology=Topology()
    )[0]

    def chunk(piece: int, start: int) -> list[int]:
        p = pieces[piece]
        base = offsets[p.shard]
        return list(range(base + start, base + min(start + chunk_samples, p.stop)))

    state: WindowShuffle[int] = WindowShuffle(
        len(pieces), window=window, key=mix_key(seed, epoch, 0, 0), mode=mode, shuffle=shuffle
    )
    next_start: dict[int, int] = {}  # piece -> in-shard index of its next chunk
    out: list[int] = []
    while True:
        need = state.need()
        if need.kind == "draw":
            out.append(state.draw()[1])
        elif need.kind == "refill":
            piece = state.lanes[need.lane].piece
            start = next_start[piece]
            if start < pieces[piece].stop:
                state.refill(need.lane, chunk(piece, start))
                next_start[piece] = start + chunk_samples
            else:
                state.close(need.lane)
        elif need.kind == "open":
            first = pieces[need.piece].first
            state.open(chunk(need.piece, first))
            next_start[need.piece] = first + chunk_samples
        else:
            return out


def simulate_buffer_order(n: int, *, buffer: int, seed: int) -> list[int]:
    """The order of the classic streaming shuffle buffer over the inputs ``0 .. n - 1``.

    As webdataset's ``shuffle(bufsize)`` and tf.data's ``shuffle(buffer_size)``: the buffer
    takes the first ``buffer`` inputs in order; then for each next input, a uniformly
    random buffer element is emitted and the input takes its place; at the end the buffer
    is emitted in random order. Memory: ``buffer`` samples.

    Args:
        n: the number of inputs.
        buffer: the buffer size in samples (``>= 1``; ``>= n`` gives a full permutation).
        seed: seeds the generator.

    Returns:
        The emitted input indices.
    """
    import random

    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if buffer < 1:
        raise ValueError(f"buffer must be >= 1, got {buffer}")
    rng = random.Random(seed)
    held = list(range(min(buffer, n)))
    out: list[int] = []
    for item in range(len(held), n):
        pick = rng.randrange(len(held))
        out.append(held[pick])
        held[pick] = item
    rng.shuffle(held)
    out.extend(held)
    return out
