"""A Griffe extension for the API reference: the docstrings as a user reads them.

mkdocstrings renders docstrings as Markdown, where the Sphinx roles the docstrings use
(``:meth:`set_epoch```, ``:class:`~asyncstream.StaleShardWarning```) would show as raw
text. The docstrings keep their roles (they read well in ``help()`` and in the source);
this extension rewrites each one, when the package is loaded, into what Markdown shows:

* a cross-reference (``[`set_epoch()`][asyncstream.ShardStream.set_epoch]``) where the
  target is on the site: a name ``docs/api.md`` documents (``::: asyncstream.X``) or a
  public member of one, found the way Sphinx finds it (the object's own members, then
  its class's and module's, then relative to its package for ``.name``, then absolute,
  then in ``asyncstream``, ``asyncstream.testing`` and ``dali_ops``);
* inline code where the target is private, outside the project, or not found.

``mkdocs build --strict`` fails on a cross-reference that does not resolve, so a link
made here to a page that does not document its target fails the build.

It also expands ``ShardStream``'s ``**flat: Unpack[FlatSettings]`` into the keyword
arguments a user types, each with its type (``FlatSettings``), its default and its
description (the config object field it maps to, through ``_config.FLAT``), in the
signature and in the parameters table, so nothing is written twice.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

from griffe import (
    Alias,
    DocstringSectionKind,
    Extension,
    GriffeLoader,
    Module,
    Object,
    Parameter,
    ParameterKind,
    parse_google,
)

API_PAGE = Path(__file__).resolve().parent / "api.md"
PACKAGES = ("asyncstream", "dali_ops")
_SEARCH = ("asyncstream", "asyncstream.testing", "dali_ops")
ROLE = re.compile(
    r":(?:py:)?(?P<role>meth|class|func|attr|exc|data|mod|obj|const|type):`(?P<body>[^`]+)`"
)
_TITLED = re.compile(r"^(?P<title>.+?)\s*<(?P<target>[^<>]+)>$", re.DOTALL)


def documented_roots() -> list[str]:
    """The objects ``docs/api.md`` documents (its ``::: path`` lines)."""
    lines = API_PAGE.read_text().splitlines()
    return [line[4:].strip() for line in lines if line.startswith("::: ")]


def _public_tail(rest: str) -> bool:
    """Whether a member path below a documented object is rendered (no private part)."""
    return all(part and not part.startswith("_") for part in rest.split("."))


def _rendered(found: Object | Alias) -> bool:
    """Whether mkdocstrings renders a member (it leaves out those with no docstring)."""
    try:
        return bool(found.docstring)
    except Exception:  # an alias to something not loaded
        return False


class _Resolver:
    """Finds a role's target in the loaded packages and the site's identifier for it."""

    def __init__(self, loader: GriffeLoader) -> None:
        self.collection = loader.modules_collection
        self.roots = documented_roots()
        self._canonical: dict[str, str] = {}

    def find(self, path: str) -> Object | Alias | None:
        try:
            found = self.collection.get_member(path)
        except Exception:  # not loaded, not there, or an alias that does not resolve
            return None
        return found  # type: ignore[no-any-return]

    def candidates(self, owner: Object, target: str) -> list[str]:
        scopes: list[Object] = []
        scope: Object | None = owner
        while scope is not None:
            scopes.append(scope)
            scope = scope.parent
        if target.startswith("."):
            return [f"{s.path}{target}" for s in scopes]
        return [
            *(f"{s.path}.{target}" for s in scopes),
            target,
            *(f"{package}.{target}" for package in _SEARCH),
        ]

    def _root_canonical(self, root: str) -> str | None:
        if root not in self._canonical:
            found = self.find(root)
            try:
                canonical = found.canonical_path if found is not None else None
            except Exception:
                canonical = None
            if canonical is None:
                return None
            self._canonical[root] = canonical
        return self._canonical[root]

    def site_identifier(self, path: str, found: Object | Alias) -> str | None:
        for root in self.roots:
            if path == root or (
                path.startswith(root + ".") and _public_tail(path[len(root) + 1 :])
            ):
                return path if path == root or _rendered(found) else None
        try:
            canonical = found.canonical_path
        except Exception:
            return None
        for root in self.roots:
            base = self._root_canonical(root)
            if base is None:
                continue
            if canonical == base:
                return root
            if canonical.startswith(base + ".") and _public_tail(canonical[len(base) + 1 :]):
                return root + canonical[len(base) :] if _rendered(found) else None
        return None

    def resolve(self, owner: Object, target: str) -> str | None:
        """The site identifier of ``target`` as written in ``owner``'s docstring, if any."""
        for path in self.candidates(owner, target):
            found = self.find(path)
            if found is not None:
                return self.site_identifier(path, found)
        return None


