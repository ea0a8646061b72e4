"""The package's layers point one way (issue 28's map), read from the imports.

Each part of ``scrapy_leased`` (a subpackage, or a top-level module) sits in a layer; a
part may import from its own layer and the ones below, never above, and no two parts
import each other, directly or round a circle. Every import counts: at module level, in
a function, under ``TYPE_CHECKING``.

``KNOWN`` lists the wrong-way imports and the circles the code still has, while the
house is being moved: the test fails on any new one, and on an entry of ``KNOWN`` that
is gone (delete it, so the list only shrinks).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[1] / "scrapy_leased"

#: bottom to top: ``_redis <- frontier <- settings <- {ratelimit, upsert, feed, fleet}
#: <- {worker, observe} <- {addon, commands}``, with the leaf helpers at the bottom
LAYERS: list[set[str]] = [
    {"_version", "_compat", "_cancel", "_supervise", "_command", "meta", "signals", "exceptions",
     "_redis", "testing"},
    {"frontier"},
    {"settings", "bootstrap", "codec", "order", "runtime"},
    {"ratelimit", "upsert", "feed", "fleet"},
    {"worker", "observe"},
    {"addon", "commands", "__init__"},
]

#: what is still to move: (importer, imported) for a wrong-way import, and the sorted
#: parts of each circle within a layer
KNOWN: set[tuple[str, ...]] = set()


def _part(module: str) -> str:
    """The part of ``scrapy_leased.x.y`` that layers count: ``x``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _target(module: str, is_package: bool, node: ast.ImportFrom, name: str) -> str:
    if node.level:
        base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    candidate = f"{target}.{name}"
    path = PACKAGE.parent.joinpath(*candidate.split("."))
    return candidate if path.with_suffix(".py").exists() or path.is_dir() else target


def imports() -> dict[str, set[str]]:
    """part -> the other parts it imports."""
    edges: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        module = ".".join(parts[:-1] if is_package else parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                targets = [_target(module, is_package, node, a.name) for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for target in targets:
                if target.startswith("scrapy_leased") and _part(target) != _part(module):
                    edges[_part(module)].add(_part(target))
    return edges


def layer_of(part: str) -> int:
    for i, layer in enumerate(LAYERS):
        if part in layer:
            return i
    raise AssertionError(f"scrapy_leased.{part} is in no layer of LAYERS: add it")


def circles(edges: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """The strongly connected parts (Tarjan), as ``("circle", *sorted parts)``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: set[tuple[str, ...]] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.add(("circle", *sorted(group)))

    for v in list(edges):
        if v not in index:
            visit(v)
    return found


def problems(edges: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """The wrong-way imports, and the circles within a layer: a circle across layers
    has a wrong-way import in it, already named."""
    wrong = {(a, b) for a, bs in edges.items() for b in bs if layer_of(b) > layer_of(a)}
    level = {a: {b for b in bs if layer_of(b) == layer_of(a)} for a, bs in edges.items()}
    return wrong | circles(level)


def test_every_part_is_in_a_layer() -> None:
    parts = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
             if (p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists()))}
    missing = sorted(p for p in parts if not any(p in layer for layer in LAYERS))
    assert not missing, f"add to LAYERS: {missing}"


def test_imports_point_down_and_make_no_circle() -> None:
    found = problems(imports())
    new = sorted(found - KNOWN)
    gone = sorted(KNOWN - found)
    assert not new, f"wrong-way imports or circles: {new}"
    assert not gone, f"fixed, delete from KNOWN: {gone}"


def test_the_check_finds_a_wrong_way_import_and_a_circle() -> None:
    edges = {"frontier": {"_redis"}, "_redis": {"frontier"}, "settings": {"worker"}}
    assert problems(edges) == {("_redis", "frontier"), ("settings", "worker")}
    edges = {"fleet": {"feed"}, "feed": {"upsert"}, "upsert": {"fleet"}, "frontier": {"_redis"}}
    assert problems(edges) == {("circle", "feed", "fleet", "upsert")}
