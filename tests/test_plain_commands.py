"""Scrapy's own one-page commands with the add-on in settings.py (#25 item 2): ``shell``,
``fetch``, ``parse``, ``view``, ``check`` and ``bench`` run as plain Scrapy, print (or,
for ``view``, show the browser) what plain Scrapy does, and write no key to Redis. Real ``scrapy`` processes in
tests/project (whose settings.py enables the add-on), a real private redis-server as
``LEASED_REDIS_URL``, the local test site."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from scrapy_leased.testing.pages import page_html

REPO = Path(__file__).resolve().parents[1]
PROJECT = REPO / "tests" / "project"


def scrapy(*args: str, plain: bool, redis_url: str,
           env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCRAPY_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(env_extra or {})
    if plain:
        env["TESTPROJECT_NO_ADDON"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "scrapy", *args, "-s", f"LEASED_REDIS_URL={redis_url}",
         "-s", "LEASED_CRAWL_ID=plain-commands"],
        cwd=PROJECT, env=env, capture_output=True, text=True, timeout=120)


def keys(url: str) -> set[bytes]:
    return set(redis.Redis.from_url(url).scan_iter(count=1000))


def same_output(a: str, b: str) -> bool:
    """Equal but for timings and object addresses."""
    def norm(s: str) -> str:
        s = re.sub(r"0x[0-9a-f]+", "0x", s)
        return re.sub(r"\d+\.\d+s", "Ns", s)
    return norm(a) == norm(b)


@pytest.mark.parametrize("command", [
    ["shell", "{url}", "-c", "(response.status, len(response.css('a')))", "--nolog"],
    ["fetch", "{url}", "--nolog"],
    ["parse", "{url}", "--spider", "plain_commands", "-c", "parse", "--nolog"],
    ["check", "plain_commands"],
], ids=lambda c: c[0])
def test_scrapy_commands_run_as_plain_scrapy(command, redis_server, make_site):
    site = make_site(pages=10)
    before = keys(redis_server.url)
    args = [a.format(url=site.url + "/p/0") for a in command]
    plain = scrapy(*args, plain=True, redis_url=redis_server.url)
    with_addon = scrapy(*args, plain=False, redis_url=redis_server.url)
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert with_addon.returncode == 0, with_addon.stderr[-2000:]
    if command[0] == "check":  # unittest's report, on stderr
        out, plain_out = with_addon.stderr, plain.stderr
        assert "OK" in out, out
    else:
        out, plain_out = with_addon.stdout, plain.stdout
    assert out.strip(), with_addon.stderr[-2000:]  # it printed something
    assert same_output(out, plain_out), (out, plain_out)
    # the session's Redis: other tests' keys (some expire meanwhile), none added
    assert keys(redis_server.url) - before == set()


def test_bench_writes_nothing_to_redis(redis_server):
    before = keys(redis_server.url)
    result = scrapy("bench", "-s", "CLOSESPIDER_TIMEOUT=2", plain=False,
                    redis_url=redis_server.url)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "scrapy_leased: off for `scrapy bench`" in result.stderr
    assert keys(redis_server.url) - before == set()


def test_view_opens_the_page_as_plain_scrapy_and_writes_nothing_to_redis(
        redis_server, make_site, tmp_path):
    """``scrapy view URL`` hands the page, saved to a file, to the web browser
    (``webbrowser``, which runs the command in BROWSER): here a script recording the URL
    it is given. With the add-on in settings.py it runs as plain Scrapy: the same page,
    the site's body with Scrapy's <base> tag, and no key written to Redis."""
    site = make_site(pages=10)
    url = site.url + "/p/3"
    browser = tmp_path / "browser.sh"
    browser.write_text('#!/bin/sh\nprintf \'%s\\n\' "$1" >> "$VIEW_RECORD"\n')
    browser.chmod(0o755)
    before = keys(redis_server.url)
    saved = {}
    for plain in (True, False):
        record = tmp_path / f"opened-{plain}.txt"
        result = scrapy("view", url, "--nolog", plain=plain, redis_url=redis_server.url,
                        env_extra={"BROWSER": str(browser), "VIEW_RECORD": str(record)})
        assert result.returncode == 0, result.stderr[-2000:]
        (opened,) = record.read_text().splitlines()  # the browser ran once
        assert opened.startswith("file://") and opened.endswith(".html"), opened
        page = Path(opened[len("file://"):])
        saved[plain] = page.read_bytes()
        page.unlink()
    assert saved[False] == saved[True]
    base = f'<base href="{url}">'.encode()
    assert base in saved[False], saved[False][:300]
    assert saved[False].replace(base, b"") == page_html(3, 10)  # the site's page
    assert keys(redis_server.url) - before == set()
