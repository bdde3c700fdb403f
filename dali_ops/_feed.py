"""DALI's source: batches from the current feed, the FIFO of those DALI holds, and triage.

The :class:`Feeder` is the callable given to ``fn.external_source``. DALI calls it from the
thread that drives the pipeline, once per iteration; it hands over the oldest batch a
producer (:mod:`._feeds`) has built, and keeps every batch DALI holds in a FIFO, oldest
first, so the loader always knows which batch the next output belongs to and where to
resume before it (:meth:`Feeder.head_state`).

Undecodable images. DALI cannot drop one sample from a batch: a failed decode raises
``RuntimeError`` from ``outputs()`` for the failing batch (naming the sample's index only
for some failures), and the pipeline is then invalid and must be rebuilt. The cheap checks
of :mod:`._checks` run on every image before it is fed (in the producer); if DALI still
fails (corrupt entropy data, a header only the decoder rejects), :meth:`Feeder.triage`
decodes each image of the batches DALI held, one at a time, in a throwaway pipeline;
culprits are dropped (``"skip"``: that batch comes out shorter) or become a
:class:`~asyncstream.DecodeError` (``"raise"``), and the batches are fed again to a fresh
pipeline. A failure that no single image explains is raised as is.

Errors never escape into DALI: a batch that ended with an error (a sample that failed the
checks with ``on_error="raise"``, or the stream's own error) ends the epoch for DALI, and
the loader raises the error when that batch reaches the head, i.e. after every earlier
batch has been handed out, so no batch is lost and ``state_dict()`` then points at the
failed batch. Corruption that leaves a decodable JPEG (flipped bits in the entropy data) is
not detected by anyone: it decodes to wrong pixels.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

from asyncstream import DecodeError, StateSnapshot

from ._batch import EncodedBatch, Skipped
from ._checks import source_of
from ._feeds import Feed
from ._pipeline import Batch, find_undecodable

__all__ = ["Counters", "Feeder"]


@dataclass
class Counters:
    """What the loader counts since it was made (see ``DALIImageLoader.stats``).

    Attributes:
        batches: batches handed out.
        images: images handed out.
        skipped: images skipped (``on_error="skip"``).
        dropped_last: images dropped with short last batches (``drop_last``).
        rebuilds: pipelines rebuilt after DALI failed.
        builds: pipelines built in all (one per loader, plus rebuilds).
        decode_wait_seconds: the training loop's time waiting for DALI's outputs.
        feed_wait_seconds: DALI's source waiting for the producer (the feed is behind).
        feed_seconds: the producer's time building batches (thread or worker hand-over).
        feed_cpu_seconds: the producer thread's CPU time (``workers=0``; DataLoader
            workers spend theirs in their own processes, and their hand-over in the
            training thread).
        probe_seconds: time spent finding the image DALI failed on.
    """

    batches: int = 0
    images: int = 0
    skipped: int = 0
    dropped_last: int = 0
    rebuilds: int = 0
    builds: int = 0
    decode_wait_seconds: float = 0.0
    feed_wait_seconds: float = 0.0
    feed_seconds: float = 0.0
    feed_cpu_seconds: float = 0.0
    probe_seconds: float = 0.0


class Feeder:
    """The pipeline's source: takes batches from a feed, records the ones DALI holds.

    Args:
        counters: updated with the skipped and dropped images batches record.
        skipped: the most recent skipped images, appended to.
        on_error: what :meth:`triage` does with an image DALI cannot decode.
    """

    def __init__(
        self, counters: Counters, skipped: deque[Skipped], on_error: Literal["raise", "skip"]
    ) -> None:
        self.counters = counters
        self.skipped = skipped
        self.on_error = on_error
        self.feed: Feed | None = None
        self.in_flight: deque[EncodedBatch] = deque()  # given to DALI, oldest first
        self.refeed: deque[EncodedBatch] = deque()  # to give again to a rebuilt pipeline
        self.done = True
        self.stream_stats: dict[int, dict[str, Any]] = {}  # latest snapshot per worker

    def start(self, feed: Feed) -> None:
        """Feed DALI from ``feed`` (started by the caller) from now on."""
        self.feed = feed
        self.in_flight.clear()
        self.refeed.clear()
        self.done = False

    def stop(self) -> None:
        """Stop the current feed's producer and forget the batches in flight."""
        feed, self.feed = self.feed, None
        if feed is not None:
            feed.stop()
        self.in_flight.clear()
        self.refeed.clear()
        self.done = True

    def head(self) -> EncodedBatch | None:
        """The batch the pipeline's next output belongs to."""
        if self.in_flight:
            return self.in_flight[0]
        return self.refeed[0] if self.refeed else None

    def head_state(self) -> Any:
        """Where to resume to read the head batch again (or the next one, if none is held):
        a state dict, the only one of the batches' snapshots made into its dict."""
        head = self.head()
        if head is not None:
            state = head.state
        else:
            state = None if self.feed is None else self.feed.next_state()
        return state.to_dict() if isinstance(state, StateSnapshot) else state

    def __call__(self) -> Batch:
        batch = self.refeed.popleft() if self.refeed else self._take()
        self.in_flight.append(batch)
        if batch.error is not None:
            self.done = True
            raise StopIteration  # the loader raises batch.error in its turn
        return batch.source_batch()

    def _take(self) -> EncodedBatch:
        while not self.done and self.feed is not None:
            batch = self.feed.get()
            if batch is None:
                break
            self.account(batch)
            if batch.keys or batch.error is not None:
                return batch
        self.done = True
        raise StopIteration

    def account(self, batch: EncodedBatch) -> None:
        """Record what a batch reports besides its images: skipped, dropped, statistics."""
        if batch.skipped:
            self.counters.skipped += len(batch.skipped)
            self.skipped.extend(batch.skipped)
        self.counters.dropped_last += batch.dropped
        if batch.stats is not None:
            self.stream_stats[batch.worker] = batch.stats

    def triage(self, device: Literal["cpu", "mixed"], device_id: int | None) -> bool:
        """After DALI failed: probe the batches it held, apply ``on_error``, queue a refeed.

        Every batch DALI held is decoded image by image. ``"skip"`` drops the culprits
        (a batch left empty is dropped); ``"raise"`` turns the first batch with one into a
        failed record, and nothing after it is fed. Returns whether an image was to blame.
        """
        batches = [*self.in_flight, *self.refeed]
        self.in_flight.clear()
        self.refeed.clear()
        blamed = False
        for batch in batches:
            bad = {}
            if batch.error is None:
                bad = find_undecodable(
                    batch.images,
                    device=device,
                    device_id=device_id,
                )
            blamed = blamed or bool(bad)
            if bad and self.on_error == "raise":
                i = min(bad)
                batch.error = DecodeError(f"{batch.describe(i)}: DALI cannot decode it: {bad[i]}")
            elif bad:
                for i, reason in bad.items():
                    self.counters.skipped += 1
                    self.skipped.append(
                        (batch.urls[i], batch.keys[i], f"DALI: {reason}", source_of(batch.metas[i]))
                    )
                batch.remove(set(bad))
            if batch.keys or batch.error:
                self.refeed.append(batch)
            if batch.error:
                self.done = True  # nothing after a failed batch is fed
                break
        return blamed
