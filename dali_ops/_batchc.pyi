"""Types of the native batch sink (``_batchc.c``), for mypy: see :mod:`._batch`."""

from collections.abc import Callable
from typing import Any

class Sink:
    """``Iteration.take``'s sink for one batch: adds a common sample to the batch's lists
    and hands any other to ``fallback`` (``BatchBuilder._add_record``)."""

    def __init__(
        self,
        keys: list[str],
        urls: list[str],
        labels: list[int],
        metas: list[bytes | None],
        spans: list[tuple[int, int]],
        placed: Any,
        image_keys: tuple[str, ...],
        label_key: str,
        meta_key: str,
        level: int,
        header: Callable[[Any], str | None],
        fallback: Callable[[memoryview, str, Any], bool],
    ) -> None: ...
    def __call__(self, view: memoryview, url: str, record: Any, /) -> bool: ...

def markers(data: bytes | memoryview, /) -> bool:
    """Whether ``data`` passes ``check_image``'s ``"markers"`` level."""

def pad(data: Any, spans: Any, out: Any, /) -> bool:
    """Copy image ``i``, ``data[spans[i, 0]:spans[i, 1]]``, to the start of row ``i`` of
    ``out`` and zero the rest of the row (the GIL released): ``True``. ``False``, with
    nothing written, unless every image is a JPEG whose end marker lies in its last 64
    bytes; ``ValueError`` where a span falls outside ``data`` or is longer than a row."""
