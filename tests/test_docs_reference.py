"""The docs reference is complete: every setting, stat, ``request.meta`` key, fleet
counter, ``scrapy leased`` subcommand and option, and metric that the code defines is
named in its reference page; the README stays short. Fast, no Redis: the whole
``scrapy_leased/`` tree is read as source (ast), wherever its modules live."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "scrapy_leased"
DOCS = REPO / "docs"

README_MAX_BYTES = 12_000
SETTING_RE = re.compile(r"\bLEASED_[A-Z0-9]+(?:_[A-Z0-9]+)*\b")
STAT_RE = re.compile(r"^(?:leased|scheduler|dupefilter)/[a-z0-9_/]*$")
STAT_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
#: prometheus-client metric classes; their first argument is the metric's name.
METRIC_CLASSES = {"Counter", "Gauge", "Histogram", "Summary", "Info", "Enum",
                  "CounterMetricFamily", "GaugeMetricFamily", "HistogramMetricFamily",
                  "SummaryMetricFamily", "InfoMetricFamily", "StateSetMetricFamily"}


def _page(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def _in_code(text: str) -> set[str]:
    """Everything inside `backticks` on a page (and each word of it)."""
    spans = re.findall(r"`([^`\n]+)`", text)
    return set(spans) | {w for s in spans for w in re.split(r"[\s,()\[\]=]+", s) if w}


@cache
def _modules() -> tuple[tuple[Path, ast.Module], ...]:
    return tuple((p, ast.parse(p.read_text(encoding="utf-8"), str(p)))
                 for p in sorted(PACKAGE.rglob("*.py")))


def _strings(tree: ast.AST) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value


def _name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def _literal_choices(node: ast.expr) -> list[str]:
    """The string constants an argument can be: ``"a"``, ``"a" if x else "b"``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        return _literal_choices(node.body) + _literal_choices(node.orelse)
    return []


# -- what the code defines ------------------------------------------------------------


def code_settings() -> set[str]:
    """Every LEASED_* name in the package source (docstrings and messages included);
    a name ending in ``_`` (``LEASED_UPSERT_*``) is a family, not a setting."""
    names: set[str] = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        names |= set(SETTING_RE.findall(path.read_text(encoding="utf-8")))
    return names


def code_stats() -> set[str]:
    """Stat keys the package writes: string constants like ``leased/acked`` (also in
    tuples and conditionals), constant prefixes of f-strings (``scheduler/dequeued/``),
    and, in a module with a prefix constant (``"leased/upsert/"``), the names passed to
    the functions that add the prefix (directly or through a parameter)."""
    stats: set[str] = set()
    for _, tree in _modules():
        prefixes: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr) and node.values:
                head = node.values[0]
                if isinstance(head, ast.Constant) and STAT_RE.match(str(head.value)):
                    stats.add(str(head.value))
            if (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Name)
                    and isinstance(node.value, ast.Constant)
                    and isinstance(node.value.value, str)
                    and STAT_RE.match(node.value.value) and node.value.value.endswith("/")):
                prefixes[node.targets[0].id] = node.value.value
        for s in _strings(tree):
            if STAT_RE.match(s) and not s.endswith("/"):
                stats.add(s)
        for const, prefix in prefixes.items():
            stats |= {prefix + name for name in _prefixed_names(tree, const)}
    return stats


def _prefixed_names(tree: ast.Module, const: str) -> set[str]:
    funcs = {f.name: f for f in ast.walk(tree)
             if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}

    def calls(f: ast.AST) -> Iterator[ast.Call]:
        return (c for c in ast.walk(f) if isinstance(c, ast.Call))

    # Functions that add the prefix to their first parameter: `inc_value(PREFIX + name)`.
    emitters: set[str] = set()
    for name, f in funcs.items():
        for c in calls(f):
            if any(isinstance(a, ast.BinOp) and isinstance(a.left, ast.Name)
                   and a.left.id == const for a in c.args):
                emitters.add(name)
    # ... and functions passing one of their parameters on to one of those.
    grown = True
    while grown:
        grown = False
        for name, f in funcs.items():
            params = {a.arg for a in f.args.args}
            if name not in emitters and any(
                    _name(c.func) in emitters and c.args and isinstance(c.args[0], ast.Name)
                    and c.args[0].id in params for c in calls(f)):
                emitters.add(name)
                grown = True
    return {s for c in calls(tree) if _name(c.func) in emitters and c.args
            for s in _literal_choices(c.args[0]) if STAT_NAME_RE.match(s)}


