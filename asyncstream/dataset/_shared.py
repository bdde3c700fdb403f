"""One open per job: under ``torch.distributed``, rank 0 opens and the other ranks take its result.

Opening a dataset asks the store for every shard's size (``HEAD`` s, listings) and reads
the indexes beside them; were every rank to do it, a job of 128 nodes x 8 ranks would send
1,024 times those requests in the same second at start-up (the storm that gets a job
throttled). Under an initialised ``torch.distributed`` of more than one process,
:func:`once` runs the plan (:func:`._dataset.plan_dataset`) on rank 0 only and
broadcasts it to the others; DataLoader workers inherit their rank's stream, so a job's
open makes the requests of one process's, whatever its ranks and workers.

The result crosses between processes as JSON bytes in a ``uint8`` tensor, never a pickle
(unpickling runs code), and is checked field by field where it arrives. A failed open on
rank 0 is sent instead of the plan: every rank raises the same error (type and message),
none waits for a plan that will not come.

Collective: every rank must open the same datasets in the same order (construct the same
streams), as counting shards without an index already asks (:func:`._count.count_shared`).
"""

from __future__ import annotations

import json
import multiprocessing
from collections.abc import Callable
from typing import Any, TypeVar, cast

from .._exceptions import (
    AccessDeniedError,
    AsyncStreamError,
    CorruptTarError,
    DataError,
    FetchError,
    NotFoundError,
    PermanentFetchError,
    ShardURLError,
    TransientFetchError,
)
from ._count import distributed

__all__ = ["natural", "once", "shared_open", "text"]

T = TypeVar("T")

# The errors an open raises on purpose, raised again with their type on the other ranks.
_ERRORS: dict[str, type[Exception]] = {
    cls.__name__: cls
    for cls in (
        AsyncStreamError,
        ShardURLError,
        FetchError,
        TransientFetchError,
        PermanentFetchError,
        AccessDeniedError,
        NotFoundError,
        DataError,
        CorruptTarError,
        ValueError,
        TypeError,
    )
}
_WHERE = "(on rank 0, which opens the dataset for the job)"


def shared_open() -> tuple[int, int] | None:
    """``(rank, world size)`` where the open is shared: ``torch.distributed`` initialised
    with more than one process, and this is not a DataLoader worker (a daemonic process,
    which inherits an initialised group under ``fork`` but takes no part in it)."""
    if multiprocessing.current_process().daemon:
        return None
    return distributed()


def once(make: Callable[[], T], encode: Callable[[T], Any], decode: Callable[[Any], T]) -> T:
    """``make()`` on rank 0 of ``torch.distributed``, its result on every rank.

    Collective: every rank calls it (:func:`shared_open` must be true), for the same
    dataset. The result travels as the JSON of ``encode(result)``; ``decode`` makes it
    again, checking every field (``TypeError``, ``ValueError``, ``KeyError``).

    Raises:
        The error ``make()`` raised on rank 0, with its type and message, on every rank.
        AsyncStreamError: what arrived from rank 0 does not decode.
    """
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    error: Exception | None = None
    result: T | None = None
    data = b""
    if rank == 0:
        try:
            result = make()
            data = json.dumps({"value": encode(result)}).encode()
        except Exception as exc:
            error = exc
            data = json.dumps({"error": _error(exc)}).encode()
    # A group of its own, destroyed before returning (see count_shared: a gloo group left
    # alive after a collective can abort the interpreter at exit).
    group = dist.new_group(backend="gloo")
    try:
        size = torch.tensor([len(data)], dtype=torch.int64)
        dist.broadcast(size, src=0, group=group)
        if rank == 0:
            buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        else:
            buffer = torch.empty(int(size.item()), dtype=torch.uint8)
        dist.broadcast(buffer, src=0, group=group)
    finally:
        dist.destroy_process_group(group)
    if error is not None:
        raise error
    if rank == 0:
        return cast("T", result)
    try:
        message = json.loads(buffer.numpy().tobytes())
        sent = message.get("error")
        got = _raised(sent) if sent is not None else decode(message["value"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise AsyncStreamError(f"the dataset opened on rank 0 did not arrive whole: {exc}") from exc
    if isinstance(got, Exception):
        raise got
    return got


def _error(exc: Exception) -> dict[str, Any]:
    kind = next((c.__name__ for c in type(exc).__mro__ if c.__name__ in _ERRORS), None)
    message = str(exc) if kind == type(exc).__name__ else f"{type(exc).__name__}: {exc}"
    return {
        "type": kind or "AsyncStreamError",
        "message": message,
        "url": getattr(exc, "url", None),
        "offset": getattr(exc, "offset", None),
    }


def _raised(sent: dict[str, Any]) -> Exception:
    """The error rank 0 raised, made again here."""
    cls = _ERRORS.get(text(sent["type"]), AsyncStreamError)
    message = f"{text(sent['message'])} {_WHERE}"
    url = sent.get("url")
    if issubclass(cls, CorruptTarError):
        return cls(message, url=text(url or ""), offset=natural(sent.get("offset") or 0))
    if issubclass(cls, FetchError):
        return cls(message, url=text(url or ""))
    return cls(message)


def text(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def natural(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError(f"expected an integer >= 0, got {value!r}")
    return value
