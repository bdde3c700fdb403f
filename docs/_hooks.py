"""MkDocs hooks: the benchmark results join the site where the docs link to them.

``bench/RESULTS.md`` and its plots live beside the benchmark, outside ``docs/``. The
pages link to them as ``../bench/RESULTS.md``, which is where a reader of the repository
finds them; for the site, the file and its plots are added as ``bench/...`` and those
links rewritten to match, so ``mkdocs build --strict`` checks them like any other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"


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
    return markdown.replace("](../bench/", "](bench/")