def code_fleet_counters() -> set[str]:
    """Fields the Lua scripts add to the crawl's ``stats`` HASH (``HINCRBY ... 'name'``)."""
    fields: set[str] = set()
    for path in sorted(PACKAGE.rglob("*.lua")):
        text = path.read_text(encoding="utf-8")
        fields |= set(re.findall(r"HINCRBY',\s*(?:KEYS\[\d+\]|keys\.stats),\s*'([a-z_]+)'",
                                 text))
    return fields


def code_meta_keys() -> set[str]:
    """``request.meta`` keys the package defines or uses: ``META_*`` string constants,
    and string subscripts or ``get``/``pop``/``setdefault`` of a ``.meta``."""
    keys: set[str] = set()
    for _, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                    and isinstance(node.value.value, str):
                for t in node.targets:
                    if isinstance(t, ast.Name) and t.id.startswith("META_"):
                        keys.add(node.value.value)
            target: ast.expr | None = None
            key: ast.expr | None = None
            if isinstance(node, ast.Subscript):
                target, key = node.value, node.slice
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("get", "pop", "setdefault") and node.args:
                target, key = node.func.value, node.args[0]
            if isinstance(target, ast.Attribute) and target.attr == "meta" \
                    and isinstance(key, ast.Constant) and isinstance(key.value, str):
                keys.add(key.value)
    return keys


def code_subcommands() -> set[str]:
    """The ``SUBCOMMANDS`` tuple of the ``scrapy leased`` command, wherever it lives."""
    found: set[str] = set()
    for _, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "SUBCOMMANDS" for t in node.targets):
                found |= set(ast.literal_eval(node.value))
    return found


def code_options() -> set[str]:
    """Long options of ``scrapy leased`` and its subcommands, read from its real parser
    (Scrapy's own global options, -s and the like, are Scrapy's to document)."""
    import argparse

    from scrapy.commands import ScrapyCommand
    from scrapy.settings import Settings

    from scrapy_leased.commands.leased import Command

    def long_options(command: ScrapyCommand) -> set[str]:
        command.settings = Settings()
        parser = argparse.ArgumentParser()
        command.add_options(parser)
        parsers = [parser] + [sub for action in parser._actions
                              if isinstance(action, argparse._SubParsersAction)
                              for sub in action.choices.values()]
        return {o for p in parsers for o in p._option_string_actions if o.startswith("--")}

    class Plain(ScrapyCommand):  # Scrapy's own options only
        def short_desc(self) -> str:
            return ""

        def run(self, args: list[str], opts: argparse.Namespace) -> None:
            pass

    return long_options(Command()) - long_options(Plain())


def code_metrics() -> set[str]:
    """Names of the Prometheus metrics the package defines: the table of metrics the
    exporter serves (observe/metrics.json) and any metric object made in code."""
    table = json.loads((PACKAGE / "observe" / "metrics.json").read_text(encoding="utf-8"))
    # counters are exported (and documented) with the _total suffix
    return {m["name"] + ("_total" if m["type"] == "counter" else "") for m in table} | {
        c.args[0].value for _, tree in _modules() for c in ast.walk(tree)
        if isinstance(c, ast.Call) and _name(c.func) in METRIC_CLASSES and c.args
        and isinstance(c.args[0], ast.Constant) and isinstance(c.args[0].value, str)}


# -- the checks -----------------------------------------------------------------------


