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
"""

from __future__ import annotations

import re
import threading
from typing import Any

__all__ = ["install"]

_RANGE = re.compile(r"bytes=(\d+)-(\d*)")
_deferred = threading.local()  # set while a wrapped get_object runs on this thread
_installed = False


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


def install() -> None:
    """Make moto's ranged GETs read only their range (in this process)."""
    global _installed
    if _installed:
        return
    from moto.s3.models import FakeKey
    from moto.s3.responses import S3Response

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
    _installed = True
