"""Ranged GETs that read only their range, for the embedded S3 server (moto).

moto answers ``GET`` with ``Range: bytes=a-b`` by reading the whole object from its
spill file and then slicing it: every 8 MiB chunk of a 17 MB shard reads 17 MB, and on a
small machine that CPU is taken from the decoder the benchmark measures. Real S3 reads
only the range; this makes the embedded server do the same.

How: moto's ``S3Response.get_object`` is wrapped. For a plain single range
(``bytes=a-b`` or ``bytes=a-``, no ``partNumber``, no checksum mode), it runs with the
object's body deferred: ``FakeKey.value`` returns a placeholder on that thread, so
every check moto makes (the key exists, ``If-Match`` and the other conditions, its
headers) is still moto's own, and then only the requested bytes are read from the
object's buffer under its lock. Anything else (no range, a suffix or multi-range
request, an unsatisfiable range) goes to moto unchanged, errors included.

Applied with :func:`install` in the server's process; idempotent.

Guarded: this replaces moto internals, and moto is not pinned to one release. Before
patching, :func:`mismatches` checks that what the patch relies on is still there as it
was written against (moto 5.x; ``get_object(self)`` returning ``key.value`` as the body;
the range applied by ``key_response`` to 200 answers only; ``FakeKey.value`` a property;
a key's ``_value_buffer`` and ``lock``). Where anything differs, :func:`install` warns once
(:class:`MotoRangesWarning`, naming what differs) and leaves moto as it is: ranged GETs
are then served by moto's own code (correct, only slower on large objects).
"""

from __future__ import annotations

import inspect
import re
import threading
import warnings
from typing import Any

__all__ = ["MotoRangesWarning", "install", "mismatches"]

_RANGE = re.compile(r"bytes=(\d+)-(\d*)")
_VERSION = re.compile(r"(\d+)\.(\d+)")
_TESTED = ((5, 0), (6, 0))  # [low, high) of the moto versions the patch was written against
_deferred = threading.local()  # set while a wrapped get_object runs on this thread
_lock = threading.Lock()
_state: dict[str, bool] = {"done": False, "patched": False}


class MotoRangesWarning(RuntimeWarning):
    """The embedded S3 server could not make its ranged GETs read only their range: the
    installed moto's internals are not the ones :mod:`asyncstream.testing` was written
    against. Everything still works (moto serves ranges itself), only more slowly on large
    objects; upgrading asyncstream, or installing a moto it supports, restores the patch."""


def _source(obj: Any) -> str | None:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return None


def mismatches(version: str, responses: Any, key_class: Any) -> list[str]:
    """What differs, in moto's internals, from what the patch was written against.

    Args:
        version: moto's version string.
        responses: moto's ``S3Response`` class.
        key_class: moto's ``FakeKey`` class.

    Returns:
        One line per difference; empty where the patch applies.
    """
    problems = []
    match = _VERSION.match(version)
    low, high = _TESTED
    if match is None or not low <= (int(match[1]), int(match[2])) < high:
        problems.append(f"moto {version} is outside the versions it was written for (5.x)")
    get_object = getattr(responses, "get_object", None)
    if not inspect.isfunction(get_object):
        problems.append("S3Response.get_object is missing or not a plain function")
    else:
        params = list(inspect.signature(get_object).parameters)
        if params != ["self"]:
            problems.append(f"S3Response.get_object({', '.join(params)}) is not (self)")
        source = _source(get_object)
        if source is None or "key.value" not in source:
            problems.append("S3Response.get_object no longer answers with key.value")
    dispatch = _source(getattr(responses, "key_response", None))
    if (
        dispatch is None
        or "status_code == 200" not in dispatch
        or "_handle_range_header" not in (dispatch)
    ):
        problems.append("S3Response.key_response no longer applies ranges to 200 answers only")
    value = getattr(key_class, "__dict__", {}).get("value")
    if not isinstance(value, property) or value.fget is None:
        problems.append("FakeKey.value is not a property")
    init = _source(getattr(key_class, "__init__", None))
    if init is None or "self._value_buffer" not in init or "self.lock" not in init:
        problems.append("FakeKey no longer keeps its body in _value_buffer under self.lock")
    return problems


class _Deferred:
    """Stands for a key's body inside a wrapped ``get_object``."""

    def __init__(self, key: Any) -> None:
        self.key = key


def _read_range(key: Any, begin: int, end: int) -> bytes:
    """Bytes ``begin..end`` (inclusive) of a moto key, read from its buffer."""
    with key.lock:
        buffer = key._value_buffer
        buffer.seek(begin)
        return bytes(buffer.read(end - begin + 1))


def install() -> bool:
    """Make moto's ranged GETs read only their range (in this process), where moto's
    internals are the ones the patch was written against (:func:`mismatches`).

    Returns:
        Whether the patch is in place. Where it is not, a :class:`MotoRangesWarning` said
        why, once per process.
    """
    with _lock:
        if not _state["done"]:
            _state["done"] = True
            _state["patched"] = _install()
        return _state["patched"]


def _install() -> bool:
    import moto
    from moto.s3.models import FakeKey
    from moto.s3.responses import S3Response

    problems = mismatches(getattr(moto, "__version__", "unknown"), S3Response, FakeKey)
    if problems:
        warnings.warn(
            "asyncstream's embedded S3 server serves ranged GETs with moto's own code "
            "(reading whole objects), since the installed moto differs from what its "
            "faster path was written against: " + "; ".join(problems),
            MotoRangesWarning,
            stacklevel=3,
        )
        return False
    original_get_object = S3Response.get_object
    original_value: property = FakeKey.__dict__["value"]

    def value(self: Any) -> Any:
        if getattr(_deferred, "active", False):
            return _Deferred(self)
        return original_value.__get__(self)

    def get_object(self: Any) -> Any:
        match = _RANGE.fullmatch(self.headers.get("range") or "")
        if (
            match is None
            or "partNumber" in self.querystring
            or self.headers.get("x-amz-checksum-mode") == "ENABLED"
        ):
            return original_get_object(self)
        _deferred.active = True
        try:
            status, headers, body = original_get_object(self)
        finally:
            _deferred.active = False
        if not isinstance(body, _Deferred):  # a 304 or anything else moto decided
            return status, headers, body
        key = body.key
        size = key.size
        begin = int(match[1])
        end = min(int(match[2]) if match[2] else size - 1, size - 1)
        if status != 200 or begin > end:  # moto's own answer (it reads the whole body)
            return status, headers, key.value
        for name in [h for h in headers if h.startswith("x-amz-checksum-")]:
            del headers[name]  # range responses carry no checksum (as moto does)
        content = _read_range(key, begin, end)
        headers["content-range"] = f"bytes {begin}-{end}/{size}"
        headers["content-length"] = str(len(content))
        return 206, headers, content

    setattr(FakeKey, "value", property(value, original_value.fset))  # noqa: B010
    setattr(S3Response, "get_object", get_object)  # noqa: B010
    return True
