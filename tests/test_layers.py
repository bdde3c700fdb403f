"""The shape of the code: no import cycle in asyncstream, dali_ops or bench, and a fetch
engine process that imports what fetching needs and nothing else.

The layers themselves are import-linter's contracts (``pyproject.toml``, ``make lint``);
these tests check what the contracts leave to a test: every module-level cycle, found on
grimp's import graph (imports under ``TYPE_CHECKING`` and inside functions included),
and the modules a real engine process has imported once it has fetched.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import grimp
import pytest

from asyncstream import LocalS3
from asyncstream.engine._engine import Engine, EngineConfig
from asyncstream.stores._store import ChunkRequest

PACKAGES = ("asyncstream", "dali_ops", "bench")

# What the engine's process must never import: PyTorch, Pillow, moto (and the server it
# runs in), the test support, DALI and its package, the benchmark.
FORBIDDEN_IN_ENGINE = (
    "torch",
    "torchdata",
    "PIL",
    "moto",
    "werkzeug",
    "flask",
    "asyncstream.testing",
    "asyncstream.stream",
    "asyncstream.dataset",
    "asyncstream.packing",
    "asyncstream.cli",
    "dali_ops",
    "nvidia",
    "bench",
    "azure",  # the Azure store's SDK: only where an az:// URL is read
)


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The import cycles of ``graph``: its strongly connected components of more than one
    module (Tarjan's algorithm, iterative), each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = []
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        work.append((root, sorted(graph.find_modules_directly_imported_by(root))))
        while work:
            module, todo = work[-1]
            if todo:
                child = todo.pop()
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, sorted(graph.find_modules_directly_imported_by(child))))
                elif child in on_stack:
                    low[module] = min(low[module], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[module])
            if low[module] == index[module]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == module:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def _graph(imports: Iterable[tuple[str, str]]) -> grimp.ImportGraph:
    graph = grimp.ImportGraph()
    for importer, imported in imports:
        graph.add_import(importer=importer, imported=imported)
    return graph


def test_the_cycle_finder_finds_cycles() -> None:
    graph = _graph(
        [
            ("pkg.a", "pkg.b"),
            ("pkg.b", "pkg.c"),
            ("pkg.c", "pkg.a"),  # a -> b -> c -> a
            ("pkg.c", "pkg.d"),
            ("pkg.d", "pkg.e"),
            ("pkg.e", "pkg.d"),  # d <-> e
            ("pkg.f", "pkg.a"),  # f only imports into a cycle
        ]
    )
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"], ["pkg.d", "pkg.e"]]
    assert cycles(_graph([("pkg.a", "pkg.b"), ("pkg.b", "pkg.c")])) == []


def test_no_import_cycle_anywhere() -> None:
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    assert "asyncstream.engine._engine" in graph.modules  # the graph is the real one
    assert "dali_ops._loader" in graph.modules
    assert "bench.harness" in graph.modules
    found = cycles(graph)
    assert found == [], "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


_IMPORT_TIME = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)\s*$", re.MULTILINE)


def test_the_engine_process_imports_only_what_fetching_needs(
    s3_server: LocalS3,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A real engine process fetches from S3 (the direct transport), through its cache and
    from a local file; Python's own import log (``PYTHONPROFILEIMPORTTIME``, read by the
    new interpreter only) names every module it imported."""
    client = s3_server.client()
    client.create_bucket(Bucket="engine-imports")
    client.put_object(Bucket="engine-imports", Key="a.tar", Body=b"s3 bytes" * 1000)
    local = tmp_path / "b.tar"
    local.write_bytes(b"local bytes" * 1000)
    requests = [
        ChunkRequest("s3://engine-imports/a.tar", 0, 8000, size=8000),
        ChunkRequest(local.as_uri(), 0, 11000, size=11000),
    ]
    capfd.readouterr()
    monkeypatch.setenv("PYTHONPROFILEIMPORTTIME", "1")
    config = EngineConfig(s3=s3_server.options(), cache_dir=str(tmp_path / "cache"))
    engine = Engine(config, n_slots=2, slot_bytes=16000, mode="process")
    try:
        engine.submit(requests)
        for expected in requests:
            ready = engine.next()
            assert len(engine.view(ready)) == expected.length
            engine.release(ready.slot)
        engine.stats()
    finally:
        engine.close(wait=True)
    imported = set(_IMPORT_TIME.findall(capfd.readouterr().err))
    # The log is the engine's: its own modules and what fetching from S3 needs are there.
    for needed in (
        "asyncstream.engine._server",
        "asyncstream.engine._scheduler",
        "asyncstream.engine._cache",
        "asyncstream.stores._s3store",
        "asyncstream.stores._localstore",
    ):
        assert needed in imported, f"{needed} missing from the engine's imports"
    # A path-style endpoint needs no botocore client in the engine (its imports would
    # compete with the consumer's open for the first sample).
    assert "aiobotocore.session" not in imported
    assert "aiohttp" not in imported
    # The consumer's handle (and what starts processes) stays in the consumer.
    assert "asyncstream.engine._engine" not in imported
    bad = sorted(
        name
        for name in imported
        if any(name == f or name.startswith(f + ".") for f in FORBIDDEN_IN_ENGINE)
    )
    assert bad == [], f"the engine process imported {bad}"