def test_the_scan_finds_what_it_should() -> None:
    """The scanners see today's names, so an empty result can never pass by accident."""
    assert {"LEASED_REDIS_URL", "LEASED_RATE", "LEASED_UPSERT_URL"} <= code_settings()
    assert {"leased/acked", "leased/failed_stale", "scheduler/dequeued/redis",
            "leased/upsert/written", "leased/upsert/missing_key",
            "leased/upsert/batches_failed"} <= code_stats()
    assert {"done", "recovered", "purged_dead"} <= code_fleet_counters()
    assert {"_leased_claim", "leased_lane", "download_slot"} <= code_meta_keys()
    assert {"status", "dead", "seed", "reset"} <= code_subcommands()
    assert {"--redis-url", "--yes", "--file"} <= code_options()
    assert {"leased_done_requests_total", "leased_warning"} <= code_metrics()


def test_every_setting_is_in_the_settings_reference() -> None:
    page = _page("settings.md")
    documented = set(re.findall(r"^### (LEASED_[A-Z0-9_]+)$", page, re.M))
    missing = sorted(n for n in code_settings() if not n.endswith("_") and n not in documented)
    assert not missing, f"docs/settings.md has no '### NAME' section for {missing}"
    # each section gives the type and the default
    for name in documented:
        section = page.split(f"### {name}\n", 1)[1].split("\n#", 1)[0]
        assert "*Type*" in section and "*Default*" in section, name


def test_every_stat_is_in_the_stats_reference() -> None:
    documented = _in_code(_page("stats.md"))
    missing = sorted(s for s in code_stats()
                     if s not in documented
                     and not (s.endswith("/") and any(d.startswith(s) for d in documented)))
    assert not missing, f"docs/stats.md does not name {missing}"


def test_every_fleet_counter_is_in_the_stats_reference() -> None:
    page = _page("stats.md").split("## Fleet-wide counters", 1)[1]
    missing = sorted(code_fleet_counters() - _in_code(page))
    assert not missing, f"docs/stats.md (fleet-wide counters) does not name {missing}"


def test_every_meta_key_is_in_the_meta_reference() -> None:
    documented = _in_code(_page("meta.md"))
    missing = sorted(code_meta_keys() - documented)
    assert not missing, f"docs/meta.md does not name {missing}"


def test_every_subcommand_and_option_is_in_the_commands_reference() -> None:
    page = _page("commands.md")
    sections = set(re.findall(r"^### ([a-z-]+)$", page, re.M))
    missing = sorted(code_subcommands() - sections)
    assert not missing, f"docs/commands.md has no '### NAME' section for {missing}"
    missing = sorted(code_options() - _in_code(page))
    assert not missing, f"docs/commands.md does not name the options {missing}"


def test_every_metric_is_in_the_metrics_reference() -> None:
    missing = sorted(code_metrics() - _in_code(_page("metrics.md")))
    assert not missing, f"docs/metrics.md does not name {missing}"


def test_every_allowed_compat_regression_is_explained() -> None:
    allowlist = REPO / "tests" / "scrapy_compat" / "allowlist.txt"
    nodes = [line.split("|")[1].strip() for line in allowlist.read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    page = _page("compatibility.md")
    missing = [n for n in nodes if f"`{n}`" not in page]
    assert not missing, f"docs/compatibility.md does not list {missing}"


def test_every_page_is_in_the_nav() -> None:
    nav = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    missing = [p for p in pages if p not in nav]
    assert not missing, f"mkdocs.yml's nav lacks {missing}"


def test_readme_is_short_and_links_into_the_docs() -> None:
    readme = (REPO / "README.md").read_bytes()
    assert len(readme) < README_MAX_BYTES, len(readme)
    text = readme.decode("utf-8")
    assert "python -m pytest -q" in text  # the test command .ci/run runs
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (REPO / link).is_file(), link


@pytest.mark.parametrize("name", ["lesson", "practice"])
def test_docs_speak_to_a_user(name: str) -> None:
    """Pages and README name the demo and the seed design, not an unknown course."""
    for path in [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]:
        text = path.read_text(encoding="utf-8").lower()
        assert name not in text, f"{path.relative_to(REPO)} mentions '{name}'"
