"""MkDocs hook: serve files kept at the repository root as pages of the site.

BENCHMARKS.md is written by ``benchmarks/run_all.py`` at the root and CHANGELOG.md lives
there by convention; both become pages without a copy in docs/.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
PAGES = {"benchmarks-results.md": "BENCHMARKS.md", "changelog.md": "CHANGELOG.md"}


def on_files(files: Files, config: Any) -> Files:
    for page, source in PAGES.items():
        text = (ROOT / source).read_text(encoding="utf-8")
        files.append(File.generated(config, page, content=text))
    return files
