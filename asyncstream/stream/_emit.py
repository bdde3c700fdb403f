"""The emit stage: each drawn sample copied out of the ring into the dict the API promises.

The last stage of an epoch (:mod:`._run`): the one copy out of the shared-memory ring, into
``bytes``, so what user code holds never changes under it. It counts the samples it emits;
that count is its state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ._lanes import LaneReader

__all__ = ["Emit"]


class Emit:
    """Copies drawn samples out of their lane's resident chunk, and counts them.

    Args:
        sources: the names of a mixed stream's sources (``__source__``), by group; empty
            for a stream without sources.

    Attributes:
        views: hand members out as ``memoryview`` s of the ring, not copied, valid until
            the next sample is drawn (:meth:`ShardStream.iter_views`).
    """

    def __init__(self, sources: Sequence[str] = ()) -> None:
        self.sources = list(sources)
        self.emitted = 0
        self.views = False

    def next(self, lane: LaneReader, sample: int, group: int = 0) -> dict[str, Any]:
        """The sample ``sample`` (in-shard index) of ``lane``'s resident chunk, as a dict of
        ``bytes`` with ``__key__``, ``__url__`` and, mixed, ``__source__``."""
        record = lane.records[sample - lane.first]
        out: dict[str, Any] = {"__key__": record[0], "__url__": lane.shard.url}
        view = lane.view
        if self.views:
            for ext, start, stop, owned in record[2:]:
                out[ext] = view[start:stop] if owned is None else owned
        else:
            for ext, start, stop, owned in record[2:]:
                out[ext] = view[start:stop].tobytes() if owned is None else owned
        if self.sources:
            out["__source__"] = self.sources[group]
        self.emitted += 1
        return out

    def state(self) -> dict[str, int]:
        """The emit stage's state as plain data: ``emitted``, the samples handed out."""
        return {"emitted": self.emitted}

    def reset(self, state: Mapping[str, int] | None = None) -> None:
        """Start counting from 0 (``None``) or from a saved :meth:`state`."""
        self.emitted = 0 if state is None else state["emitted"]
