"""Prometheus: a stream's figures on a scrape endpoint, or in the multiprocess directory.

Two ways, chosen by ``PROMETHEUS_MULTIPROC_DIR`` (prometheus_client's multiprocess mode):

* **in process** (not set): a collector registered in a registry reads ``stats()`` at
  each scrape, in the scraping thread; it sees the readers of its own process (a stream
  read without DataLoader workers, or a DALI loader, which gathers its workers').
* **multiprocess** (set before Python starts): every process that reads the stream (the
  main process, each DataLoader worker) reads it every ``interval`` seconds and at the end
  of each epoch, in a thread of its own, and writes its totals into the directory; the
  endpoint (:class:`~prometheus_client.multiprocess.MultiProcessCollector`) adds up the
  files at each scrape, so the workers' engines add up, each labelled by its worker.

prometheus_client is imported here only, when an export starts.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

from ._hook import Publisher, StreamMetrics
from ._names import FAMILIES
from ._source import Source, source_of
from ._tally import Point

__all__ = ["PrometheusExport", "export_prometheus"]

_LABELS = ("rank", "worker")
_metrics: dict[str, Any] = {}  # this process's multiprocess-mode metrics, by family
_metrics_lock = threading.Lock()
_in_registries: dict[int, Any] = {}  # id(registry) -> its export's collector (one each)


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:  # pragma: no cover - a dependency
        raise ImportError("exporting to Prometheus needs prometheus-client") from exc
    return prometheus_client


def _multiprocess_ready() -> bool:
    """Whether prometheus_client writes values into PROMETHEUS_MULTIPROC_DIR."""
    from prometheus_client import values

    return bool(getattr(values.ValueClass, "_multiprocess", False))


class _Collector:
    """A prometheus_client collector reading its sources at each scrape."""

    def __init__(self, sources: list[Source]) -> None:
        self.sources = sources
        self.closed = False

    def describe(self) -> list[Any]:
        return []  # nothing read at registration

    def collect(self) -> list[Any]:
        if self.closed:
            return []
        points: list[Point] = []
        for source in self.sources:
            points += source.points()
        return _families(points)


def _families(points: list[Point]) -> list[Any]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    by_family: dict[str, list[Point]] = {}
    for point in points:
        by_family.setdefault(point.family, []).append(point)
    out: list[Any] = []
    for name, mine in by_family.items():
        family = FAMILIES[name]
        labels = [label for label, _ in mine[0].labels]
        kind = CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily
        metric = kind(name, family.help, labels=labels)
        for point in mine:
            metric.add_metric([value for _, value in point.labels], point.value)
        out.append(metric)
    return out


def _metric(name: str) -> Any:
    """This process's multiprocess-mode metric of family ``name`` (one per process, shared
    by every stream it reads: one series per label set in the directory's files)."""
    with _metrics_lock:
        metric = _metrics.get(name)
        if metric is None:
            prometheus_client = _prometheus()
            family = FAMILIES[name]
            labels = _LABELS + family.labels
            if family.kind == "counter":
                metric = prometheus_client.Counter(name, family.help, labels, registry=None)
            else:
                metric = prometheus_client.Gauge(
                    name, family.help, labels, registry=None, multiprocess_mode="mostrecent"
                )
            _metrics[name] = metric
        return metric


class _Publisher:
    """Writes one reader process's totals into the multiprocess directory: every
    ``interval`` seconds in a thread of its own, and when asked (an epoch's end)."""

    def __init__(self, source: Source, interval: float) -> None:
        self._source = source
        self._interval = interval
        self._lock = threading.Lock()
        self._sent: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="asyncstream-metrics", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval) and self._source.alive:
            self.publish()

    def publish(self) -> None:
        with self._lock:
            for point in self._source.points():
                child = _metric(point.family).labels(*(value for _, value in point.labels))
                if FAMILIES[point.family].kind == "gauge":
                    child.set(point.value)
                    continue
                key = (point.family, point.labels)
                grown = point.value - self._sent.get(key, 0.0)
                if grown > 0:
                    child.inc(grown)
                    self._sent[key] = point.value

    def close(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=10.0)
        self.publish()


@dataclass(frozen=True)
class _Multiprocess:
    """The multiprocess exporter as it travels with the stream into workers."""

    interval: float

    def start(self, stream: Any, metrics: StreamMetrics) -> Publisher:
        return _Publisher(Source(stream, metrics), self.interval)


