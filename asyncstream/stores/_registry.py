"""The registry of stores: which store serves a URL scheme, and the one place a scheme is read.

A URL's scheme is parsed here and nowhere else (:func:`scheme_of`): ``s3://`` URLs go to
the S3 store, ``file://`` URLs and plain paths to the local-file store, ``http://`` and
``https://`` URLs to the web store (:mod:`._webstore`), and any scheme
registered with :func:`register_store` to its store. Every other module asks a store
(:class:`~._store.Store`) what a URL means: whether it names a folder, its canonical form,
how to list it, read it or write it.

The table maps a scheme to a store class by its import path (``"module:Class"``), as
MosaicML Streaming's ``storage/download.py`` maps a scheme to its downloader: a store's
module is imported only when a URL of its scheme is met, so the fetch engine's process
loads no client it does not use. The table travels to the engine with its settings
(``EngineConfig.registry``), so a store registered by the caller is found there too,
provided its module can be imported in a fresh interpreter (the engine's ``PYTHONPATH``
starts at the repository root). Adding a store is a new module (a
:class:`~._store.Store` subclass; see that module's docstring for what it implements)
and one call::

    register_store("mystore", "mypackage.mystore:MyStore")

A store's own settings (a web server's headers, a Google service-account file, an Azure
connection string) are given once per scheme with :func:`configure_store`, beside what
each store reads from its standard environment; they travel to the engine with the table
(``EngineConfig.store_settings``) and reach the store in :attr:`StoreSetup.settings
<._store.StoreSetup.settings>`::

    configure_store("https", headers={"X-Team": "vision"})

Where a URL's shards come from, for the trust checks of indexes (:func:`origin_of`): its
*origin* is the scope of the credentials that reach it (``scheme://host:port`` on the
web, ``scheme://bucket`` for object stores, ``file://`` for every local path). An
origin that only an index named (admitted with ``trust_index_urls=``) gets none of the
credentials or headers configured for its scheme. Which origins those are is the opened
dataset's to say, as data that travels with it (to a DataLoader worker, forked or
spawned): :func:`store_settings` and :func:`make_store` take them (``withhold``) and put
them in the web stores' settings, no process-wide state.

A store is named, not numbered: :class:`StoreKey` names the engine's store of one scheme
reached with one source's options (an *endpoint*, named after the first source that
uses them; ``""`` is the stream's own options).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlparse, urlsplit

from .._exceptions import ShardURLError
from ._origin import Origin
from ._store import Store, StoreSetup

__all__ = [
    "StoreKey",
    "canonical_url",
    "configure_store",
    "folder_url",
    "install_stores",
    "is_local",
    "is_served",
    "make_store",
    "origin_of",
    "register_store",
    "registered_stores",
    "scheme_of",
    "store_class",
    "store_settings",
    "unregister_store",
]

#: scheme -> "module:Class" of its store. Plain paths are ``file``.
_TABLE: dict[str, str] = {
    "s3": "asyncstream.stores._s3store:S3Store",
    "file": "asyncstream.stores._localstore:LocalStore",
    "gs": "asyncstream.stores._gcsstore:GCSStore",
    "https": "asyncstream.stores._webstore:WebStore",
    "http": "asyncstream.stores._webstore:HttpStore",
    "az": "asyncstream.stores._azurestore:AzureStore",
    "abfs": "asyncstream.stores._azurestore:AzureStore",
    "abfss": "asyncstream.stores._azurestore:AzureStore",
}
_BUILT_IN = dict(_TABLE)
_CLASSES: dict[str, type[Store]] = {}
#: scheme -> the settings given with configure_store
_SETTINGS: dict[str, dict[str, Any]] = {}
_WEB = ("http", "https")  # the schemes whose built-in store reads ``withhold``


@dataclass(frozen=True, slots=True, order=True)
class StoreKey:
    """Names one of the fetch engine's stores: a URL scheme, and the endpoint (the set of
    options, by name) that reaches it.

    Attributes:
        scheme: the URL scheme (``"s3"``, ``"file"``, or a registered one).
        endpoint: ``""`` for the stream's own options, else the name of a mixed stream's
            endpoint (``EngineConfig.endpoints``).
    """

    scheme: str
    endpoint: str = ""

    def __str__(self) -> str:
        return f"{self.scheme}://" + (f" at endpoint {self.endpoint!r}" if self.endpoint else "")


def register_store(scheme: str, target: str | type[Store]) -> None:
    """Serve URLs of ``scheme`` with a store.

    Args:
        scheme: the URL scheme, lowercase letters, digits, ``+``, ``-`` or ``.``, at
            least two characters (one letter is a Windows drive).
        target: the store class, or its import path ``"module:Class"``; a class is
            recorded by its module and name, which the engine process imports.

    Raises:
        ValueError: a malformed scheme or target, or ``file`` (plain paths are files).
        TypeError: a target that is not a :class:`~._store.Store` subclass.
    """
    if not scheme or len(scheme) < 2 or not scheme.isascii() or scheme.lower() != scheme:
        raise ValueError(f"a store's scheme must be two or more lowercase letters, got {scheme!r}")
    if scheme == "file":
        raise ValueError("the file scheme is the local-file store's; register another scheme")
    if isinstance(target, str):
        if target.count(":") != 1:
            raise ValueError(f"a store's import path is 'module:Class', got {target!r}")
        _CLASSES.pop(scheme, None)  # imported on first use
        _TABLE[scheme] = target
    elif isinstance(target, type) and issubclass(target, Store):
        _CLASSES[scheme] = target
        _TABLE[scheme] = f"{target.__module__}:{target.__qualname__}"
    else:
        raise TypeError(f"a store must be a Store subclass or 'module:Class', got {target!r}")


def unregister_store(scheme: str) -> None:
    """Forget a registered scheme (a built-in one goes back to its built-in store)."""
    _CLASSES.pop(scheme, None)
    if scheme in _BUILT_IN:
        _TABLE[scheme] = _BUILT_IN[scheme]
    else:
        _TABLE.pop(scheme, None)


def configure_store(scheme: str, **settings: Any) -> None:
    """Give the store of ``scheme`` settings of its own (each store's docstring and the
    Stores guide say which it reads); they replace those given before for that scheme,
    and none at all (``configure_store("https")``) forgets them.

    Settings are given per process, as the standard environment variables are: the fetch
    engine receives those in force when a stream is made. Values must pickle (strings,
    numbers, mappings of strings).

    Raises:
        ShardURLError: no store is registered for ``scheme``.
    """
    if scheme not in _TABLE:
        raise ShardURLError(f"no store is registered for the scheme {scheme!r}")
    if settings:
        _SETTINGS[scheme] = dict(settings)
    else:
        _SETTINGS.pop(scheme, None)


def _settings_of(scheme: str, withhold: Iterable[str] = ()) -> dict[str, Any]:
    """The settings of ``scheme``'s store: those given, and the origins of ``withhold``
    that are this scheme's (for the built-in web stores, which read ``withhold``)."""
    given = dict(_SETTINGS.get(scheme, {}))
    withheld = {o for o in withhold if o.partition("://")[0] == scheme}
    if withheld and scheme in _WEB and _TABLE.get(scheme) == _BUILT_IN.get(scheme):
        given["withhold"] = tuple(sorted(withheld | set(given.get("withhold", ()))))
    return given


