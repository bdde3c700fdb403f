"""What an exporter reads: a stream (or a stage or loader on one), or a DALI loader.

:func:`source_of` finds, under what the user gave (a :class:`~asyncstream.ShardStream`,
``stream.map(fn)``, a :class:`~asyncstream.ShardLoader` or any DataLoader over those, a
``DALIImageLoader``), the object whose ``stats()`` to read, and :class:`Source` turns one
reading of it into :class:`~._tally.Point` records with the reader's labels (``rank``,
``worker``). The metrics layer stands below the stream, so it knows the stream by what it
offers (``_export_stats``, ``_metrics_hook``), never by import.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from ._hook import StreamMetrics
from ._names import readings
from ._tally import Point, Tally

__all__ = ["Source", "source_of"]

_log = logging.getLogger("asyncstream.metrics")

_tallies: weakref.WeakKeyDictionary[Any, Tally] = weakref.WeakKeyDictionary()


def _is_stream(obj: Any) -> bool:
    return callable(getattr(obj, "_export_stats", None)) and callable(
        getattr(obj, "_metrics_hook", None)
    )


def source_of(obj: Any) -> Source:
    """The :class:`Source` under ``obj``.

    Raises:
        TypeError: ``obj`` is none of a ShardStream, a stage on one, a DataLoader over
            those, or a DALIImageLoader.
    """
    seen = obj
    for _ in range(4):  # a loader's dataset, a stage's stream
        if _is_stream(seen):
            return Source(seen, seen._metrics_hook())
        if callable(getattr(seen, "stats", None)) and _is_stream(getattr(seen, "_stream", None)):
            return Source(seen, None)  # a DALIImageLoader: its stats() gathers its workers'
        inner = getattr(seen, "stream", None)
        if inner is None:
            inner = getattr(seen, "dataset", None)
        if inner is None:
            break
        seen = inner
    raise TypeError(
        "metrics are exported from a ShardStream, a stage on one (stream.map), a "
        f"ShardLoader or DataLoader over those, or a DALIImageLoader; got {type(obj).__name__}"
    )


class Source:
    """One thing to read, held weakly (an exporter never keeps a stream open).

    Args:
        obj: the stream, or a DALIImageLoader.
        hook: the stream's hook (None for a loader).
    """

    def __init__(self, obj: Any, hook: StreamMetrics | None) -> None:
        self._ref = weakref.ref(obj)
        self.hook = hook
        stream = obj if hook is not None else obj._stream
        self.rank = str(getattr(stream, "rank", 0))
        if hook is None and obj not in _tallies:
            _tallies[obj] = Tally()

    def attach(self) -> None:
        """An in-process exporter reads this source: the stream's last reading of each
        epoch, taken at its end, counts for it."""
        if self.hook is not None:
            self.hook.readers.append(self)

    def detach(self) -> None:
        """The exporter stopped."""
        if self.hook is not None and self in self.hook.readers:
            self.hook.readers.remove(self)

    @property
    def alive(self) -> bool:
        """Whether the object is still there (not collected)."""
        return self._ref() is not None

    def points(self) -> list[Point]:
        """Read the object once; its points (none once it is closed or collected)."""
        obj = self._ref()
        if obj is None:
            return []
        try:
            stats = obj._export_stats() if self.hook is not None else obj.stats()
        except RuntimeError:  # closed
            return []
        except Exception:  # a reading that fails is skipped, never the training's failure
            _log.debug("asyncstream metrics: reading stats() failed", exc_info=True)
            return []
        tally = self.hook.tally if self.hook is not None else _tallies[obj]
        out: list[Point] = []
        for reading in readings(stats):
            if reading.reader:
                worker = reading.reader
            elif self.hook is not None:
                worker = str(self.hook.worker)
            else:
                worker = "main"  # a DALI loader's own figures, in the training's process
            labels = (("rank", self.rank), ("worker", worker))
            out += tally.update(labels, reading.items, reading.era)
        return out
