"""The documentation's shape, checked without running it.

``tests/test_readme.py`` runs the examples of the README and of every page of ``docs/``
(in the order of mkdocs.yml's navigation); ``make docs`` builds the site with warnings
as errors. What is left to check here, in a fraction of a second: every page is in the
navigation (so its examples run), every Python example parses (the skipped ones too),
the README's links to the docs lead somewhere, and the README stays a front door.

One test module-wide builds the site (``mkdocs build --strict``, a few seconds) into a
temporary folder and reads what a visitor reads: no Sphinx role left as raw text,
``ShardStream``'s keyword arguments each with its type and default, the README's quick
start on the home page.
"""

from __future__ import annotations

import ast
import dataclasses
import html
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_readme import MKDOCS, README, ROOT, docs_pages, readme_blocks

DOCS = ROOT / "docs"
_LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")
_README_MAX_LINES = 300


def _pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def test_every_page_is_in_the_navigation() -> None:
    in_nav = docs_pages()
    assert len(in_nav) == len(set(in_nav)), "a page is in mkdocs.yml's nav twice"
    assert sorted(in_nav) == _pages(), "docs/*.md and mkdocs.yml's nav disagree"
    assert "bench/RESULTS.md" in MKDOCS.read_text()


@pytest.mark.parametrize("path", [README, *_pages()], ids=lambda p: p.name)
def test_python_examples_parse(path: Path) -> None:
    name = path.relative_to(ROOT).as_posix()
    blocks = readme_blocks(path.read_text(), name)
    for block in blocks:
        if block.marker == "skip":
            assert block.reason, f"{block.where}: a skip marker gives its reason"
        if block.lang == "python":
            compile("\n" * block.line + block.code, name, "exec")  # SyntaxError names it


def test_readme_links_resolve() -> None:
    text = README.read_text()
    targets = [m["target"] for m in _LINK.finditer(text)]
    local = [t.split("#")[0] for t in targets if not re.match(r"[a-z]+:", t)]
    assert any(t.startswith("docs/") for t in local), "the README links to no docs page"
    missing = [t for t in local if t and not (ROOT / t).exists()]
    assert not missing, f"the README links to files that do not exist: {missing}"


def test_readme_is_the_front_door() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) < _README_MAX_LINES, (
        f"README.md has {len(lines)} lines: move guides and reference to docs/"
    )
    for needle in ("make demo", "make check", "bench/RESULTS.md", "docs/architecture.md"):
        assert needle in README.read_text(), needle


def test_make_lint_builds_the_docs() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "mkdocs build --strict" in makefile
    lint = makefile.split("\nlint:", 1)[1].split("\n\n", 1)[0]
    assert "$(MAKE) docs" in lint, "make lint (and so CI) does not build the docs"
    assert ".[test,docs]" in makefile, "make install does not install the docs extra"


_RAW_ROLE = re.compile(r":(?:py:)?(?:meth|class|func|attr|exc|data|mod|obj|const):")
_TAG = re.compile(r"<[^>]+>")


def _exported(module: str) -> list[str]:
    """A package's ``__all__``, read without importing it (dali_ops imports DALI)."""
    path = ROOT / module.replace(".", "/") / "__init__.py"
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return [n for n in ast.literal_eval(node.value) if not n.startswith("__")]
    raise AssertionError(f"{module} has no __all__")


def test_every_public_name_is_in_the_api_reference() -> None:
    documented = set(re.findall(r"^::: (\S+)$", (DOCS / "api.md").read_text(), re.MULTILINE))
    names = {
        f"{m}.{n}" for m in ("asyncstream", "asyncstream.testing", "dali_ops") for n in _exported(m)
    }
    # asyncstream re-exports LocalS3, documented where it lives (asyncstream.testing).
    names -= {"asyncstream.LocalS3"}
    assert sorted(names - documented) == [], "exported but not in docs/api.md"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("mkdocstrings_handlers.python", reason="the docs extra is not installed")
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, f"mkdocs build --strict failed:\n{build.stderr}"
    return out


def _text(page: Path) -> str:
    return html.unescape(_TAG.sub("", page.read_text()))


@pytest.mark.slow
def test_no_page_shows_a_raw_sphinx_role(site: Path) -> None:
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 10
    raw = {p.relative_to(site).as_posix(): sorted(set(_RAW_ROLE.findall(_text(p)))) for p in pages}
    assert {page: roles for page, roles in raw.items() if roles} == {}


@pytest.mark.slow
def test_roles_are_links_to_the_reference(site: Path) -> None:
    api = (site / "api.html").read_text()
    # ShardStream's docstring: ":meth:`set_epoch`", ":class:`~asyncstream.StaleShardWarning`"
    link = '<a class="autorefs autorefs-internal" title="{}" href="#{}"><code>{}</code></a>'
    assert link.format("set_epoch", "asyncstream.ShardStream.set_epoch", "set_epoch()") in api
    assert (
        link.format(
            "asyncstream.StaleShardWarning", "asyncstream.StaleShardWarning", "StaleShardWarning"
        )
        in api
    )


@pytest.mark.slow
def test_shardstream_keyword_arguments_have_types_and_defaults(site: Path) -> None:
    from asyncstream import RetryPolicy, Timeouts
    from asyncstream._config import _CLASSES, FLAT

    text = _text(site / "api.html")
    start = text.index("ShardStream(")
    signature = text[start : text.index("\n)", start)]
    assert "**flat" not in signature
    assert "Unpack" not in signature
    namespace = {"RetryPolicy": RetryPolicy, "Timeouts": Timeouts}
    for key, (group, attr) in FLAT.items():
        line = re.search(rf"^\s+{key}: (?P<type>.+) = (?P<default>.+),$", signature, re.MULTILINE)
        assert line, f"ShardStream's signature on the site lacks {key}"
        field = {f.name: f for f in dataclasses.fields(_CLASSES[group])}[attr]
        want = field.default_factory() if callable(field.default_factory) else field.default
        assert eval(line["default"], namespace) == want, key
        # and its row in the parameters table names the config field it sets
        assert f"({group}={_CLASSES[group].__name__}.{attr})" in text, key


@pytest.mark.slow
def test_home_page_has_the_readme_quick_start(site: Path) -> None:
    readme = README.read_text()
    section = readme.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    prose = [line for line in section.splitlines() if line and line[0].isalpha()]
    home = " ".join(_text(site / "index.html").split())
    for line in prose[:3]:
        plain = re.sub(r"`|\[|\]\([^)]*\)", "", line).strip()
        assert plain in home, f"the home page lacks the README's quick start: {plain!r}"
