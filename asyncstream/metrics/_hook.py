"""What a :class:`~asyncstream.ShardStream` holds once an exporter is attached to it.

A stream read by DataLoader workers is copied into each worker's process, and what it
holds goes with it: :class:`StreamMetrics` carries the exporters that publish from every
reader process (:class:`Publishing`: Prometheus's multiprocess directory), and starts
them in each process the first time the stream is iterated there. Everything else it
keeps (the totals, the threads) belongs to one process and is made again in another.

The stream tells it when an iteration begins (:meth:`StreamMetrics.begin`, with the
DataLoader worker's number) and when its epoch ends (:meth:`StreamMetrics.ended`, in the
reader's own thread: the last reading of the epoch, taken while the engine still runs).
It is never told anything per sample.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any, Protocol

from ._tally import Tally

__all__ = ["Publisher", "Publishing", "Reader", "StreamMetrics"]

_log = logging.getLogger("asyncstream.metrics")

_WORKERS_UNSEEN = (
    "asyncstream metrics: this stream is read by DataLoader workers, and the exporter "
    "attached to it reads only the process it was made in; set PROMETHEUS_MULTIPROC_DIR "
    "before starting Python to add up the workers' figures (docs/observability.md)"
)


class Publisher(Protocol):
    """An exporter running in one reader process."""

    def publish(self) -> None:
        """Read the stream now and publish its figures."""

    def close(self) -> None:
        """Publish a last time and stop."""


class Reader(Protocol):
    """An in-process exporter's reading of the stream (:class:`~._source.Source`)."""

    def points(self) -> list[Any]:
        """Read the stream now, counting its figures in the totals."""
        ...


class Publishing(Protocol):
    """An exporter that publishes from every reader process (picklable: it travels with
    the stream into DataLoader workers)."""

    def start(self, stream: Any, metrics: StreamMetrics) -> Publisher:
        """Start publishing ``stream``'s figures from this process."""
        ...


class StreamMetrics:
    """A stream's exporters and, in this process, its totals and running publishers."""

    def __init__(self) -> None:
        self.publishing: list[Publishing] = []
        self._copied_readers = 0  # the in-process exporters of the process it was copied from
        self._local()

    def _local(self) -> None:
        self._pid = os.getpid()
        self._tally = Tally()
        self._running: dict[int, Publisher] = {}  # by id() of its Publishing
        self.readers: list[Reader] = []  # in-process exporters (a scrape, OpenTelemetry)
        self._warned = False
        self.worker = 0  # the DataLoader worker of this process's reader (0: none)

    def __getstate__(self) -> dict[str, Any]:
        return {"publishing": self.publishing, "readers": len(self.readers)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.publishing = state["publishing"]
        self._local()
        self._copied_readers = state["readers"]

    def _check_pid(self) -> None:
        if self._pid != os.getpid():  # forked: the parent's threads are not running here
            readers = len(self.readers)
            self._local()
            self._copied_readers = readers

    @property
    def tally(self) -> Tally:
        """This process's totals of the stream's counters."""
        self._check_pid()
        return self._tally

    def begin(self, stream: Any, worker: int | None) -> None:
        """The stream begins an iteration in this process (``worker``: the DataLoader
        worker's number, None outside workers): start this process's publishers."""
        self._check_pid()
        self.worker = 0 if worker is None else worker
        seen = self.readers or self._copied_readers
        if worker is not None and seen and not self.publishing and not self._warned:
            self._warned = True
            warnings.warn(_WORKERS_UNSEEN, RuntimeWarning, stacklevel=3)
        for publishing in self.publishing:
            if id(publishing) not in self._running:
                self._running[id(publishing)] = publishing.start(stream, self)

    def ended(self) -> None:
        """The epoch ended (called in the reader's thread): publish its last figures, and
        count them in this process's totals (an in-process export reads the next epoch's
        figures next, which start again at 0)."""
        self._check_pid()
        try:
            if self._running:
                for publisher in list(self._running.values()):
                    publisher.publish()
            elif self.readers:  # they share the totals: one reading counts for all
                self.readers[0].points()
        except Exception:  # an exporter's failure never fails the stream
            _log.warning("asyncstream metrics: publishing failed", exc_info=True)

    def remove(self, publishing: Publishing) -> None:
        """Stop ``publishing`` (its export was closed)."""
        self._check_pid()
        self.publishing = [p for p in self.publishing if p is not publishing]
        running = self._running.pop(id(publishing), None)
        if running is not None:
            running.close()

    def close(self) -> None:
        """The stream closes: this process's publishers publish a last time and stop."""
        self._check_pid()
        running, self._running = self._running, {}
        for publisher in running.values():
            try:
                publisher.close()
            except Exception:
                _log.warning("asyncstream metrics: publishing failed", exc_info=True)
