"""What one request made at open may cost: a bound on the body read whole (an index, a
manifest, a small object) and on the time from connect to last byte.

A remote party names these bodies (the index beside a shard, a wids index, a manifest),
so none is read unbounded: a body over :data:`MAX_OPEN_BYTES` is refused as soon as its
``Content-Length`` says so, or as soon as that many bytes have arrived (never read whole
first), and a web request that has not ended within :data:`OPEN_DEADLINE` seconds, its
redirects and retries included, fails however slowly its server trickles bytes (a
per-read timeout alone never fires on a byte every half second). The web store's
settings ``max_open_bytes`` and ``open_deadline`` change them
(``configure_store("https", ...)``).
"""

from __future__ import annotations

from .._exceptions import PermanentFetchError

__all__ = ["MAX_OPEN_BYTES", "OPEN_DEADLINE", "Pages", "too_large"]

MAX_OPEN_BYTES = 64 << 20  # the largest body read whole at open (bytes)
OPEN_DEADLINE = 60.0  # seconds one request at open may take, retries and redirects included


def too_large(url: str, cap: int, declared: int | None = None) -> PermanentFetchError:
    """The error of a body at open over ``cap`` bytes (``declared``: its stated length)."""
    size = f"{declared} bytes" if declared is not None else f"over {cap} bytes"
    return PermanentFetchError(
        f"{url}: the answer is {size}, more than the {cap} bytes an index, manifest or "
        "small object read at open may have (the web store's setting max_open_bytes)",
        url=url,
    )


class Pages:
    """The continuation tokens of one listing, so that a server handing one back (its
    pages would never end: each under its own deadline, all of them under none) is
    refused at the repeat. Memory is one token per page read.

    Args:
        url: the prefix listed, named in the error.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self._seen: set[str] = set()

    def follow(self, token: str) -> None:
        """Note the next page's ``token``; raise where it came before."""
        if token in self._seen:
            raise PermanentFetchError(
                f"{self.url}: the server's listing gives a continuation token it gave before "
                f"(after {len(self._seen) + 1} pages): it would never end",
                url=self.url,
            )
        self._seen.add(token)
