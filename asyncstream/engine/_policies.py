"""The scheduler's policies, each a small unit with its own state and no I/O.

- :class:`Aimd`, adaptive concurrency: the limit starts at ``inflight``. A ``503
  SlowDown`` (or 429) halves it, at most once per recent median chunk time (one cut per
  round trip, not one per rejected request, since a burst of rejections answers one
  burst of requests); each chunk that completes adds ``1 / limit``, so the limit grows
  back by one per ``limit`` completions, to ``inflight``: additive increase,
  multiplicative decrease, as TCP does.
- :class:`HillClimb`, the concurrency found (``inflight="auto"``): it moves the limit
  AIMD grows back to, below ``inflight``. Over windows of completed chunks it measures
  the bytes per second; where the limit binds (chunks wait to start, or a GET carries
  several, while ring slots are free) it tries its ceiling, keeps it if the rate rose by
  ``gain`` (5%) and by an eighth of the step (12.5% for a doubling), else goes back and
  tries half the step after a number of windows that doubles with each try that failed;
  a throttling cut becomes the new level. What it decides changes speed and memory only.
- :class:`LatencyModel`, what a chunk download should take, from the recent
  distribution of completed ones (it feeds the hedge delay and the AIMD round trip).
- :class:`Hedging`, when to send a second request for a slow chunk: once enough chunks
  have completed, after ``factor`` times the predicted time, and only while hedges stay
  within ``budget`` of the chunks started.
- :class:`Coalescing`, which waiting chunks ride on one GET: consecutive chunks of one
  object, up to ``limit_bytes``, each fitting a slot, and at most the group's share of
  the free slots.

Retry timing (exponential backoff with full jitter, the deadline) is
:class:`~asyncstream.stores._retry.RetryPolicy`, with an injectable clock and random
source as well. Time here is an injected clock (``time.monotonic`` by default), so the
unit tests in ``tests/test_policies.py`` drive each policy without a server or a sleep.
"""

from __future__ import annotations

import collections
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass

from .._config import hedge_reserve
from ..stores._store import ChunkRequest, Timing

__all__ = ["Aimd", "Coalescing", "Hedging", "HillClimb", "LatencyModel"]

Clock = Callable[[], float]


