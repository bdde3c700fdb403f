"""Tar header fields and extended headers, read as Python's :mod:`tarfile` reads them.

Pure functions for :class:`~._tar.ShardReader`; each raises ``ValueError`` with what is
wrong, which the reader turns into a :class:`~asyncstream.CorruptTarError` naming the shard
and the offset.

**Extended headers** (``L``, ``K``, ``x``, ``X``, ``g``) stand in front of the header they
extend. tarfile reads them recursively, so the one *furthest* from the member is applied
last and wins: :func:`chain_effects` applies them in that order. What they may change:

* ``L`` (GNU long name): the name. ``K`` (long link name): nothing a sample needs.
* ``x`` and ``X`` (POSIX and Solaris extended): ``path`` (trailing slashes removed),
  ``size`` (data size and where the next header is), ``GNU.sparse.name``, and a sparse
  map (:mod:`._sparse`: ``GNU.sparse.map``, repeated ``GNU.sparse.offset`` /
  ``GNU.sparse.numbytes``, or ``GNU.sparse.major=1`` with ``minor=0``).
* ``g`` (global): tarfile applies its records to every later member. A global header
  that sets a path, a size or a sparse map (renaming or resizing every member after
  it; no tool writes one) is refused, so that a reader started mid-shard never needs
  the globals it did not see; any other global record (comment, mtime, ...) changes
  nothing a sample holds.

Values are decoded as UTF-8 with surrogate escapes, as tarfile decodes them whatever the
``hdrcharset``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._sparse import SparseMap, map_00, map_01

__all__ = ["ChainEffects", "chain_effects", "checksum_error", "pax_records", "size_field"]

_HIGH = bytes(range(128, 256))
_GLOBAL_REFUSED = ("path", "size", "GNU.sparse.")
_FLAG_L, _FLAG_G = 0x4C, 0x67
_SPARSE_KEYS = ("GNU.sparse.map", "GNU.sparse.size", "GNU.sparse.major")


def _cut(field: bytes) -> bytes:
    end = field.find(0)
    return field if end < 0 else field[:end]


def _octal(field: bytes) -> int:
    """Parse a NUL/space padded octal field; ``ValueError`` if it is not one."""
    digits = _cut(field).strip(b" ")
    if not digits:
        return 0
    if not digits.isdigit():
        raise ValueError(field)
    return int(digits, 8)


def size_field(h: bytes) -> int:
    """An unusual size field: other octal spellings, or positive base-256."""
    if h[124] == 0x80:
        return int.from_bytes(h[125:136], "big")
    if h[124] & 0x80:
        raise ValueError("negative or bad base-256 size")
    return _octal(h[124:136])


def checksum_error(h: bytes, unsigned: int) -> str | None:
    """``None`` if the stored checksum matches the unsigned or the signed byte sum (as
    tarfile accepts both), else what is wrong."""
    field = h[148:156]
    try:
        stored = _octal(field)
    except ValueError:
        stored = -1
    if stored == unsigned:
        return None
    high = len(h) - len(h.translate(None, _HIGH)) - 8 + len(field.translate(None, _HIGH))
    if stored == unsigned - 256 * high:
        return None
    return f"header checksum mismatch (stored {field!r})"


def pax_records(payload: bytes) -> list[tuple[str, str]]:
    """The ``(keyword, value)`` records of a PAX header, in order (repeats kept).

    Raises:
        ValueError: a malformed record (tarfile stops reading at one, or drops the
            archive's rest; here it is an error).
    """
    out: list[tuple[str, str]] = []
    i, n = 0, len(payload)
    while i < n and payload[i]:
        space = payload.find(b" ", i, i + 21)
        length = payload[i:space]
        if space < 0 or not length.isdigit() or i + int(length) > n:
            raise ValueError("malformed PAX record")
        stop = i + int(length)
        equal = payload.find(b"=", space + 1, stop)
        if equal <= space + 1 or payload[stop - 1] != 0x0A:
            raise ValueError("malformed PAX record")
        keyword = payload[space + 1 : equal].decode("utf-8", "surrogateescape")
        out.append((keyword, payload[equal + 1 : stop - 1].decode("utf-8", "surrogateescape")))
        i = stop
    return out


def _size(value: str, what: str) -> int:
    if not value.isdigit() or not value.isascii() or len(value) > 20:
        raise ValueError(f"bad PAX {what} {value!r}")
    return int(value)


@dataclass(slots=True)
class ChainEffects:
    """What a member's extended headers change (``None``: nothing).

    Attributes:
        name: the member's name.
        size: its data size (a PAX ``size``), which also moves the next header.
        real_size: a sparse member's real size.
        sparse: a sparse member's map (PAX 0.0 or 0.1).
        map_in_data: a PAX 1.0 sparse member, whose map is at the start of its data.
    """

    name: str | None = None
    size: int | None = None
    real_size: int | None = None
    sparse: SparseMap | None = None
    map_in_data: bool = False


def chain_effects(chain: list[tuple[int, bytes]]) -> ChainEffects:
    """The effects of the extended headers ``chain`` (``(type flag, payload)`` in file
    order) on the member after them, as tarfile applies them.

    Raises:
        ValueError: a malformed record, a refused global record, or sparse records that
            do not make one map.
    """
    out = ChainEffects()
    sparse_headers = 0
    for flag, payload in reversed(chain):
        if flag == _FLAG_L:
            out.name = _cut(payload).decode("utf-8", "surrogateescape")
            continue
        if flag not in (0x78, 0x58, _FLAG_G):  # 'K'
            continue
        records = pax_records(payload)
        if flag == _FLAG_G:
            for keyword, _ in records:
                if keyword.startswith(_GLOBAL_REFUSED):
                    raise ValueError(f"a global PAX header sets {keyword!r} for every member")
            continue
        fields = dict(records)  # tarfile's dict: a repeated keyword's last value
        if any(key in fields for key in _SPARSE_KEYS):
            sparse_headers += 1
            if "GNU.sparse.map" in fields:
                out.sparse = map_01(fields["GNU.sparse.map"])
            elif "GNU.sparse.size" in fields:
                out.sparse = map_00(payload)
            elif (fields.get("GNU.sparse.major"), fields.get("GNU.sparse.minor")) == ("1", "0"):
                out.map_in_data = True
            else:
                raise ValueError("GNU sparse records of an unknown version")
        elif "GNU.sparse.realsize" in fields:
            raise ValueError("GNU.sparse.realsize without a sparse map")
        for keyword, value in fields.items():
            if keyword == "GNU.sparse.name":
                out.name = value
            elif keyword in ("GNU.sparse.size", "GNU.sparse.realsize"):
                out.real_size = _size(value, keyword)
            elif keyword == "path":
                out.name = value.rstrip("/")
            elif keyword == "size":
                out.size = _size(value, "size")
    if sparse_headers > 1:
        raise ValueError("sparse records in more than one extended header")
    if sparse_headers and (out.size is not None or out.real_size is None):
        raise ValueError("a sparse member needs its real size and no PAX size")
    return out
