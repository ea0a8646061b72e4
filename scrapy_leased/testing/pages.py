"""The test site's pages: which pages page i links to, and its HTML.

Page i has ``<title>page {i}</title>`` and links to its children ``i*10+1 .. i*10+10``
(those < pages, so every page is reachable from ``/p/0`` as a tree) plus the cross links
``(i+1) % pages`` and ``(i*7+3) % pages`` (so duplicates are discovered), except that
nothing links to page 0 (the start page; a dont_filter start request would otherwise be
fetched twice).
"""

from __future__ import annotations

N_CHILDREN = 10


def page_children(i: int, pages: int) -> list[int]:
    """Tree children of page i: i*10+1 .. i*10+10, those < pages."""
    return [j for j in range(i * N_CHILDREN + 1, i * N_CHILDREN + N_CHILDREN + 1) if j < pages]


def page_cross_links(i: int, pages: int) -> list[int]:
    """Cross links of page i (may duplicate tree links): (i+1)%N and
    (i*7+3)%N, except that no page links to page 0: /p/0 is the usual start
    URL, and start requests are dont_filter=True (never recorded by the
    dupefilter), so a link back to it would fetch it a second time."""
    return [j for j in ((i + 1) % pages, (i * 7 + 3) % pages) if j != 0]


def page_links(i: int, pages: int) -> list[int]:
    """All page indexes linked from page i, in document order (may repeat)."""
    return page_children(i, pages) + page_cross_links(i, pages)


def page_html(i: int, pages: int, bases: list[str] | None = None,
              route: str = "p") -> bytes:
    """Page i; with ``bases`` (one base URL per listener) links are absolute, page j
    on ``bases[j % len(bases)]``; ``route``: the links' first path segment (``p``, or
    ``redirect`` for links through a 302)."""
    def href(j: int) -> str:
        return f"{bases[j % len(bases)]}/{route}/{j}" if bases else f"/{route}/{j}"

    links = "\n".join(f'<li><a href="{href(j)}">page {j}</a></li>' for j in page_links(i, pages))
    return (
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
        f"<title>page {i}</title></head>\n<body><h1>page {i}</h1>\n"
        f"<ul>\n{links}\n</ul>\n</body></html>\n"
    ).encode()