class Aimd:
    """The adaptive concurrency limit (additive increase, multiplicative decrease).

    Args:
        ceiling: the most the limit may be (``inflight``).
        enabled: False keeps the limit at ``target`` whatever the store says.
        start: the limit to start at and grow back to (:attr:`target`); default
            ``ceiling``. :class:`HillClimb` moves it.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        ceiling: int,
        *,
        enabled: bool = True,
        start: int | None = None,
        clock: Clock = time.monotonic,
    ):
        if ceiling < 1:
            raise ValueError(f"ceiling must be >= 1, got {ceiling}")
        self.ceiling = ceiling
        self.target = ceiling if start is None else max(1, min(ceiling, start))
        self.enabled = enabled
        self._clock = clock
        self._limit = float(self.target)
        self._last_cut = -1e9

    @property
    def limit(self) -> int:
        """How many downloads may run now."""
        return int(self._limit)

    def throttled(self, round_trip: float) -> bool:
        """The store rejected a request for its rate: halve the limit, unless a cut
        happened less than ``round_trip`` seconds ago (the same burst of rejections).

        Returns:
            Whether the limit was cut.
        """
        if not self.enabled:
            return False
        now = self._clock()
        if now - self._last_cut < round_trip:
            return False
        self._last_cut = now
        self._limit = max(1.0, self._limit / 2)
        return True

    def completed(self) -> None:
        """A chunk completed: grow the limit by ``1 / limit``, up to :attr:`target`."""
        if self._limit < self.target:
            self._limit = min(float(self.target), self._limit + 1.0 / self._limit)

    def retarget(self, target: int) -> None:
        """Set the level the limit grows back to (within 1 and the ceiling), and the
        limit to it at once."""
        self.target = max(1, min(self.ceiling, target))
        self._limit = float(self.target)


class HillClimb:
    """``inflight="auto"``: the concurrency level that the bytes per second say is worth
    having, as :attr:`Aimd.target`.

    It judges windows of completed chunks: a window closes once ``warmup`` chunks (the
    limit's worth, started before the last change) have passed, then at least
    ``2 * limit`` chunks and ``max(min_window, 4 * round_trip)`` seconds. A window where
    most completions found the limit binding (chunks waiting to start, or the completed
    GET carrying several chunks because more were wanted than downloads allowed, while a
    ring slot was free) and the limit below the ceiling tries a step up: the first goes straight to
    the ceiling (where the round trips bind, the rate doubles with the downloads, and a
    climb of +50% steps took three times the windows and lost the first epoch), and each
    failed try halves the next step (at least 1). The next window keeps the step if its
    rate is at least ``1 + max(gain, step / 8)`` times the one before (``step``: the
    relative rise in the limit; a step that does not pay for an eighth of its size is CPU
    or noise, not the link. A quarter, the rule before, took back 32 to 64 GETs of 1 MiB
    over the S3-like nginx link, where K = 64 reads 1.4x K = 32 in ``python -m
    bench.autotune``; on loopback, where the reader's core binds, the step still fails),
    else goes back. After a window that did not try (not bound) or a try that failed, it
    holds for ``hold`` windows, a number that doubles with each
    failed try (up to ``max_hold``) and starts again at 1 after a kept one. A throttling
    cut (see :meth:`throttled`) becomes the level, and it holds; the next step from there
    is half the level.

    Args:
        aimd: the limit it moves.
        gain: the rise in bytes per second a step must bring to be kept.
        min_window: the shortest window, seconds.
        max_hold: the most windows it holds between tries.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        aimd: Aimd,
        *,
        gain: float = 0.05,
        min_window: float = 0.5,
        max_hold: int = 32,
        clock: Clock = time.monotonic,
    ) -> None:
        self.aimd = aimd
        self.gain = gain
        self.min_window = min_window
        self.max_hold = max_hold
        self._clock = clock
        self.steps = 0  # tries
        self.kept = 0  # tries kept
        self.windows = 0  # windows judged
        self._phase = "measure"  # "measure" | "probe" | "hold"
        self._base_rate = 0.0
        self._base_limit = aimd.target
        self._backoff = 1
        self._hold = 0
        self._step = aimd.ceiling  # the next try's rise; capped at the ceiling
        self._restart(clock())

    def _restart(self, now: float) -> None:
        self._warmup = self.aimd.limit  # chunks started under the old limit
        self._began = now
        self._bytes = 0
        self._count = 0
        self._bound = 0

    @property
    def phase(self) -> str:
        """``"measure"``, ``"probe"`` (a step being judged) or ``"hold"``."""
        return self._phase

    def completed(self, nbytes: int, *, bound: bool, round_trip: float) -> None:
        """A download of ``nbytes`` completed; ``bound``: chunks were waiting to start
        while a ring slot was free (only the limit held them)."""
        now = self._clock()
        if self._warmup > 0:
            self._warmup -= 1
            if self._warmup == 0:
                self._began = now
            return
        self._bytes += nbytes
        self._count += 1
        self._bound += bound
        seconds = now - self._began
        if self._count < 2 * self.aimd.limit or seconds < max(self.min_window, 4 * round_trip):
            return
        self.windows += 1
        self._judge(self._bytes / seconds, 2 * self._bound >= self._count)
        self._restart(now)

    def _judge(self, rate: float, bound: bool) -> None:
        aimd = self.aimd
        if self._phase == "probe":
            step = aimd.target / max(1, self._base_limit) - 1.0  # 1.0 for 8 -> 16
            if rate >= self._base_rate * (1.0 + max(self.gain, step / 8)):
                self.kept += 1
                self._backoff = 1
                self._base_rate, self._base_limit = rate, aimd.target
                self._try_or_hold(bound)
                return
            aimd.retarget(self._base_limit)  # back: the step did not pay
            self._step = max(1, self._step // 2)
            self._backoff = min(self.max_hold, 2 * self._backoff)
            self._phase, self._hold = "hold", self._backoff
            return
        if self._phase == "hold":
            self._hold -= 1
            if self._hold > 0:
                return
        self._base_rate, self._base_limit = rate, aimd.target  # measured at this level
        self._try_or_hold(bound)

    def _try_or_hold(self, bound: bool) -> None:
        aimd = self.aimd
        if bound and aimd.target < aimd.ceiling and aimd.limit >= aimd.target:
            self.steps += 1
            self._step = min(self._step, aimd.ceiling - aimd.target)
            aimd.retarget(aimd.target + self._step)
            self._phase = "probe"
        else:
            self._phase, self._hold = "hold", self._backoff

    def throttled(self) -> None:
        """The limit was cut for throttling: that is the level now; hold."""
        self.aimd.target = max(1, self.aimd.limit)
        self._base_limit = self.aimd.target
        self._step = max(1, self.aimd.target // 2)  # near where the store pushed back
        self._phase, self._hold = "hold", self._backoff
        self._restart(self._clock())


def _quantile(values: collections.deque[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


class LatencyModel:
    """What a chunk download should take, from the last ``window`` completed ones.

    Args:
        window: completed downloads remembered.
        min_samples: downloads needed before it predicts anything.
    """

    def __init__(self, window: int = 512, min_samples: int = 20) -> None:
        self.min_samples = min_samples
        self._first_byte: collections.deque[float] = collections.deque(maxlen=window)
        self._per_byte: collections.deque[float] = collections.deque(maxlen=window)
        self._totals: collections.deque[float] = collections.deque(maxlen=window)
        self._cache: tuple[float, float, float] | None = None
        self._added = 0

    def add(self, length: int, timing: Timing) -> None:
        """One completed download of ``length`` bytes and its timing."""
        self._first_byte.append(timing.first_byte)
        self._totals.append(timing.total)
        if length > 0:
            self._per_byte.append(max(0.0, timing.total - timing.first_byte) / length)
        self._added += 1
        if self._added % 16 == 0:  # sorting on every chunk would cost more than it tells
            self._cache = None

    def _quantiles(self) -> tuple[float, float, float] | None:
        if len(self._totals) < self.min_samples or not self._per_byte:
            return None
        if self._cache is None:
            self._cache = (
                _quantile(self._first_byte, 0.95),
                _quantile(self._per_byte, 0.95),
                _quantile(self._totals, 0.5),
            )
        return self._cache

    def predict(self, length: int) -> float | None:
        """Seconds a download of ``length`` bytes takes at the 95th percentile (time to
        first byte, plus the length at seconds per byte); None: not enough seen yet."""
        quantiles = self._quantiles()
        if quantiles is None:
            return None
        first_byte, per_byte, _ = quantiles
        return first_byte + length * per_byte

    def median_total(self) -> float:
        """The median chunk time (0.1 s until there are enough chunks to tell)."""
        quantiles = self._quantiles()
        return 0.1 if quantiles is None else quantiles[2]


class Hedging:
    """When a slow chunk download gets a second request, within a budget.

    Args:
        enabled: False: never hedge.
        factor: how many times its predicted time a download may take before its hedge.
        budget: the most hedges, as a fraction of the chunks started.
    """

    def __init__(self, *, enabled: bool = True, factor: float = 2.0, budget: float = 0.05):
        self.enabled = enabled
        self.factor = factor
        self.budget = budget
        self.started = 0  # chunks started
        self.fired = 0  # hedges sent
        self.running = 0  # hedges still running

    @property
    def reserve(self) -> int:
        """Ring slots kept back for hedges: the rule the ring is sized by
        (:func:`asyncstream._config.hedge_reserve`)."""
        return hedge_reserve(self.enabled)

    @property
    def held_back(self) -> int:
        """Slots that new downloads may not take now (the reserve no hedge is using)."""
        return max(0, self.reserve - self.running)

    def start(self, chunks: int) -> None:
        """``chunks`` chunk downloads started (the budget is a fraction of them)."""
        self.started += chunks

    def allowed(self) -> bool:
        """Whether a hedge may be sent now (on, and within the budget)."""
        return self.enabled and self.fired < self.budget * self.started

    def delay(self, predicted: float | None) -> float | None:
        """Seconds after which a download predicted to take ``predicted`` seconds gets
        its hedge; None: no hedge (off, over budget, or no prediction yet)."""
        if predicted is None or not self.allowed():
            return None
        return self.factor * predicted

    def fire(self) -> None:
        """A hedge was sent (it takes a slot until :meth:`finished`)."""
        self.fired += 1
        self.running += 1

    def finished(self) -> None:
        """A hedge sent earlier has ended, won or lost."""
        self.running -= 1


@dataclass(frozen=True)
class Coalescing:
    """Which waiting chunks one GET fetches with the chunk it starts with.

    Args:
        limit_bytes: the most bytes one GET fetches (``coalesce_bytes``; 0: never group).
        slot_bytes: a ring slot's size; a chunk that does not fit one is not grouped.
        look: how many waiting chunks to look through for the next one (a stream's
            prefetch interleaves its shards).
    """

    limit_bytes: int
    slot_bytes: int
    look: int

    @staticmethod
    def share(free: int, held_back: int, starts: int) -> int:
        """Slots a group may take besides its first chunk's.

        A group takes at most its fair share of the free slots: those slots divided by
        the downloads that may still start. One GET per connection moves at that
        connection's speed (about 90 MB/s on S3), so a few large groups holding every
        slot would idle the other connections; shared out, the free slots keep all K
        connections busy and each still saves round trips.

        Args:
            free: FREE slots now, the first chunk's already taken.
            held_back: slots new downloads may not take (the hedge reserve).
            starts: downloads that may still start, this one among them (at least 1).
        """
        fair = -(-(free - held_back + 1) // max(1, starts)) - 1  # the first's slot counted
        return max(0, min(fair, free - held_back))

    def followers(
        self,
        first: ChunkRequest,
        pending: collections.deque[tuple[int, ChunkRequest]],
        slots: int,
    ) -> list[tuple[int, ChunkRequest]]:
        """Take from ``pending`` the chunks that continue ``first``'s range of its object,
        at most ``slots`` of them, up to ``limit_bytes`` in all with ``first``.

        Returns:
            The chunks taken (removed from ``pending``), in range order.
        """
        group: list[tuple[int, ChunkRequest]] = []
        end, total = first.offset + first.length, first.length
        while len(group) < slots:
            at = next(
                (
                    i
                    for i, (_, request) in enumerate(itertools.islice(pending, self.look))
                    if request.url == first.url
                    and request.endpoint == first.endpoint
                    and request.offset == end
                ),
                None,
            )
            if at is None:
                break
            rid, request = pending[at]
            if (
                request.etag != first.etag
                or request.length > self.slot_bytes
                or total + request.length > self.limit_bytes
            ):
                break
            del pending[at]
            group.append((rid, request))
            end += request.length
            total += request.length
        return group
