"""The scheduler's policies (asyncstream/engine/_policies.py) and the retry timing, unit
by unit: an injected clock and a seeded random source, no server, no sleep."""

from __future__ import annotations

import collections
import itertools
import random

import pytest

from asyncstream._exceptions import TransientFetchError
from asyncstream.engine._policies import Aimd, Coalescing, Hedging, HillClimb, LatencyModel
from asyncstream.stores._retry import RetryPolicy, retrying
from asyncstream.stores._store import ChunkRequest, Timing


class Clock:
    """A clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


# -- AIMD ------------------------------------------------------------------------------


def test_aimd_halves_on_throttle_once_per_round_trip() -> None:
    clock = Clock()
    aimd = Aimd(16, clock=clock)
    assert aimd.limit == 16
    assert aimd.throttled(round_trip=0.5)
    assert aimd.limit == 8
    clock.advance(0.4)  # the same burst of rejections
    assert not aimd.throttled(round_trip=0.5)
    assert aimd.limit == 8
    clock.advance(0.1)  # a round trip after the cut
    assert aimd.throttled(round_trip=0.5)
    assert aimd.limit == 4
    for _ in range(5):
        clock.advance(1.0)
        aimd.throttled(round_trip=0.5)
    assert aimd.limit == 1  # never below one


def test_aimd_grows_back_by_one_per_limit_completions() -> None:
    clock = Clock()
    aimd = Aimd(8, clock=clock)
    assert aimd.throttled(round_trip=0.1)
    assert aimd.throttled(round_trip=0.0)
    assert aimd.limit == 2
    limits = []
    for _ in range(40):
        aimd.completed()
        limits.append(aimd.limit)
    assert limits[:3] == [2, 2, 3]  # 2.5, 2.9, 3.24: a step of one takes about 2 completions
    assert limits == sorted(limits)  # up by steps, never down
    assert all(b - a <= 1 for a, b in itertools.pairwise(limits))
    steps = [limits.index(n) + 1 for n in range(3, 9)]  # completions until each step
    gaps = [b - a for a, b in itertools.pairwise(steps)]
    assert gaps == sorted(gaps)  # each step takes longer: 1 / limit per completion
    assert steps[-1] == 30  # 2 -> 8: about 2 + 3 + ... + 7 completions
    assert limits[-1] == 8  # back to the ceiling, and no further


def test_aimd_disabled_keeps_its_limit() -> None:
    aimd = Aimd(8, enabled=False, clock=Clock())
    assert not aimd.throttled(round_trip=0.0)
    assert aimd.limit == 8
    with pytest.raises(ValueError, match="ceiling"):
        Aimd(0)


# -- latency model and hedging -----------------------------------------------------------


# -- the concurrency found (inflight="auto") --------------------------------------------


def _window(tuner: HillClimb, clock: Clock, rate_at: dict[int, float], bound: bool = True) -> None:
    """One judged window: the warm-up, then 2 * limit completions over 0.6 s at the rate
    ``rate_at`` gives for the limit of the moment (bytes per second)."""
    limit = tuner.aimd.limit
    n = 2 * limit
    judged = tuner.windows
    for _ in range(limit):  # the warm-up: chunks started under the last limit
        tuner.completed(0, bound=bound, round_trip=0.01)
    for _ in range(n):
        clock.advance(0.6 / n)
        tuner.completed(int(rate_at[limit] * 0.6 / n), bound=bound, round_trip=0.01)
    assert tuner.windows == judged + 1


def test_auto_tries_the_ceiling_first_and_keeps_it_where_the_rate_follows() -> None:
    """Where the round trips bind, twice the downloads is twice the rate: one try."""
    clock = Clock()
    aimd = Aimd(16, start=8, clock=clock)
    tuner = HillClimb(aimd, clock=clock)
    _window(tuner, clock, {8: 100e6, 16: 190e6})  # measured at 8: a try, at the ceiling
    assert (aimd.limit, tuner.phase, tuner.steps) == (16, "probe", 1)
    _window(tuner, clock, {16: 190e6})  # 90% more: kept; nothing above to try
    assert (aimd.limit, tuner.phase, tuner.steps, tuner.kept) == (16, "hold", 1, 1)
    for _ in range(5):
        _window(tuner, clock, {16: 190e6})
    assert (aimd.limit, tuner.steps) == (16, 1)


def test_a_failed_try_goes_back_and_halves_the_next_step() -> None:
    clock = Clock()
    aimd = Aimd(16, start=8, clock=clock)
    tuner = HillClimb(aimd, clock=clock)
    rate = {8: 100e6, 12: 130e6, 14: 131e6, 16: 110e6}  # 16 overloads something
    _window(tuner, clock, rate)  # measured at 8: tries 16
    _window(tuner, clock, rate)  # 10% for twice the downloads: back to 8, hold
    assert (aimd.limit, tuner.phase, tuner.steps, tuner.kept) == (8, "hold", 1, 0)
    _window(tuner, clock, rate)  # holds 2 windows (doubled after the failed try) ...
    assert (aimd.limit, tuner.phase) == (8, "hold")
    _window(tuner, clock, rate)  # ... the second measures 8 again, and tries half the step
    assert (aimd.limit, tuner.phase) == (12, "probe")
    _window(tuner, clock, rate)  # 30% for half as many again: kept, and the next try
    assert (aimd.limit, tuner.phase, tuner.kept) == (16, "probe", 1)
    _window(tuner, clock, rate)  # less than at 12: back, hold 2 (1 after the kept one)
    assert (aimd.limit, tuner.phase) == (12, "hold")
    _window(tuner, clock, rate)
    _window(tuner, clock, rate)  # measures 12 again, tries half of 4
    assert (aimd.limit, tuner.phase, tuner.steps) == (14, "probe", 4)
    _window(tuner, clock, rate)  # 0.8% for a sixth more, under the 5% asked: back to 12
    assert (aimd.limit, tuner.kept) == (12, 1)


def test_a_step_must_pay_for_an_eighth_of_its_size() -> None:
    """8 -> 16 is twice the downloads: a rise of 10% (noise, or a CPU that binds) is not
    worth it; 14% is."""
    for gained, kept in ((1.10, 0), (1.14, 1)):
        clock = Clock()
        aimd = Aimd(16, start=8, clock=clock)
        tuner = HillClimb(aimd, clock=clock)
        rate = {8: 100e6, 16: 100e6 * gained}
        _window(tuner, clock, rate)
        _window(tuner, clock, rate)
        assert (tuner.kept, aimd.target) == (kept, 16 if kept else 8)


def test_auto_does_not_grow_where_the_limit_does_not_bind() -> None:
    """The consumer is slower than the downloads (the ring is full): no try."""
    clock = Clock()
    aimd = Aimd(16, start=8, clock=clock)
    tuner = HillClimb(aimd, clock=clock)
    for _ in range(10):
        _window(tuner, clock, {8: 100e6}, bound=False)
    assert (aimd.limit, tuner.steps) == (8, 0)


def test_auto_stops_at_its_ceiling() -> None:
    clock = Clock()
    aimd = Aimd(10, start=8, clock=clock)
    tuner = HillClimb(aimd, clock=clock)
    rate = {8: 1e6, 10: 2e6}
    for _ in range(6):
        _window(tuner, clock, rate)
    assert aimd.limit == 10


def test_a_throttling_cut_becomes_the_level() -> None:
    clock = Clock()
    aimd = Aimd(16, start=8, clock=clock)
    tuner = HillClimb(aimd, clock=clock)
    assert aimd.throttled(round_trip=0.1)
    tuner.throttled()
    assert (aimd.limit, aimd.target, tuner.phase) == (4, 4, "hold")
    for _ in range(50):
        aimd.completed()
    assert aimd.limit == 4  # AIMD does not grow back past the level found
    _window(tuner, clock, {4: 50e6})  # the hold, then a measure at 4 and a step of half
    assert (aimd.limit, tuner.phase) == (6, "probe")


def test_latency_model_predicts_after_enough_downloads() -> None:
    model = LatencyModel(min_samples=20)
    assert model.predict(1000) is None
    assert model.median_total() == 0.1  # the default round trip
    for _ in range(19):
        model.add(1000, Timing(first_byte=0.01, total=0.11))
    assert model.predict(1000) is None
    model.add(1000, Timing(first_byte=0.01, total=0.11))
    predicted = model.predict(1000)
    assert predicted == pytest.approx(0.11)  # 0.01 + 1000 x 0.0001
    assert model.predict(2000) == pytest.approx(0.21)
    assert model.median_total() == pytest.approx(0.11)


def test_a_hedge_waits_factor_times_the_prediction() -> None:
    hedging = Hedging(factor=3.0, budget=0.5)
    hedging.start(10)
    assert hedging.delay(None) is None  # nothing predicted yet: no hedge
    assert hedging.delay(0.2) == pytest.approx(0.6)
    assert Hedging(enabled=False).delay(0.2) is None


def test_hedges_stay_within_the_budget() -> None:
    hedging = Hedging(factor=2.0, budget=0.1)
    assert hedging.delay(1.0) is None  # no chunk started: no budget
    hedging.start(20)  # 10 % of 20: two hedges
    fired = 0
    while hedging.allowed():
        assert hedging.delay(1.0) == 2.0
        hedging.fire()
        fired += 1
        assert fired <= 2
    assert fired == 2
    assert hedging.delay(1.0) is None
    hedging.start(10)  # 30 started: a third hedge
    assert hedging.allowed()


def test_the_hedge_reserve_is_held_back_until_a_hedge_takes_it() -> None:
    hedging = Hedging()
    hedging.start(100)
    assert (hedging.reserve, hedging.held_back) == (1, 1)
    hedging.fire()
    assert hedging.held_back == 0
    hedging.finished()
    assert hedging.held_back == 1
    assert (Hedging(enabled=False).reserve, Hedging(enabled=False).held_back) == (0, 0)


# -- coalescing ------------------------------------------------------------------------------

MIB = 1 << 20


def _chunks(url: str, n: int, size: int = MIB, start: int = 0) -> list[ChunkRequest]:
    return [ChunkRequest(url, (start + i) * size, size, etag='"e"') for i in range(n)]


def _pending(*requests: ChunkRequest) -> collections.deque[tuple[int, ChunkRequest]]:
    return collections.deque(enumerate(requests))


def test_coalescing_takes_consecutive_chunks_of_one_object() -> None:
    a, b = _chunks("s3://b/a.tar", 4), _chunks("s3://b/b.tar", 4)
    # a stream's prefetch interleaves its shards
    pending = _pending(a[1], b[0], a[2], b[1], a[3])
    policy = Coalescing(limit_bytes=64 * MIB, slot_bytes=MIB, look=8)
    taken = policy.followers(a[0], pending, slots=10)
    assert [request for _, request in taken] == [a[1], a[2], a[3]]
    assert [rid for rid, _ in taken] == [0, 2, 4]
    assert [request for _, request in pending] == [b[0], b[1]]  # the others stay, in order


def test_coalescing_stops_at_a_gap_another_etag_or_a_chunk_too_large() -> None:
    a = _chunks("s3://b/a.tar", 5)
    policy = Coalescing(limit_bytes=64 * MIB, slot_bytes=MIB, look=8)
    gap = _pending(a[2], a[3])
    assert policy.followers(a[0], gap, slots=10) == []
    assert len(gap) == 2
    other = ChunkRequest("s3://b/a.tar", MIB, MIB, etag='"new"')
    assert policy.followers(a[0], _pending(other), slots=10) == []
    other_store = ChunkRequest("s3://b/a.tar", MIB, MIB, etag='"e"', endpoint="other")
    assert policy.followers(a[0], _pending(other_store), slots=10) == []
    big = ChunkRequest("s3://b/a.tar", MIB, 2 * MIB, etag='"e"')
    assert policy.followers(a[0], _pending(big), slots=10) == []


def test_coalescing_stays_within_coalesce_bytes_and_its_slots() -> None:
    a = _chunks("s3://b/a.tar", 10)
    policy = Coalescing(limit_bytes=4 * MIB, slot_bytes=MIB, look=20)
    taken = policy.followers(a[0], _pending(*a[1:]), slots=10)
    assert len(taken) == 3  # 4 MiB with the first
    taken = policy.followers(a[0], _pending(*a[1:]), slots=2)
    assert len(taken) == 2
    assert (
        Coalescing(limit_bytes=0, slot_bytes=MIB, look=20).followers(
            a[0], _pending(*a[1:]), slots=10
        )
        == []
    )


def test_coalescing_looks_only_so_far_ahead() -> None:
    a, b = _chunks("s3://b/a.tar", 2), _chunks("s3://b/b.tar", 3)
    policy = Coalescing(limit_bytes=64 * MIB, slot_bytes=MIB, look=3)
    assert policy.followers(a[0], _pending(*b, a[1]), slots=10) == []
    policy = Coalescing(limit_bytes=64 * MIB, slot_bytes=MIB, look=4)
    assert len(policy.followers(a[0], _pending(*b, a[1]), slots=10)) == 1


@pytest.mark.parametrize(
    ("free", "held_back", "starts", "share"),
    [
        (15, 0, 1, 15),  # the only download to start: every free slot
        (15, 0, 4, 3),  # 16 slots with the first's, shared by 4 downloads: 4 each
        (15, 1, 4, 3),  # the hedge reserve is not shared out: ceil(15 / 4) - 1
        (7, 0, 8, 0),  # fewer slots than downloads: each chunk alone
        (0, 1, 1, 0),  # nothing free beyond the reserve
        (3, 0, 0, 3),  # the limit reached already counts as one start
    ],
)
def test_a_group_takes_at_most_its_share_of_free_slots(
    free: int, held_back: int, starts: int, share: int
) -> None:
    assert Coalescing.share(free=free, held_back=held_back, starts=starts) == share
    assert share <= max(0, free - held_back)


# -- retry timing ----------------------------------------------------------------------------


def test_backoff_is_full_jitter_within_bounds_for_a_seeded_rng() -> None:
    policy = RetryPolicy(base_delay=0.1, max_delay=1.0)
    rng = random.Random(7)
    waits = [[policy.backoff(retry, rng) for _ in range(200)] for retry in range(6)]
    for retry, drawn in enumerate(waits):
        cap = min(1.0, 0.1 * 2**retry)
        assert all(0.0 <= w <= cap for w in drawn)
        assert max(drawn) > 0.8 * cap  # full jitter: the whole range, not a fixed wait
        assert min(drawn) < 0.2 * cap
    again = random.Random(7)
    assert [policy.backoff(0, again) for _ in range(200)] == waits[0]  # seeded: the same


async def test_retries_wait_their_backoff_on_the_injected_clock() -> None:
    clock = Clock()
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.advance(seconds)

    calls = 0

    async def attempt() -> str:
        nonlocal calls
        calls += 1
        if calls < 4:
            raise TimeoutError()
        return "ok"

    causes: list[str] = []
    policy = RetryPolicy(max_attempts=5, base_delay=0.5, max_delay=1.0)
    result = await retrying(
        attempt,
        url="s3://b/a.tar",
        policy=policy,
        rng=random.Random(3),
        on_retry=causes.append,
        sleep=sleep,
        clock=clock,
    )
    assert result == "ok"
    assert calls == 4
    assert len(slept) == len(causes) == 3
    expected = random.Random(3)
    assert slept == [policy.backoff(n, expected) for n in range(3)]


async def test_no_retry_starts_past_the_deadline() -> None:
    clock = Clock()

    async def sleep(seconds: float) -> None:
        clock.advance(seconds)

    async def attempt() -> None:
        clock.advance(4.0)  # each attempt takes 4 s
        raise TimeoutError()

    policy = RetryPolicy(max_attempts=100, base_delay=0.0, max_delay=0.0, deadline=10.0)
    began = clock()
    with pytest.raises(TransientFetchError, match="deadline"):
        await retrying(
            attempt,
            url="s3://b/a.tar",
            policy=policy,
            rng=random.Random(0),
            sleep=sleep,
            clock=clock,
        )
    assert clock() - began == 12.0  # three attempts: a fourth would end past the deadline
