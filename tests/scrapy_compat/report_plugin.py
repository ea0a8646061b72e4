"""pytest plugin (``-p report_plugin``): one JSON object ``{nodeid: outcome}`` written to
``$LEASED_COMPAT_REPORT`` at the end of the session. outcome: ``passed``, ``failed``
(any phase failed or errored), ``skipped``, or ``xfailed``."""

from __future__ import annotations

import json
import os
from typing import Any

_outcomes: dict[str, str] = {}
_details: dict[str, str] = {}


def pytest_runtest_logreport(report: Any) -> None:
    node = report.nodeid
    if report.failed:
        _outcomes[node] = "failed"
        _details.setdefault(node, _short(report))
    elif report.skipped and node not in _outcomes:
        _outcomes[node] = "xfailed" if hasattr(report, "wasxfail") else "skipped"
    elif report.when == "call" and report.passed and node not in _outcomes:
        _outcomes[node] = "passed"


def _short(report: Any) -> str:
    text = str(getattr(report, "longreprtext", "") or "")
    lines = [ln for ln in text.splitlines() if ln.startswith("E ")]
    return (lines[0] if lines else text.splitlines()[-1] if text else "")[:300]


def pytest_sessionfinish(session: Any) -> None:
    path = os.environ.get("LEASED_COMPAT_REPORT")
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"outcomes": _outcomes, "details": _details}, f, indent=0, sort_keys=True)