def store_settings(
    withhold: Iterable[str] = (),
) -> tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]:
    """The settings given with :func:`configure_store`, scheme by scheme (what the engine
    process is given), with the web origins of ``withhold`` (``scheme://host:port``, those
    only an index named) withheld from."""
    withhold = tuple(withhold)
    schemes = sorted(set(_SETTINGS) | {o.partition("://")[0] for o in withhold})
    made = ((scheme, _settings_of(scheme, withhold)) for scheme in schemes)
    return tuple((scheme, tuple(sorted(given.items()))) for scheme, given in made if given)


def registered_stores() -> tuple[tuple[str, str], ...]:
    """The table, scheme by scheme: what the engine process is given."""
    return tuple(sorted(_TABLE.items()))


def install_stores(
    table: Iterable[tuple[str, str]],
    settings: Iterable[tuple[str, Iterable[tuple[str, Any]]]] = (),
) -> None:
    """Take a table from :func:`registered_stores` and the settings from
    :func:`store_settings` (in the engine process)."""
    for scheme, path in table:
        if _TABLE.get(scheme) != path:
            _CLASSES.pop(scheme, None)
            _TABLE[scheme] = path
    _SETTINGS.clear()
    _SETTINGS.update((scheme, dict(given)) for scheme, given in settings)


