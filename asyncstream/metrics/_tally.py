"""Totals that only grow, out of ``stats()`` figures that start again.

``stats()`` gives an epoch's figures (samples, the stall meter's seconds) that start at 0
each epoch, and the fetch engine's counters, which start at 0 when an engine is replaced.
A Prometheus or OpenTelemetry counter must only grow: :class:`Tally` adds to each total
what its figure grew by since the last reading, and the whole figure when it started again
(it went down, or, for an epoch's figure, its era changed: the reader began another
iteration or epoch). Readings
may come from several threads (a scrape, an interval, the end of an epoch); each is
applied whole under one lock.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterable
from dataclasses import dataclass

from ._names import FAMILIES, Reading

__all__ = ["Point", "Tally"]


@dataclass(frozen=True, slots=True)
class Point:
    """One exported value: the family, every label (reader's and family's) and the value
    (a counter's total, a gauge's value now)."""

    family: str
    labels: tuple[tuple[str, str], ...]
    value: float


class Tally:
    """Each counter's total, grown reading by reading (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self._eras: dict[tuple[str, tuple[tuple[str, str], ...]], Hashable] = {}
        self._totals: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def update(
        self, reader: tuple[tuple[str, str], ...], items: Iterable[Reading], era: Hashable
    ) -> list[Point]:
        """Apply one reading of one reader; return its points.

        Args:
            reader: the reader's labels (``rank``, ``worker``).
            items: the reading (:func:`~._names.readings`).
            era: what names the reader's iteration (its number and epoch, as the
                figures themselves say): a change starts the epoch's figures again.
        """
        points = []
        with self._lock:
            for item in items:
                family = FAMILIES[item.family]
                labels = reader + tuple(zip(family.labels, item.labels, strict=True))
                if family.kind == "gauge":
                    points.append(Point(item.family, labels, item.value))
                    continue
                key = (item.family, labels)
                last = self._last.get(key)
                restarted = last is None or item.value < last
                if item.scope == "epoch" and self._eras.get(key) != era:
                    restarted = True
                    self._eras[key] = era
                grown = item.value if restarted else item.value - (last or 0.0)
                self._last[key] = item.value
                total = self._totals[key] = self._totals.get(key, 0.0) + grown
                points.append(Point(item.family, labels, total))
        return points
