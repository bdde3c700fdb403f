"""MkDocs hooks: the benchmark results join the site where the docs link to them.

``bench/RESULTS.md`` and its plots live beside the benchmark, outside ``docs/``. The
pages link to them as ``../bench/RESULTS.md``, which is where a reader of the repository
finds them; for the site, the file and its plots are added as ``bench/...`` and those
links rewritten to match, so ``mkdocs build --strict`` checks them like any other.

The site's home takes the README's quick start where ``docs/index.md`` has the include
marker, so the two cannot drift; the README's links into ``docs/`` are made the site's.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
README = ROOT / "README.md"
INCLUDE = re.compile(r"^<!-- include: the README's \"(?P<heading>## [^\"]+)\" section .*-->$", re.M)


def on_files(files: Files, config: Any) -> Files:
    """Add bench/RESULTS.md and bench/plots/*.png to the site's files."""
    for path in [BENCH / "RESULTS.md", *sorted((BENCH / "plots").glob("*.png"))]:
        uri = path.relative_to(ROOT).as_posix()
        files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """Point a page's links to ../bench/ at the copies the site holds."""
    if "/" in page.file.src_uri:  # bench/RESULTS.md itself links plots/, as it should
        return markdown
    markdown = INCLUDE.sub(lambda m: readme_section(m["heading"]), markdown)
    return markdown.replace("](../bench/", "](bench/")


def readme_section(heading: str) -> str:
    """The README's section under ``heading`` (to the next one), its links made the site's."""
    text = README.read_text()
    start = text.find(f"\n{heading}\n")
    if start < 0:
        raise ValueError(f"README.md has no section {heading!r} for docs/index.md to include")
    end = text.find("\n## ", start + len(heading) + 2)
    section = text[start + 1 : end if end >= 0 else len(text)]
    return section.replace("](docs/", "](")
