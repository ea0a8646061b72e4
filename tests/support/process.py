"""Ending a test's subprocess."""

from __future__ import annotations

import subprocess
from typing import Any


def terminate(proc: subprocess.Popen[Any] | None, grace: float) -> None:
    """SIGTERM ``proc`` if it still runs, SIGKILL it if it has not ended ``grace`` seconds
    later; return once it has ended."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
