"""Which stage holds the training loop back: fetch, feed or decode, from their own counters.

When the loop waits in ``next()``, the time goes to one of two places: DALI's
``outputs()`` (decode: DALI had its inputs and was still working) or DALI's source waiting
for the producer (the feed is behind). A feed that is behind is either waiting for shard
bytes itself (fetch: the stream's ``starved_s``, its time waiting for the engine) or busy
building batches (feed: CPU). :class:`StallWatch` compares the growth of these counters
over the recent window and, when the loop waits more than a set share of the time, logs
one warning a minute naming the stage and what to try.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from asyncstream import StallMeter

    from ._feed import Counters, Feeder
    from ._feeds import Feed

__all__ = ["StallWatch", "stage_limit"]

log = logging.getLogger("dali_ops")

_ADVICE = {
    "decode": "DALI's decode (raise settings.num_threads, decode on the GPU with "
    "device='mixed', or the GPU is saturated)",
    "feed": "building batches from samples (use workers=N, or more workers)",
    "fetch": "shard bytes from the store (raise the stream's inflight, or the store or "
    "network is slow)",
}
_EVERY = 50  # batches between looks
_LOG_INTERVAL = 60.0  # seconds between warnings


def stage_limit(decode_wait: float, feed_wait: float, starved: float) -> str:
    """The stage that held the loop back, from the growth of each counter over a window.

    Args:
        decode_wait: the loop's time waiting for DALI's outputs.
        feed_wait: DALI's source's time waiting for the producer.
        starved: the stream's time waiting for the fetch engine, while producing.
    """
    if decode_wait >= feed_wait:
        return "decode"
    return "fetch" if starved >= 0.5 * feed_wait else "feed"


def starved_seconds(snapshots: dict[int, dict[str, Any]]) -> float:
    """The streams' total time waiting for their engines, from statistics snapshots."""
    total = 0.0
    for stats in snapshots.values():
        fetch = stats.get("fetch")
        if isinstance(fetch, dict):
            total += float(fetch.get("starved_s", 0.0))
    return total


class StallWatch:
    """Looks every few batches whether the loop waits too much, and names the limit.

    Args:
        threshold: the waiting share over the meter's recent window above which a warning
            is logged (``None``: never; :attr:`limit` is still kept).
    """

    def __init__(self, threshold: float | None) -> None:
        self.threshold = threshold
        self.limit: str | None = None
        self._calls = 0
        self._last_log = float("-inf")
        self._base: tuple[float, float, float] | None = None

    def check(
        self, meter: StallMeter, counters: Counters, feed: Feed | None, feeder: Feeder
    ) -> None:
        """Called after each batch; looks every ``_EVERY`` batches."""
        if feed is None:
            return
        self._calls += 1
        if self._base is not None and self._calls % _EVERY:
            return
        now = (
            counters.decode_wait_seconds,
            feed.wait_seconds + counters.feed_wait_seconds,
            starved_seconds(feeder.stream_stats),
        )
        base, self._base = self._base, now
        if base is None:  # the first batch: counting starts here
            return
        growth = [max(0.0, a - b) for a, b in zip(now, base, strict=True)]
        waited, worked, _ = meter.recent()
        share = waited / (waited + worked) if waited + worked > 0 else 0.0
        threshold = self.threshold if self.threshold is not None else 0.2
        self.limit = stage_limit(*growth) if share > threshold else None
        if self.limit is None or self.threshold is None:
            return
        clock = time.monotonic()
        if clock - self._last_log >= _LOG_INTERVAL:
            self._last_log = clock
            log.warning(
                "the training loop waited %.0f%% of the time on data over its last %d "
                "batches; the likely limit is %s",
                100 * share,
                meter.recent()[2],
                _ADVICE[self.limit],
            )
