"""What each request through a :class:`~asyncstream.testing.FaultProxy` gets, and the
counts: the proxy's shared state, safe from any thread.

For one request, in this order: a fault queued with ``inject`` (first match wins), else
``503 Slow Down`` if ``capacity`` ``GET`` requests are already being served (the
throttle model: S3 refusing a prefix pushed past its request rate), else the seeded
plan's draw. Every eligible ``GET`` consumes exactly one draw whatever it gets, so
injections and throttling never shift the seeded sequence. The profile's first-byte
delay is drawn from a second generator, so shaping never shifts it either.
"""

from __future__ import annotations

import random
import threading
import urllib.parse
from typing import Final

from ._faults import Action, Fault, FaultPlan, Injection, action_for
from ._http import Request, matches
from ._network import NetworkProfile

__all__ = ["STAT_KEYS", "Control"]

STAT_KEYS: Final = (
    *(kind.value for kind in Fault),
    "requests",
    "forwarded",
    "bytes_forwarded",
    "connections",
    "throttled",
)


class Control:
    """Queued injections, seeded draws, the capacity limit, counters and the request log.

    Args:
        plan: the seeded fault rates.
        profile: the network profile (its first-byte latency is drawn here).
        seed: seeds the fault draws and, separately, the latency draws.
        capacity: the most ``GET`` requests served at once, or ``None``.
    """

    def __init__(
        self, plan: FaultPlan, profile: NetworkProfile, seed: int, capacity: int | None
    ) -> None:
        self.plan = plan
        self.profile = profile
        self.capacity = capacity
        self._fault_rng = random.Random(seed)
        self._profile_rng = random.Random(f"profile-{seed}")
        self._lock = threading.Lock()
        self._injections: list[Injection] = []
        self._counts = dict.fromkeys(STAT_KEYS, 0)
        # Each answered request: method, path, Range header (or None), status.
        self._answered: list[tuple[str, str, str | None, int]] = []
        self._request_ids = 0
        self._active_gets = 0

    def queue(self, injection: Injection) -> None:
        """Queue an injected fault, after those queued before it."""
        with self._lock:
            self._injections.append(injection)

    def clear(self) -> None:
        """Drop every queued fault that has not fired yet."""
        with self._lock:
            self._injections.clear()

    def pending(self) -> int:
        """How many queued faults have not fired yet (summed over their counts)."""
        with self._lock:
            return sum(i.remaining for i in self._injections)

    def stats(self) -> dict[str, int]:
        """A copy of the counters (see :meth:`FaultProxy.stats`)."""
        with self._lock:
            return dict(self._counts)

    def requests(self) -> list[tuple[str, str, int]]:
        """A copy of the request log (see :meth:`FaultProxy.requests`)."""
        with self._lock:
            return [(method, path, status) for method, path, _, status in self._answered]

    def ranged_requests(self) -> list[tuple[str, str, str | None, int]]:
        """The request log with each request's ``Range`` header (see
        :meth:`FaultProxy.ranged_requests`)."""
        with self._lock:
            return list(self._answered)

    def log_request(self, request: Request, status: int) -> None:
        """Record that ``request`` was answered with ``status``."""
        path = urllib.parse.unquote(urllib.parse.urlsplit(request.target).path)
        with self._lock:
            self._answered.append((request.method, path, _range_of(request), status))

    def count(self, key: str, n: int = 1) -> None:
        """Add ``n`` to the counter ``key``."""
        with self._lock:
            self._counts[key] += n

    def count_active(self, n: int) -> None:
        """A ``GET`` started (``1``) or ended (``-1``) being served."""
        with self._lock:
            self._active_gets += n

    def decide(self, request: Request) -> tuple[Action | None, float, str]:
        """The fault of one request, its first-byte delay and a request id.

        Returns:
            ``(action, delay, request_id)``; ``action`` is ``None`` for no fault.
        """
        plan = self.plan
        low, high = self.profile.first_byte_latency
        with self._lock:
            self._counts["requests"] += 1
            self._request_ids += 1
            request_id = f"FAULTPROXY{self._request_ids:08X}"
            drawn = None
            if (
                plan.total_rate > 0
                and request.method == "GET"
                and matches(plan.match, request.target)
            ):
                drawn = plan.draw(self._fault_rng)
            action = self._take_injection(request)
            if action is None and self._throttled(request):
                self._counts["throttled"] += 1
                action = action_for(
                    Fault.SLOWDOWN,
                    latency_seconds=0.0,
                    stall_seconds=0.0,
                    body_fraction=0.0,
                    after_bytes=None,
                )
            elif action is None and drawn is not None:
                action = action_for(
                    drawn,
                    latency_seconds=plan.latency_seconds,
                    stall_seconds=plan.stall_seconds,
                    body_fraction=plan.body_fraction,
                    after_bytes=None,
                )
            if action is not None:
                self._counts[action.kind.value] += 1
            delay = self._profile_rng.uniform(low, high) if high > 0 else 0.0
        return action, delay, request_id

    def _take_injection(self, request: Request) -> Action | None:
        """The first queued fault that matches ``request``, used once (lock held)."""
        for injection in self._injections:
            if matches(injection.match, request.target) and injection.method in (
                None,
                request.method,
            ):
                injection.remaining -= 1
                if injection.remaining == 0:
                    self._injections.remove(injection)
                return injection.action
        return None

    def _throttled(self, request: Request) -> bool:
        """Whether a ``GET`` finds the capacity taken (lock held)."""
        return (
            self.capacity is not None
            and request.method == "GET"
            and self._active_gets >= self.capacity
        )


def _range_of(request: Request) -> str | None:
    """The request's ``Range`` header, if it has one."""
    for name, value in request.headers:
        if name.lower() == "range":
            return value
    return None