def rewrite_roles(text: str, owner: Object, resolver: _Resolver) -> str:
    """``text`` with each Sphinx role made a cross-reference or inline code."""

    def one(match: re.Match[str]) -> str:
        body = " ".join(match["body"].split())
        titled = _TITLED.match(body)
        title, target = (titled["title"], titled["target"]) if titled else (None, body)
        short = target.startswith("~")
        target = target.lstrip("~!")
        if title is None:
            title = target.rsplit(".", 1)[-1] if short else target.lstrip(".")
            if match["role"] in ("meth", "func"):
                title += "()"
        identifier = None if match["body"].startswith("!") else resolver.resolve(owner, target)
        code = f"`{title}`"
        return f"[{code}][{identifier}]" if identifier else code

    return ROLE.sub(one, text)


def _walk(obj: Object) -> list[Object]:
    found = [obj]
    for member in obj.members.values():
        if not member.is_alias:
            found.extend(_walk(member))  # type: ignore[arg-type]
    return found


def _flat_default(value: Any) -> str:
    text = str(value)
    factory = re.fullmatch(r"field\(default_factory=(\w+)\)", text)
    return f"{factory[1]}()" if factory else text


def _entry_span(text: str, name: str) -> tuple[int, int, str]:
    """Where the Google-style entry ``name:`` of an ``Args:`` section starts and ends."""
    start = re.search(rf"^(?P<indent>[ ]*){re.escape(name)}:", text, re.MULTILINE)
    if start is None:
        raise ValueError(f"no entry {name!r} in the docstring")
    indent = start["indent"]
    end = re.compile(rf"^(?:{indent}\S|[ ]{{0,{max(len(indent) - 4, 0)}}}\S)", re.MULTILINE)
    after = end.search(text, start.end())
    return start.start(), after.start() if after else len(text), indent


def expand_flat(package: Module) -> None:
    """``ShardStream(**flat)`` as the keyword arguments ``FlatSettings`` lists."""
    config = package["_config"]
    flat_map: dict[str, tuple[str, str]] = ast.literal_eval(str(config["FLAT"].value))
    settings = config["FlatSettings"]
    stream = package.get_member("stream._stream.ShardStream")
    init = stream["__init__"]
    kwargs = [p for p in init.parameters if p.kind is ParameterKind.var_keyword]
    if not kwargs or stream.docstring is None:
        return
    descriptions: dict[tuple[str, str], str] = {}
    for group in ("order", "fetch", "cache", "index"):
        cls = config[f"{group.capitalize()}Config"]
        for section in parse_google(cls.docstring, warnings=False):
            if section.kind is DocstringSectionKind.parameters:
                for item in section.value:
                    descriptions[group, item.name] = item.description
    docstring = stream.docstring.value
    start, end, indent = _entry_span(docstring, f"**{kwargs[0].name}")
    entries: list[str] = []
    del init.parameters[kwargs[0].name]
    for name, (group, attr) in flat_map.items():
        cls_name = f"{group.capitalize()}Config"
        default = _flat_default(config[cls_name][attr].value)
        init.parameters.add(
            Parameter(
                name,
                annotation=settings[name].annotation,
                kind=ParameterKind.keyword_only,
                default=default,
            )
        )
        text = " ".join(descriptions.get((group, attr), "").split())
        where = f"`{group}=`[`{cls_name}.{attr}`][asyncstream.{cls_name}]"
        entries.append(f"{indent}{name}: {text} ({where})\n")
    stream.docstring.value = docstring[:start] + "".join(entries) + docstring[end:]


class SiteDocstrings(Extension):
    """Sphinx roles as links or code, and ``ShardStream``'s flat keyword arguments."""

    def on_package(self, *, pkg: Module, loader: GriffeLoader, **kwargs: Any) -> None:
        if pkg.name not in PACKAGES:
            return
        for other in PACKAGES:  # cross-references between the two packages resolve
            if other not in loader.modules_collection:
                loader.load(other)
        resolver = _Resolver(loader)
        for obj in _walk(pkg):
            if obj.docstring is not None and ":" in obj.docstring.value:
                obj.docstring.value = rewrite_roles(obj.docstring.value, obj, resolver)
        if pkg.name == "asyncstream":
            expand_flat(pkg)
