"""The deterministic local test website, for crawl tests.

The implementation lives in ``example_project/testsite.py`` (bundled with the example
project, so the demo and the tests share one site); this module re-exports it for the
tests and keeps ``python -m tests.support.site`` working. Routes, page links and the
request log are documented there.
"""

from __future__ import annotations

import sys
from pathlib import Path

from example_project.testsite import (  # noqa: F401 (re-exported)
    N_CHILDREN,
    Site,
    SiteProcess,
    main,
    page_children,
    page_cross_links,
    page_html,
    page_links,
    read_log,
)

REPO_ROOT = Path(__file__).resolve().parents[2]

if __name__ == "__main__":
    sys.exit(main(prog="python -m tests.support.site"))
