"""The documentation's shape, checked without running it.

``tests/test_readme.py`` runs the examples of the README and of every page of ``docs/``
(in the order of mkdocs.yml's navigation); ``make docs`` builds the site with warnings
as errors. What is left to check here, in a fraction of a second: every page is in the
navigation (so its examples run), every Python example parses (the skipped ones too),
the README's links to the docs lead somewhere, and the README stays a front door.
"""

from __future__ import annotations

import re
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
