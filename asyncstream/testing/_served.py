"""What every local server of the test support shares: ``start()``, ``close()``, and the
``with`` block that pairs them."""

from __future__ import annotations

import abc
from types import TracebackType
from typing import Self

__all__ = ["Served"]


class Served(abc.ABC):
    """A local server (or proxy): :meth:`start` it and :meth:`close` it, or use it as a
    context manager, which starts it on entry and closes it on exit."""

    @abc.abstractmethod
    def start(self) -> Self:
        """Start serving; returns the server."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop serving and release what it holds; safe to call more than once."""

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