def origin_of(url: str) -> str:
    """The origin of a URL, the scope of the credentials that reach it: ``file://`` for
    a local path, ``scheme://host:port`` for a web URL, ``scheme://bucket`` (the URL's
    host, lower case) for another store.

    Raises:
        ShardURLError: a scheme no store is registered for.
    """
    scheme = scheme_of(url)
    if scheme == "file":
        return "file://"
    if scheme in _WEB:
        try:
            return str(Origin.of(url))
        except ValueError as exc:
            raise ShardURLError(f"{url!r}: {exc}") from None
    return f"{scheme}://{urlsplit(url).netloc.lower()}"


def scheme_of(url: str) -> str:
    """The scheme of a URL: ``"file"`` for a ``file://`` URL or a plain path, else its
    registered scheme. The one place a URL's scheme is read.

    Raises:
        ShardURLError: an empty string, or a scheme no store is registered for.
    """
    if not url:
        raise ShardURLError("an empty string is not a shard URL")
    scheme = urlparse(url).scheme
    if scheme in ("", "file") or (len(scheme) == 1 and url[1:3] in (":\\", ":/")):
        return "file"
    if scheme in _TABLE:
        return scheme
    expected = ", ".join(f"{s}://" for s in sorted(_TABLE) if s != "file")
    raise ShardURLError(
        f"{url!r}: unsupported scheme {scheme!r}; expected {expected}, file:// or a local path"
    )


def is_served(url: str) -> bool:
    """Whether a store is registered for ``url``'s scheme (a plain path: the local one)."""
    try:
        scheme_of(url)
    except ShardURLError:
        return False
    return True


def is_local(url: str) -> bool:
    """Whether ``url`` is a local file (``file://`` or a plain path)."""
    return scheme_of(url) == "file"


def store_class(scheme: str) -> type[Store]:
    """The store class of a scheme, imported on first use.

    Raises:
        ShardURLError: no store is registered for ``scheme``.
    """
    cls = _CLASSES.get(scheme)
    if cls is None:
        path = _TABLE.get(scheme)
        if path is None:
            raise ShardURLError(f"no store is registered for the scheme {scheme!r}")
        module, _, name = path.partition(":")
        # __import__, not importlib.import_module: the import statement's own path, which
        # -X importtime (the engine's import test) sees.
        found = __import__(module, fromlist=["__name__"])
        for part in name.split("."):
            found = getattr(found, part)
        if not (isinstance(found, type) and issubclass(found, Store)):
            raise TypeError(f"{path} (the store of {scheme}://) is not a Store subclass")
        cls = _CLASSES[scheme] = found
    return cls


def make_store(scheme: str, setup: StoreSetup, withhold: Iterable[str] = ()) -> Store:
    """A new store for URLs of ``scheme`` (see :meth:`~._store.Store.from_setup`), with the
    settings given for it by :func:`configure_store` where ``setup`` carries none, and
    none of the credentials for the web origins of ``withhold``."""
    given = _settings_of(scheme, withhold)
    if given and not setup.settings:
        setup = replace(setup, settings=given)
    return store_class(scheme).from_setup(setup)


def canonical_url(url: str) -> str:
    """The canonical form of a URL, as its store writes it (``file:///abs/path`` for a
    local path; others as they are)."""
    return store_class(scheme_of(url)).canonical(url)


def folder_url(url: str) -> str:
    """The folder URL of a prefix or local folder (canonical, no trailing slash)."""
    return canonical_url(url).rstrip("/")
