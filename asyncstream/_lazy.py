"""A package's names loaded on first use (PEP 562's module ``__getattr__``): the one helper
``asyncstream`` and ``dali_ops`` share, so that importing either costs only what is used
(``asyncstream --version`` and ``--help`` import neither numpy nor torch nor DALI)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def lazy_names(
    package: str, where: Mapping[str, str], names: Iterable[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: a name of ``where`` is imported
    from its module (relative to the package) when first asked for, then kept in the
    package; ``names`` (its ``__all__``) are listed by ``dir`` before they are loaded."""
    listed = set(names)

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", package), name)
        setattr(sys.modules[package], name, value)  # once
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | listed)

    return __getattr__, __dir__
