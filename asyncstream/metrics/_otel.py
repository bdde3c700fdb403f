"""OpenTelemetry: a stream's figures as observable instruments of the metrics API.

Each family of :data:`~._names.FAMILIES` is one asynchronous instrument (an
``ObservableCounter`` for a counter, an ``ObservableGauge`` for a gauge) whose callback
reads the stream when the SDK's reader collects (a ``PeriodicExportingMetricReader``'s
interval, a ``PrometheusMetricReader``'s scrape): nothing runs per sample, and ``stats()``
is read once per collection however many instruments ask. Only ``opentelemetry-api`` is
needed (the ``otel`` extra), imported when an export starts; the SDK and its exporters
are the application's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

from ._names import FAMILIES
from ._source import Source, source_of
from ._tally import Point

__all__ = ["OpenTelemetryExport", "export_opentelemetry"]

_SAME_COLLECTION_S = 0.5  # callbacks this close together share one reading


class _Readings:
    """One reading of the source shared by the callbacks of one collection."""

    def __init__(self, source: Source) -> None:
        self._source = source
        self._lock = threading.Lock()
        self._at = -1e9
        self._by_family: dict[str, list[Point]] = {}
        self.closed = False

    def family(self, name: str) -> list[Point]:
        if self.closed:
            return []
        with self._lock:
            now = time.monotonic()
            if now - self._at > _SAME_COLLECTION_S:
                by_family: dict[str, list[Point]] = {}
                for point in self._source.points():
                    by_family.setdefault(point.family, []).append(point)
                self._by_family, self._at = by_family, now
            return self._by_family.get(name, [])


class OpenTelemetryExport:
    """A running OpenTelemetry export (:func:`export_opentelemetry`). The metrics API has
    no way to remove an instrument: :meth:`close` makes its callbacks observe nothing."""

    def __init__(self, readings: _Readings, source: Source, instruments: list[Any]) -> None:
        self._readings = readings
        self._source = source
        self.instruments = instruments
        """The asynchronous instruments made, one per metric family."""

    def __repr__(self) -> str:
        return (
            f"OpenTelemetryExport({len(self.instruments)} instruments, "
            f"closed={self._readings.closed})"
        )

    def close(self) -> None:
        """Observe nothing from now on. Idempotent."""
        if not self._readings.closed:
            self._readings.closed = True
            self._source.detach()

    def __enter__(self) -> OpenTelemetryExport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def export_opentelemetry(source: Any, *, meter_provider: Any = None) -> OpenTelemetryExport:
    """Export a stream's figures (``stats()``) as OpenTelemetry metrics.

    One asynchronous instrument per metric of docs/observability.md, of the same name
    (``asyncstream_fetch_bytes``, unit ``By``; counters cumulative), with the attributes
    the Prometheus labels are (``rank``, ``worker``; ``store``, ``cause``, ...). The
    instruments observe the readers of this process (a stream read here, or a
    DALIImageLoader, which gathers its DataLoader workers' figures); for a
    :class:`~asyncstream.ShardLoader`'s workers, use :func:`export_prometheus`'s
    multiprocess mode.

    Args:
        source: a :class:`~asyncstream.ShardStream`, a stage on one, a
            :class:`~asyncstream.ShardLoader` (or DataLoader) over those, or a
            ``DALIImageLoader``. Held weakly.
        meter_provider: the provider to make the meter with; default the global one
            (``opentelemetry.metrics.get_meter_provider()``).

    Raises:
        ImportError: opentelemetry-api is not installed (``pip install asyncstream[otel]``).
        TypeError: ``source`` is not one of the above.
    """
    try:
        from opentelemetry import metrics
    except ImportError as exc:
        raise ImportError(
            "exporting to OpenTelemetry needs opentelemetry-api: pip install asyncstream[otel]"
        ) from exc
    found = source_of(source)
    provider = metrics.get_meter_provider() if meter_provider is None else meter_provider
    meter = provider.get_meter("asyncstream")
    readings = _Readings(found)

    def callback(name: str) -> Any:
        def observe(options: Any) -> Iterable[Any]:
            return [
                metrics.Observation(point.value, dict(point.labels))
                for point in readings.family(name)
            ]

        return observe

    instruments = []
    for name, family in FAMILIES.items():
        make = (
            meter.create_observable_counter
            if family.kind == "counter"
            else meter.create_observable_gauge
        )
        instruments.append(
            make(name, callbacks=[callback(name)], unit=family.unit, description=family.help)
        )
    found.attach()
    return OpenTelemetryExport(readings, found, instruments)
