"""The emit stage: each drawn sample copied out of the ring into the dict the API promises.

The last stage of an epoch (:mod:`._run`): the one copy out of the shared-memory ring, into
``bytes``, so what user code holds never changes under it. It counts the samples it emits;
that count is its state.

One function builds a sample's dict, :func:`sample_dict`, for a sample drawn alone
(:meth:`Emit.next`) and for a run of draws (:meth:`Emit.run`) alike.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from ..order._shuffle import Lane
from ..shards._tar import Records
from ..shards._tarfast import native_dicts
from ._lanes import Item, LaneReader, Place

__all__ = ["Emit", "sample_dict"]


def sample_dict(
    records: Records, index: int, view: memoryview, url: str, views: bool
) -> dict[str, Any]:
    """Record ``index`` of ``records`` (whose fields lie in ``view``) as the dict the API
    hands out: ``__key__``, ``__url__`` and each member as ``bytes``, or with ``views`` as
    a ``memoryview`` of the ring; owned bytes as they are. Built in C where the records
    are the native table."""
    if not isinstance(records, list):
        return records.sample(index, view, url, views)
    record = records[index]
    out: dict[str, Any] = {"__key__": record[0], "__url__": url}
    if views:
        for ext, start, stop, owned in record[2:]:
            out[ext] = view[start:stop] if owned is None else owned
    else:
        for ext, start, stop, owned in record[2:]:
            out[ext] = view[start:stop].tobytes() if owned is None else owned
    return out


class Emit:
    """Copies drawn samples out of their lane's resident chunk, and counts them.

    Args:
        sources: the names of a mixed stream's sources (``__source__``), by group; empty
            for a stream without sources.

    Attributes:
        views: hand members out as ``memoryview`` s of the ring, not copied, valid until
            the next ``next()`` or ``take`` (:meth:`ShardStream.iter_views`).
        emitted: the samples built (by :meth:`next` and :meth:`run`), less those
            :meth:`unemit` took back.
    """

    def __init__(self, sources: Sequence[str] = ()) -> None:
        self.sources = list(sources)
        self.emitted = 0
        self.views = False

    def build(self, lane: LaneReader, sample: int, group: int = 0) -> dict[str, Any]:
        """The sample ``sample`` (in-shard index) of ``lane``'s resident chunk, as a dict of
        ``bytes`` with ``__key__``, ``__url__`` and, mixed, ``__source__``; not counted."""
        out = sample_dict(lane.records, sample - lane.first, lane.view, lane.shard.url, self.views)
        if self.sources:
            out["__source__"] = self.sources[group]
        return out

    def next(self, lane: LaneReader, sample: int, group: int = 0) -> dict[str, Any]:
        """:meth:`build`, counted as emitted."""
        out = self.build(lane, sample, group)
        self.emitted += 1
        return out

    def run(
        self,
        lanes: Sequence[Lane[Item]],
        places: list[Place],
        indices: Sequence[int],
        samples: Sequence[int],
    ) -> list[dict[str, Any]]:
        """The dicts of a run of draws (each draw's lane of the window shuffle by
        ``indices``, and its sample), counted as emitted, **last first**: the order in
        which ``pop()`` hands them out. ``places``: the lanes' (:class:`._lanes.Places`)."""
        views = self.views
        dicts = native_dicts()
        if dicts is not None:  # the loop in C (asyncstream/shards/_records.c)
            out = dicts(places, indices, samples, views, sample_dict)
        else:
            out = self._run(lanes, indices, samples)
        if self.sources:
            sources = self.sources
            for built, index in zip(out, reversed(indices), strict=True):
                built["__source__"] = sources[lanes[index].group]
        self.emitted += len(out)
        return out

    def _run(
        self, lanes: Sequence[Lane[Item]], indices: Sequence[int], samples: Sequence[int]
    ) -> list[dict[str, Any]]:
        """:meth:`run`'s dicts built in Python (the reference of ``_tarwalk.dicts``)."""
        views = self.views
        places = {}  # the lanes the run drew from (a few of the window's, for a short run)
        for index in set(indices):
            lane: LaneReader = lanes[index].meta["reader"]
            records = lane.records
            # sample_dict's, with its choice made once a lane: the native table's own.
            build = (
                functools.partial(sample_dict, records)
                if isinstance(records, list)
                else records.sample
            )
            places[index] = (build, lane.first, lane.view, lane.shard.url)
        out = []
        for index, sample in zip(reversed(indices), reversed(samples), strict=True):
            build, first, view, url = places[index]
            out.append(build(sample - first, view, url, views))
        return out

    def unemit(self, n: int) -> None:
        """Take back the count of ``n`` samples built but never handed out."""
        self.emitted -= n

    def state(self) -> dict[str, int]:
        """The emit stage's state as plain data: ``emitted``, the samples handed out."""
        return {"emitted": self.emitted}

    def reset(self, state: Mapping[str, int] | None = None) -> None:
        """Start counting from 0 (``None``) or from a saved :meth:`state`."""
        self.emitted = 0 if state is None else state["emitted"]
