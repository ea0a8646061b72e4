"""The local test site (``example_project/testsite.py``) with TCP_NODELAY on its sockets.

    python benchmarks/site_nodelay.py --pages 5000 --port 0 --log /tmp/site.jsonl

The stock server writes a response's headers and its body in two ``send()`` calls: on
a keep-alive connection Nagle's algorithm holds the body until the client ACKs the
headers, and the client delays that ACK (~40 ms). Measured: 44 ms per request on one
keep-alive connection, which caps any crawler at about CONCURRENT_REQUESTS_PER_DOMAIN /
44 ms (~180 pages/s with 8) and hides the crawler's own costs. This wrapper sets
socketserver's ``disable_nagle_algorithm`` (TCP_NODELAY, as nginx's ``tcp_nodelay on``)
and runs the same site, unchanged otherwise. ``BenchSite`` is ``SiteProcess`` running it.
"""

from __future__ import annotations

import sys
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
        if nodelay:
            self.script = SCRIPT


if __name__ == "__main__":
    testsite._Handler.disable_nagle_algorithm = True
    sys.exit(testsite.main(prog="python benchmarks/site_nodelay.py"))
