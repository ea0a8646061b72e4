"""No class over 300 lines and no function over 60 lines in scrapy_leased/ (issue 28).

``KNOWN`` lists the ones still too long while the house is being moved: the test fails on
any new one, and on an entry of ``KNOWN`` that is now short enough (delete it, so the
list only shrinks). Lines are counted from the ``def``/``class`` line (decorators
excluded) to the last line of the body, docstrings and comments included.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[1] / "scrapy_leased"
MAX_CLASS = 300
MAX_FUNCTION = 60

#: "module:Qualified.name" of what is still too long
KNOWN: set[str] = set()


def too_long() -> dict[str, int]:
    found: dict[str, int] = {}

    def walk(node: ast.AST, module: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                size = (child.end_lineno or child.lineno) - child.lineno + 1
                limit = MAX_CLASS if isinstance(child, ast.ClassDef) else MAX_FUNCTION
                if size > limit:
                    found[f"{module}:{name}"] = size
                walk(child, module, f"{name}.")
            else:
                walk(child, module, prefix)

    for path in sorted(PACKAGE.rglob("*.py")):
        module = str(path.relative_to(PACKAGE.parent).with_suffix("")).replace("/", ".")
        walk(ast.parse(path.read_text(encoding="utf-8")), module, "")
    return found


def test_no_class_over_300_lines_and_no_function_over_60() -> None:
    found = too_long()
    new = {name: size for name, size in found.items() if name not in KNOWN}
    assert not new, f"too long (class > {MAX_CLASS}, function > {MAX_FUNCTION} lines): {new}"
    gone = sorted(KNOWN - set(found))
    assert not gone, f"short enough now, delete from KNOWN: {gone}"
