"""What an index may make the reader reach: the origins the user named, and no others.

An index given as the dataset URL names its shards by URL, and a remote index is written
by somebody else: left alone, a wids ``index.json`` served from ``http://A/`` could name
``file:///home/me/private.tar`` (read, and its samples handed out) or ``http://B/x.tar``
(sent the bearer token configured for ``http``). So the shards a remote index names must
lie on an *origin* the user named (:func:`~asyncstream.stores._registry.origin_of`: a web
server's ``scheme://host:port``, an object store's bucket): the index's own, or that of
another URL of the same dataset. A remote index never names a local file. An index the
user keeps locally (``asyncstream index --output``'s manifest of read-only web shards) is
the user's own, and may name shards anywhere.

``trust_index_urls=`` widens the scope: ``True`` admits any remote URL, a list admits the
URLs under its prefixes (``"https://cdn.example.com/data/"``, ``"s3://other-bucket/"``;
only a ``file://`` prefix listed there admits local files). Web origins admitted so get
none of the credentials or headers configured for their scheme (the token, ``headers=``,
the Hugging Face token): the opened dataset records them (``Dataset.withheld``), and
they travel with the stream as data to every process that reads it (a DataLoader worker,
forked or spawned), whose engine withholds them
(:func:`~asyncstream.stores._registry.store_settings`). An object store has no such split:
a bucket admitted is read with the endpoint's credentials, so name buckets one by one
rather than ``True`` where that matters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from .._exceptions import DataError
from ..shards._urls import expand_braces
from ..stores._registry import canonical_url, is_local, origin_of, scheme_of

__all__ = ["Scope", "TrustIndexURLs"]

TrustIndexURLs = bool | Sequence[str]
_SHOWN = 3


def _normal(url: str) -> str:
    """``url`` with its origin written one way (``http://host:80/...``), for prefixes."""
    if is_local(url):
        return canonical_url(url)
    origin = origin_of(url)
    rest = url.partition("://")[2]
    path = rest[len(urlsplit(url).netloc) :]
    return origin + (path if path.startswith("/") else "/" + path)


def _prefixes(trust: TrustIndexURLs) -> bool | tuple[str, ...]:
    if isinstance(trust, bool):
        return trust
    if isinstance(trust, str) or not isinstance(trust, Sequence):
        raise TypeError(
            "trust_index_urls must be True, False or a list of URL prefixes "
            f"(['https://cdn.example.com/data/']), got {trust!r}"
        )
    made = []
    for prefix in trust:
        if not isinstance(prefix, str) or not prefix:
            raise TypeError(f"trust_index_urls: a URL prefix must be a string, got {prefix!r}")
        scheme_of(prefix)  # an unsupported scheme fails here
        made.append(_normal(prefix))
    return tuple(made)


@dataclass(frozen=True)
class Scope:
    """The origins one dataset's URLs named, and what ``trust_index_urls=`` adds.

    Attributes:
        named: the origins of the URLs the user gave (:func:`origin_of`).
        trusted: ``True`` (any remote URL), or the URL prefixes an index may name beyond
            ``named``.
    """

    named: frozenset[str]
    trusted: bool | tuple[str, ...]

    @classmethod
    def of(cls, items: Sequence[str], trust: TrustIndexURLs = False) -> Scope:
        """The scope of a dataset given as ``items`` (its URLs), with ``trust``.

        Raises:
            TypeError: ``trust`` is not a bool or a list of URL prefixes.
            ShardURLError: a prefix of an unsupported scheme.
        """
        trusted = _prefixes(trust)
        named = frozenset(origin_of(u) for item in items for u in expand_braces(item))
        return cls(named, trusted)

    def _admits(self, url: str) -> bool:
        if isinstance(self.trusted, bool):
            return self.trusted and not is_local(url)
        normal = _normal(url)
        return any(
            normal == p or normal.startswith(p if p.endswith("/") else p + "/")
            for p in self.trusted
        )

    def check(self, index_url: str, members: Sequence[str]) -> list[str]:
        """The shards ``index_url`` names (``members``) that lie beyond the named origins
        and the opt-in admits (they get no configured credentials); an index the user keeps
        locally names what it likes.

        Raises:
            DataError: a shard beyond the named origins that the opt-in does not admit,
                naming the index, the shards and how to admit them.
        """
        if is_local(index_url):
            return []
        own = self.named | {origin_of(index_url)}
        beyond = [u for u in members if is_local(u) or origin_of(u) not in own]
        refused = [u for u in beyond if not self._admits(u)]
        if refused:
            raise DataError(_refusal(index_url, refused, sorted(own)))
        return beyond


def _refusal(index_url: str, refused: Sequence[str], own: Sequence[str]) -> str:
    shown = ", ".join(refused[:_SHOWN])
    if len(refused) > _SHOWN:
        shown += f", ... ({len(refused)} in all)"
    local = [u for u in refused if is_local(u)]
    remote = sorted({origin_of(u) + "/" for u in refused if not is_local(u)})
    message = (
        f"{index_url}: this remote index names shards beyond the origins given "
        f"({', '.join(own)}), refused: {shown}. An index read from a server may name "
        "shards only on its own origin or that of another URL given"
    )
    if local:
        message += (
            "; a remote index never names a local file (trust_index_urls=True does not "
            "admit local files; listing their folder, trust_index_urls=['file:///...'], does)"
        )
    if remote:
        allow = ", ".join(repr(o) for o in remote)
        message += (
            f". If you trust this index, admit its origins: ShardStream(..., "
            f"trust_index_urls=[{allow}]) (True admits any remote URL); the origins "
            "admitted get none of the credentials or headers configured for yours"
        )
    return message
