"""What a :class:`~asyncstream.testing.FaultProxy` can do to a request: the kinds of
:class:`Fault`, the seeded rates of a :class:`FaultPlan`, and the concrete action one
request gets (:func:`make_action`), with S3's own error codes for the synthetic errors."""

from __future__ import annotations

import enum
import http
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Final

__all__ = [
    "BODY_KINDS",
    "ERROR_KINDS",
    "S3_REASONS",
    "Action",
    "Fault",
    "FaultPlan",
    "Injection",
    "action_for",
    "check_rate",
    "check_seconds",
    "make_action",
]


class Fault(enum.StrEnum):
    """The kinds of fault a :class:`FaultProxy` injects.

    Functions that take a kind accept a member or its string value (``"slowdown"``).
    The module docstring describes what each does to a request.
    """

    SLOWDOWN = "slowdown"
    INTERNAL_ERROR = "internal_error"
    STATUS = "status"
    RESET = "reset"
    TRUNCATE = "truncate"
    STALL = "stall"
    LATENCY = "latency"


_PLAN_ORDER: Final = (
    Fault.SLOWDOWN,
    Fault.INTERNAL_ERROR,
    Fault.RESET,
    Fault.TRUNCATE,
    Fault.STALL,
    Fault.LATENCY,
)
ERROR_KINDS: Final = frozenset({Fault.SLOWDOWN, Fault.INTERNAL_ERROR, Fault.STATUS})
BODY_KINDS: Final = frozenset({Fault.RESET, Fault.TRUNCATE, Fault.STALL})

# S3's own error codes and messages, for synthetic error responses.
_S3_ERRORS: Final[Mapping[int, tuple[str, str]]] = {
    400: ("InvalidRequest", "Invalid Request"),
    403: ("AccessDenied", "Access Denied"),
    404: ("NoSuchKey", "The specified key does not exist."),
    409: (
        "OperationAborted",
        "A conflicting conditional operation is currently in progress against this "
        "resource. Try again.",
    ),
    412: ("PreconditionFailed", "At least one of the pre-conditions you specified did not hold"),
    416: ("InvalidRange", "The requested range is not satisfiable"),
    500: ("InternalError", "We encountered an internal error. Please try again."),
    501: ("NotImplemented", "A header you provided implies functionality that is not implemented"),
    503: ("SlowDown", "Please reduce your request rate."),
}
S3_REASONS: Final[Mapping[int, str]] = {503: "Slow Down"}


def check_rate(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and 0.0 <= value <= 1.0):
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")


def check_seconds(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and 0.0 <= value < math.inf):
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")


@dataclass(frozen=True, kw_only=True, repr=False)
class FaultPlan:
    """Seeded fault rates for the ``GET`` requests that a :class:`FaultProxy` sees.

    Each eligible request draws one number from the proxy's ``random.Random(seed)`` and
    gets at most one fault; the rates are probabilities per request and must add up to
    at most 1. A fault queued with :meth:`FaultProxy.inject` takes precedence, but the
    request still consumes its draw, so injections never shift the seeded sequence.

    Example::

        FaultPlan(slowdown=0.05, reset=0.01, match=".tar")

    Args:
        slowdown: rate of ``503 SlowDown`` responses.
        internal_error: rate of ``500 InternalError`` responses.
        reset: rate of responses cut short by a TCP RST.
        truncate: rate of responses cut short by a clean close.
        stall: rate of responses that stop for ``stall_seconds``.
        latency: rate of responses delayed by ``latency_seconds``.
        match: only ``GET`` requests whose target (path and query, raw or percent-decoded)
            contains this substring are eligible; ``None`` means every ``GET``.
        latency_seconds: the delay of a ``latency`` fault.
        stall_seconds: the length of a ``stall`` fault.
        body_fraction: the fraction of the response body sent before a ``reset``,
            ``truncate`` or ``stall`` fault fires.
    """

    slowdown: float = 0.0
    internal_error: float = 0.0
    reset: float = 0.0
    truncate: float = 0.0
    stall: float = 0.0
    latency: float = 0.0
    match: str | None = None
    latency_seconds: float = 1.0
    stall_seconds: float = 3600.0
    body_fraction: float = 0.5

    def __post_init__(self) -> None:
        for kind in _PLAN_ORDER:
            check_rate(kind.value, getattr(self, kind.value))
        if self.total_rate > 1.0 + 1e-9:
            raise ValueError(f"the fault rates add up to {self.total_rate:g}, more than 1")
        if self.match is not None and not isinstance(self.match, str):
            raise TypeError(f"match must be a string or None, got {self.match!r}")
        check_seconds("latency_seconds", self.latency_seconds)
        check_seconds("stall_seconds", self.stall_seconds)
        check_rate("body_fraction", self.body_fraction)

    def __repr__(self) -> str:
        parts = [
            f"{f.name}={getattr(self, f.name)!r}"
            for f in fields(self)
            if getattr(self, f.name) != f.default
        ]
        return f"FaultPlan({', '.join(parts)})"

    @property
    def total_rate(self) -> float:
        """The probability that an eligible request gets some fault."""
        return float(sum(getattr(self, kind.value) for kind in _PLAN_ORDER))

    def draw(self, rng: random.Random) -> Fault | None:
        """Draw the fault of one request; consumes exactly one ``rng.random()``.

        Args:
            rng: the random source.

        Returns:
            The fault kind, or ``None`` for a request that passes unharmed.
        """
        u = rng.random()
        edge = 0.0
        for kind in _PLAN_ORDER:
            edge += getattr(self, kind.value)
            if u < edge:
                return kind
        return None


