"""One save-and-restore check for every stage, as torchdata's ``run_test_save_load_state``.

:func:`check_save_restore` runs a stage to its end, uninterrupted; then, for each
midpoint, runs a fresh stage that far, saves its state through ``json.dumps`` and
``json.loads`` (so only plain data survives), restores the state into another fresh stage
and checks that what the restored stage gives from there is exactly the rest of the
uninterrupted run, and that its own state right after the restore is the state saved.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

__all__ = ["Stateful", "check_save_restore"]


class Stateful(Protocol):
    """A stage: ``state()`` gives plain data, ``reset(state)`` continues from it."""

    def state(self) -> Any: ...

    def reset(self, state: Any) -> Any: ...


S = TypeVar("S")


def _save(stage: Any) -> Any:
    return stage.state()


def _load(stage: Any, state: Any) -> None:
    stage.reset(state)


def _run(stage: S, step: Callable[[S], Any], limit: int | None) -> list[Any]:
    out: list[Any] = []
    while limit is None or len(out) < limit:
        try:
            out.append(step(stage))
        except StopIteration:
            break
    return out


def check_save_restore(
    make: Callable[[], S],
    step: Callable[[S], Any],
    *,
    midpoints: Sequence[int],
    save: Callable[[S], Any] = _save,
    load: Callable[[S, Any], None] = _load,
    close: Callable[[S], None] | None = None,
) -> list[Any]:
    """Check that a stage saved at each of ``midpoints`` and restored continues exactly.

    Args:
        make: a fresh stage.
        step: one step of the stage; its result is what is compared; raises
            ``StopIteration`` at the end.
        midpoints: steps after which to save (0: before the first; past the end: at it).
        save: the stage's state (default ``stage.state()``).
        load: restore a state into a fresh stage (default ``stage.reset(state)``).
        close: releases a stage (an engine, a stream), if it holds anything.

    Returns:
        The uninterrupted run's results.
    """
    stages: list[S] = []

    def fresh() -> S:
        stages.append(make())
        return stages[-1]

    try:
        whole = _run(fresh(), step, None)
        assert any(0 < at < len(whole) for at in midpoints), "no midpoint inside the run"
        for at in midpoints:
            first = fresh()
            head = _run(first, step, at)
            assert head == whole[: len(head)], f"a fresh stage ran otherwise up to step {at}"
            saved = json.loads(json.dumps(save(first)))
            restored = fresh()
            load(restored, saved)
            assert json.loads(json.dumps(save(restored))) == saved, f"restored at step {at}"
            rest = _run(restored, step, None)
            assert head + rest == whole, f"resumed after step {at}: not the uninterrupted run"
    finally:
        if close is not None:
            for stage in stages:
                close(stage)
    return whole
