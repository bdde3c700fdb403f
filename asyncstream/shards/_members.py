"""Which tar members are sample fields, and under which key: webdataset's rules, exactly.

webdataset 1.x (``webdataset.tariterators``) reads a tar with Python's :mod:`tarfile`
and then, for each regular file (``isreg()``: types ``0``, ``\\0``, ``7`` and GNU
sparse ``S``):

1. skips it if its name has no ``/`` and starts and ends with ``__`` (``__meta__``), or
   matches ``__[^/]*__($|/)`` (a first path component of that form);
2. splits the name with ``^((?:.*/|)[^.]+)[.]([^/]*)$`` into the key (the path up to the
   first dot of the base name) and the extension (the rest), and skips a member the
   pattern does not match: no dot in its base name (``README``, ``001``), or a base name
   that starts with a dot and a folder part that holds one (``.jpg``, ``a.b/.jpg``);
3. lower-cases the extension (``n01440764_10026.JPEG`` is the field ``jpeg``).

Names are decoded as tarfile decodes them: UTF-8, with bytes that are not UTF-8 kept as
surrogate escapes (``"\\udcff"`` for byte ``0xff``), as
``bytes.decode("utf-8", "surrogateescape")`` does.

:func:`sample_member` does all three with a fast path for ordinary names and the very
regular expressions of webdataset for the rest (names with a newline, a leading dot in
the base name, a leading ``__``), so every name gets webdataset's answer.
"""

from __future__ import annotations

import re

__all__ = ["decode_name", "sample_member"]

# webdataset.tariterators: tar_file_iterator's skip_meta and base_plus_ext.
_META = re.compile(r"__[^/]*__($|/)")
_KEY_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")


def decode_name(raw: bytes) -> str:
    """A member name's bytes as tarfile decodes them (UTF-8, surrogate escapes)."""
    return raw.decode("utf-8", "surrogateescape")


def sample_member(name: str) -> tuple[str, str] | None:
    """``(key, extension)`` of a regular file's name, or ``None`` if webdataset skips it.

    Examples: ``"a/b/000017.seg.PNG"`` gives ``("a/b/000017", "seg.png")``; ``"README"``,
    ``"__meta__"``, ``"__cache__/x.jpg"`` and ``".jpg"`` give ``None``.
    """
    if name.startswith("__") and (
        ("/" not in name and name.endswith("__")) or _META.match(name) is not None
    ):
        return None
    slash = name.rfind("/")
    dot = name.find(".", slash + 1)
    if dot > slash + 1 and "\n" not in name:
        return name[:dot], name[dot + 1 :].lower()
    match = _KEY_EXT.match(name)
    if match is None:
        return None
    return match.group(1), match.group(2).lower()