@dataclass(frozen=True)
class Action:
    """What one request gets: a fault kind and its settings."""

    kind: Fault
    seconds: float = 0.0
    body_fraction: float = 0.5
    after_bytes: int | None = None
    status: int = 500
    code: str = ""
    message: str = ""


@dataclass
class Injection:
    """A fault queued with ``FaultProxy.inject``: for the next ``remaining`` matching requests."""

    action: Action
    remaining: int
    match: str | None
    method: str | None


def action_for(
    kind: Fault,
    *,
    latency_seconds: float,
    stall_seconds: float,
    body_fraction: float,
    after_bytes: int | None,
) -> Action:
    """The action of a fault drawn from a plan (or a throttled request), with its settings."""
    if kind is Fault.SLOWDOWN or kind is Fault.INTERNAL_ERROR:
        status = 503 if kind is Fault.SLOWDOWN else 500
        code, message = _S3_ERRORS[status]
        return Action(kind, status=status, code=code, message=message)
    if kind is Fault.LATENCY:
        return Action(kind, seconds=latency_seconds)
    seconds = stall_seconds if kind is Fault.STALL else 0.0
    return Action(kind, seconds=seconds, body_fraction=body_fraction, after_bytes=after_bytes)


def make_action(
    kind: Fault | str,
    *,
    seconds: float | None = None,
    body_fraction: float | None = None,
    after_bytes: int | None = None,
    status: int | None = None,
    code: str | None = None,
    message: str | None = None,
) -> Action:
    """The action of an injected fault (see :meth:`FaultProxy.inject`), its arguments checked.

    Raises:
        ValueError: an unknown kind, or a parameter that does not fit the kind.
    """
    fault = Fault(kind)
    if seconds is not None and fault not in (Fault.LATENCY, Fault.STALL):
        raise ValueError(f"seconds applies to latency and stall, not {fault.value}")
    if (body_fraction is not None or after_bytes is not None) and fault not in BODY_KINDS:
        raise ValueError(
            f"body_fraction/after_bytes apply to reset, truncate and stall, not {fault.value}"
        )
    if body_fraction is not None and after_bytes is not None:
        raise ValueError("give body_fraction or after_bytes, not both")
    if fault is not Fault.STATUS and (status, code, message) != (None, None, None):
        raise ValueError("status, code and message apply to the status fault only")
    if fault is Fault.STATUS:
        if status is None or isinstance(status, bool) or not 400 <= status <= 599:
            raise ValueError(f"the status fault needs status=400..599, got {status!r}")
        default_code, default_message = _default_error(status)
        return Action(
            fault, status=status, code=code or default_code, message=message or default_message
        )
    if seconds is not None:
        check_seconds("seconds", seconds)
    if body_fraction is not None:
        check_rate("body_fraction", body_fraction)
    if after_bytes is not None and (isinstance(after_bytes, bool) or after_bytes < 0):
        raise ValueError(f"after_bytes must be an int >= 0, got {after_bytes!r}")
    plan = FaultPlan()
    return action_for(
        fault,
        latency_seconds=seconds if seconds is not None else plan.latency_seconds,
        stall_seconds=seconds if seconds is not None else plan.stall_seconds,
        body_fraction=body_fraction if body_fraction is not None else plan.body_fraction,
        after_bytes=after_bytes,
    )


def _default_error(status: int) -> tuple[str, str]:
    if status in _S3_ERRORS:
        return _S3_ERRORS[status]
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        return str(status), f"HTTP {status}"
    return "".join(phrase.split()), phrase