class PrometheusExport:
    """A running Prometheus export (:func:`export_prometheus`); close it to stop it.

    Attributes:
        port: the scrape endpoint's port (the one bound, when 0 was asked), or None.
        multiprocess: whether the figures go through ``PROMETHEUS_MULTIPROC_DIR``.
    """

    def __init__(
        self,
        *,
        multiprocess: bool,
        collector: _Collector | None,
        registry: Any,
        publishing: tuple[StreamMetrics, _Multiprocess] | _Publisher | None,
    ) -> None:
        self.port: int | None = None  # set by export_prometheus once its server listens
        self.multiprocess = multiprocess
        self._server: Any = None
        self._collector = collector
        self._registry = registry
        self._publishing = publishing
        self._closed = False

    def __repr__(self) -> str:
        mode = "multiprocess" if self.multiprocess else "in process"
        return f"PrometheusExport(port={self.port}, {mode}, closed={self._closed})"

    def close(self) -> None:
        """Stop serving, unregister the collector and stop this process's publishing
        (DataLoader workers' publishers stop with their streams). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._collector is not None:
            self._collector.closed = True
            if self._registry is not None:
                self._registry.unregister(self._collector)
                _in_registries.pop(id(self._registry), None)
            for source in self._collector.sources:
                source.detach()
        if isinstance(self._publishing, _Publisher):
            self._publishing.close()
        elif self._publishing is not None:
            hook, publishing = self._publishing
            hook.remove(publishing)

    def __enter__(self) -> PrometheusExport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def export_prometheus(
    source: Any,
    *,
    port: int | None = None,
    addr: str = "127.0.0.1",
    registry: Any = None,
    interval: float = 5.0,
) -> PrometheusExport:
    """Export a stream's figures (``stats()``) as Prometheus metrics.

    The metrics and their labels (``rank``, ``worker``; ``store``, ``cause``, ...) are
    listed in docs/observability.md. Nothing is added to the per-sample path: ``stats()``
    is read at a scrape, or every ``interval`` seconds and at each epoch's end.

    Without ``PROMETHEUS_MULTIPROC_DIR``, a collector registered in ``registry`` reads the
    readers of this process at each scrape (a stream read in this process, or a
    DALIImageLoader, which gathers its DataLoader workers' figures). With it (set before
    Python starts, as prometheus_client's multiprocess mode asks), every process that reads
    the stream, each DataLoader worker included, writes its totals into that directory
    from its first ``iter()`` on (export before iterating), and the endpoint adds up the
    files at each scrape: a ShardLoader's workers add up.

    Args:
        source: a :class:`~asyncstream.ShardStream`, a stage on one (``stream.map``), a
            :class:`~asyncstream.ShardLoader` (or DataLoader) over those, or a
            ``DALIImageLoader``. Held weakly: the export never keeps it open.
        port: serve a scrape endpoint (``/metrics``) on this port (0: any free one, see
            :attr:`PrometheusExport.port`); None: no endpoint (scrape ``registry``
            yourself, or, in multiprocess mode, your own MultiProcessCollector).
        addr: the endpoint's address; the default serves this machine only, give
            ``"0.0.0.0"`` for a scraper on another machine.
        registry: where the collector registers (in-process mode); default
            ``prometheus_client.REGISTRY``. Not used in multiprocess mode, whose endpoint
            serves a registry of its own holding the MultiProcessCollector.
        interval: seconds between a reader process's writes in multiprocess mode.

    Raises:
        TypeError: ``source`` is not one of the above.
        ValueError: ``interval`` not positive, ``port`` out of range, or (in process)
            ``registry`` already serving an export that is not closed (two streams' series
            would clash: give each its own registry and port).
        RuntimeError: ``PROMETHEUS_MULTIPROC_DIR`` is set but prometheus_client was
            imported before it was (its values are then not written to the directory).
        OSError: the port cannot be bound.
    """
    if isinstance(interval, bool) or not isinstance(interval, int | float) or interval <= 0:
        raise ValueError(f"interval must be a number of seconds > 0, got {interval!r}")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int)):
        raise ValueError(f"port must be an integer in 0..65535 or None, got {port!r}")
    if port is not None and not 0 <= port <= 65535:
        raise ValueError(f"port must be an integer in 0..65535 or None, got {port!r}")
    found = source_of(source)
    prometheus_client = _prometheus()
    multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
    if multiprocess and not _multiprocess_ready():
        raise RuntimeError(
            "PROMETHEUS_MULTIPROC_DIR is set, but prometheus_client was imported before it "
            "was, so its values are not written to the directory: set it before Python starts"
        )
    server: Any = None
    collector: _Collector | None = None
    publishing: tuple[StreamMetrics, _Multiprocess] | _Publisher | None = None
    if multiprocess:
        from prometheus_client.multiprocess import MultiProcessCollector

        if found.hook is None:  # a DALI loader gathers its workers': published from here
            publishing = _Publisher(found, float(interval))
        else:  # published by each process that reads the stream, from its first iter()
            spec = _Multiprocess(float(interval))
            found.hook.publishing.append(spec)
            publishing = (found.hook, spec)
        registry = prometheus_client.CollectorRegistry()
        collector_type: Any = MultiProcessCollector  # untyped in prometheus_client
        collector_type(registry)  # it registers itself
    else:
        registry = prometheus_client.REGISTRY if registry is None else registry
        if id(registry) in _in_registries:
            raise ValueError(
                "this registry already serves an asyncstream export (its series would "
                "clash): give another stream's export a registry of its own"
            )
        collector = _Collector([found])
        registry.register(collector)
        _in_registries[id(registry)] = collector
        found.attach()
    export = PrometheusExport(
        multiprocess=multiprocess,
        collector=collector,
        registry=None if multiprocess else registry,
        publishing=publishing,
    )
    if port is not None:
        try:
            server, _ = prometheus_client.start_http_server(port, addr=addr, registry=registry)
        except BaseException:
            export.close()
            raise
        export.port, export._server = int(server.server_port), server
    return export
