"""The local test site (``example_project/testsite.py``) with TCP_NODELAY on its sockets.

    python benchmarks/bench_site.py --pages 5000 --port 0 --log /tmp/site.jsonl

The stock server writes a response's headers and its body in two ``send()`` calls: on
a keep-alive connection Nagle's algorithm holds the body until the client ACKs the
headers, and the client delays that ACK (~40 ms). Measured: 44 ms per request on one
keep-alive connection, which caps any crawler at about CONCURRENT_REQUESTS_PER_DOMAIN /
44 ms (~180 pages/s with 8) and hides the crawler's own costs. This wrapper sets
socketserver's ``disable_nagle_algorithm`` (TCP_NODELAY, as nginx's ``tcp_nodelay on``)
and runs the same site, unchanged otherwise. ``BenchSite`` is ``SiteProcess`` running it.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import json
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from example_project import testsite  # noqa: E402

SCRIPT = Path(__file__).resolve()


class BenchSite(testsite.SiteProcess):
    """``SiteProcess`` running this wrapper (``nodelay=False``: the stock site)."""

    def __init__(self, *args, nodelay: bool = True, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.nodelay = nodelay

    def start(self, timeout: float = 10.0) -> "BenchSite":
        script = SCRIPT if self.nodelay else testsite.SCRIPT
        cmd = [sys.executable, str(script), "--pages", str(self.pages),
               "--port", str(self.first_port), "--ports", str(self.nports),
               "--log", str(self.log_path)]
        self.proc = subprocess.Popen(cmd, cwd=str(script.parent), stdout=subprocess.PIPE,
                                     text=True)
        testsite._register_child(self.proc)
        result: list[str] = []
        reader = threading.Thread(target=lambda: result.append(self.proc.stdout.readline()),
                                  daemon=True)
        reader.start()
        reader.join(timeout)
        if not result or not result[0].strip():
            self.stop()
            raise RuntimeError(f"test site subprocess did not start within {timeout}s: {cmd}")
        self.urls = json.loads(result[0])["urls"]
        return self


if __name__ == "__main__":
    testsite._Handler.disable_nagle_algorithm = True
    sys.exit(testsite.main(prog="python benchmarks/bench_site.py"))
