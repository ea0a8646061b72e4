"""The Grafana dashboard (deploy/grafana/scrapy-leased.json, docs/metrics.md#grafana).

Every query is parsed with a real PromQL parser (promql-parser, the Rust parser's
binding) and each metric it names is checked against what ``scrapy leased metrics``
really exports: a real crawl through a real redis-server, plus seeds left queued so the
per-host series exist, then the exporter run as an operator would and its output read
with prometheus-client's own parser. The names a query may use are the sample names
Prometheus stores for each exported family (a counter ``F`` is ``F_total``, a histogram
``F_bucket``/``F_sum``/``F_count``, ...); label names in matchers, ``by (...)`` and
legends must be labels of those samples; counters are only graphed through ``rate()``
or ``increase()``, gauges never are. The rest checks what Grafana's import needs: the
datasource input every panel and query uses, the ``crawl`` variable, ids and layout.
"""

from __future__ import annotations

import copy
import json
import re
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser as promql
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.observe import LeasedServer
from tests.test_commands import leased, ok, status_json

REPO = Path(__file__).resolve().parents[1]
DASHBOARD = REPO / "deploy" / "grafana" / "scrapy-leased.json"
DOC = REPO / "docs" / "metrics.md"
DS_INPUT = "DS_PROMETHEUS"
DATASOURCE = {"type": "prometheus", "uid": "${" + DS_INPUT + "}"}
CRAWL_MATCHER = ("crawl", "=~", "$crawl")
#: Grafana's own variables a query may use, and what stands in for them when parsing
BUILTINS = {"__rate_interval": "1m", "__interval": "1m", "__range": "1h"}
COUNTER_FUNCS = {"rate", "increase", "irate"}
#: sample names Prometheus stores for a family of each type (prometheus-client's families)
SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",),
            "histogram": ("_bucket", "_sum", "_count", "_created"),
            "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
            "summary": ("", "_sum", "_count", "_created"), "info": ("_info",),
            "stateset": ("",), "unknown": ("",)}
_VAR_RE = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")
_LEGEND_RE = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def query_panels(dash: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel that is not a row, rows' collapsed panels included."""
    for panel in dash["panels"]:
        if panel["type"] == "row":
            yield from panel.get("panels", [])
        else:
            yield panel


def queries(dash: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for panel in query_panels(dash):
        for target in panel["targets"]:
            yield panel, target


def parse(expr: str) -> Any:
    """A Grafana query parsed as PromQL, its ``$__*`` variables replaced as Grafana does."""
    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        return BUILTINS.get(name, m.group(0))
    return promql.parse(_VAR_RE.sub(sub, expr))


def selectors(node: Any, func: str | None = None) -> Iterator[tuple[Any, str | None]]:
    """(vector selector, the function it is directly an argument of) of a parsed query."""
    if isinstance(node, promql.VectorSelector):
        yield node, func
    elif isinstance(node, promql.MatrixSelector):
        yield node.vector_selector, func
    elif isinstance(node, promql.Call):
        for arg in node.args:
            yield from selectors(arg, node.func.name)
    elif isinstance(node, promql.AggregateExpr):
        yield from selectors(node.expr)
        if node.param is not None:
            yield from selectors(node.param)
    elif isinstance(node, promql.BinaryExpr):
        yield from selectors(node.lhs)
        yield from selectors(node.rhs)
    elif isinstance(node, (promql.ParenExpr, promql.UnaryExpr)):
        yield from selectors(node.expr)
    elif isinstance(node, promql.SubqueryExpr):
        yield from selectors(node.expr, func)
    else:
        assert isinstance(node, (promql.NumberLiteral, promql.StringLiteral)), node


def aggregations(node: Any) -> Iterator[Any]:
    if isinstance(node, promql.AggregateExpr):
        yield node
    for child in ("expr", "lhs", "rhs", "param"):
        if isinstance(getattr(node, child, None), promql.Expr):
            yield from aggregations(getattr(node, child))
    for arg in getattr(node, "args", None) or ():
        yield from aggregations(arg)


def matchers(sel: Any) -> list[tuple[str, str, str]]:
    ops = [(promql.MatchOp.Equal, "="), (promql.MatchOp.NotEqual, "!="),
           (promql.MatchOp.Re, "=~"), (promql.MatchOp.NotRe, "!~")]
    assert not sel.matchers.or_matchers, sel
    return [(m.name, next(text for op, text in ops if m.op == op), m.value)
            for m in sel.matchers.matchers]


def label_values_metric(query: str) -> tuple[str, str]:
    m = re.fullmatch(r"\s*label_values\(\s*(\w+)\s*,\s*(\w+)\s*\)\s*", query)
    assert m, f"not label_values(metric, label): {query}"
    return m.group(1), m.group(2)


# -- what Grafana's import needs ----------------------------------------------------------

def test_dashboard_imports_as_grafana_expects():
    dash = dashboard()
    assert dash["uid"] == "scrapy-leased" and len(dash["uid"]) <= 40
    assert dash["title"] and dash["id"] is None
    assert isinstance(dash["schemaVersion"], int) and 36 <= dash["schemaVersion"] <= 41
    assert dash["__inputs"] == [{"name": DS_INPUT, "label": "Prometheus",
                                 "description": dash["__inputs"][0]["description"],
                                 "type": "datasource", "pluginId": "prometheus",
                                 "pluginName": "Prometheus"}]
    required = {(r["type"], r["id"]) for r in dash["__requires"]}
    used = {("panel", p["type"]) for p in query_panels(dash)}
    assert required == {("grafana", "grafana"), ("datasource", "prometheus")} | used

    (var,) = dash["templating"]["list"]
    assert var["name"] == "crawl" and var["type"] == "query"
    assert var["datasource"] == DATASOURCE
    assert var["query"]["query"] == var["definition"]
    assert label_values_metric(var["definition"])[1] == "crawl"
    assert var["multi"] and var["includeAll"]

    ids = [p["id"] for p in dash["panels"]] + [
        c["id"] for p in dash["panels"] if p["type"] == "row" for c in p.get("panels", [])]
    assert len(ids) == len(set(ids)), "panel ids must be unique"

    cells: set[tuple[int, int]] = set()
    for panel in dash["panels"]:
        g = panel["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, panel["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"])
                for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"panel {panel['title']!r} overlaps another"
        cells |= mine

    panels = list(query_panels(dash))
    assert len(panels) >= 20
    for panel in panels:
        assert panel["title"] and panel["targets"], panel
        assert panel["datasource"] == DATASOURCE, panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]
            assert target["expr"].strip(), panel["title"]

    # every variable the JSON uses is defined: the input, the crawl variable, Grafana's own
    known = {DS_INPUT, "crawl", *BUILTINS}
    used_vars = {a or b for a, b in _VAR_RE.findall(DASHBOARD.read_text(encoding="utf-8"))}
    assert used_vars <= known, used_vars - known


def syntax_problems(dash: dict[str, Any]) -> list[str]:
    """What is wrong with the queries as PromQL, without an exporter to compare with."""
    problems = []
    for panel, target in queries(dash):
        where = f"{panel['title']!r}: {target['expr']}"
        try:
            tree = parse(target["expr"])
        except Exception as exc:  # the parser's own error type is not exported
            problems.append(f"{where}: does not parse: {exc}")
            continue
        found = list(selectors(tree))
        if not found:
            problems.append(f"{where}: no metric")
        for sel, _ in found:
            if not sel.name:
                problems.append(f"{where}: a selector without a metric name")
            elif CRAWL_MATCHER not in matchers(sel):
                problems.append(f'{where}: {sel.name} without crawl=~"$crawl"')
    return problems


def export_problems(dash: dict[str, Any], exported: dict[str, Any]) -> list[str]:
    """What the queries name that the exporter does not export, or use wrongly."""
    problems = []
    for panel, target in queries(dash):
        where = f"{panel['title']!r}: {target['expr']}"
        tree = parse(target["expr"])
        labels_of_all: set[str] | None = None
        for sel, func in selectors(tree):
            if sel.name not in exported:
                problems.append(f"{where}: {sel.name} is not exported by scrapy leased metrics")
                continue
            family, labels = exported[sel.name]
            if not family.samples:
                problems.append(f"{where}: {sel.name} had no sample to check its labels")
            for name, _, _ in matchers(sel):
                if name not in labels:
                    problems.append(f"{where}: {sel.name} has no label {name!r}")
            if family.type == "counter":
                # a stat panel may show a counter's value: the total so far
                if func not in COUNTER_FUNCS and panel["type"] != "stat":
                    problems.append(f"{where}: counter {sel.name} graphed without rate()")
            elif func in COUNTER_FUNCS:
                problems.append(f"{where}: {func}() of {family.type} {sel.name}")
            labels_of_all = labels if labels_of_all is None else labels_of_all & labels
        if labels_of_all is None:
            continue
        for agg in aggregations(tree):
            if agg.modifier is not None and not set(agg.modifier.labels) <= labels_of_all:
                problems.append(f"{where}: by/without labels "
                                f"{sorted(set(agg.modifier.labels) - labels_of_all)}")
        legend = set(_LEGEND_RE.findall(target.get("legendFormat", "")))
        if not legend <= labels_of_all:
            problems.append(f"{where}: legend labels {sorted(legend - labels_of_all)}")
    for var in dash["templating"]["list"]:
        metric, label = label_values_metric(var["definition"])
        if metric not in exported or label not in exported[metric][1]:
            problems.append(f"variable {var['name']}: {var['definition']} is not exported")
    return problems


def used_families(dash: dict[str, Any], exported: dict[str, Any]) -> set[str]:
    return {exported[sel.name][0].name for _, target in queries(dash)
            for sel, _ in selectors(parse(target["expr"])) if sel.name in exported}


def with_expr(dash: dict[str, Any], title: str, expr: str) -> dict[str, Any]:
    """A copy of the dashboard with the first query of panel ``title`` replaced."""
    dash = copy.deepcopy(dash)
    panel = next(p for p in query_panels(dash) if p["title"] == title)
    panel["targets"][0]["expr"] = expr
    return dash


def test_queries_are_promql_limited_to_the_chosen_crawls():
    dash = dashboard()
    assert syntax_problems(dash) == []
    # what the check catches
    title = "Queue"
    assert "does not parse" in syntax_problems(with_expr(dash, title, "sum by (crawl) ("))[0]
    assert "without crawl" in syntax_problems(with_expr(dash, title, "leased_queued_requests"))[0]


# -- every query names what `scrapy leased metrics` exports --------------------------------

@pytest.fixture(scope="module")
def exported(redis_server, tmp_path_factory) -> dict[str, Any]:
    """sample name -> (family, label names) of a real exporter's output, over a crawl
    that has a finished part (fleet stats) and seeds still queued (per-host series)."""
    from scrapy_leased.testing.site import Site
    from tests.support.workers import WorkerFactory

    crawl_id = f"t-grafana-{uuid.uuid4().hex[:8]}"
    site = Site(pages=30).start()
    factory = WorkerFactory(tmp_path_factory.mktemp("workers"))
    try:
        w = factory(redis_server.url, crawl_id, site.url + "/p/0",
                    settings={"LEASED_LOGSTATS_INTERVAL": 0})
        assert w.wait(120) == 0, w.log_tail()
        assert w.close_reason() == "finished"
        # pages of a host no worker is left to fetch: they stay queued, in status's host table
        ok(leased("seed", crawl_id, "http://held.invalid/a", "http://held.invalid/b",
                  "--redis-url", redis_server.url))
        status = status_json(redis_server.url, crawl_id, "--sample", "0")
        assert status["todo"] == 2 and status["budget"]["lanes"], status
        with LeasedServer("metrics", crawl_id, "--redis-url", redis_server.url) as server:
            with urllib.request.urlopen(server.url + "metrics", timeout=30) as r:
                text = r.read().decode()
    finally:
        factory.cleanup()
        site.stop()
    out: dict[str, Any] = {}
    for family in text_string_to_metric_families(text):
        labels = {k for s in family.samples for k in s.labels}
        for suffix in SUFFIXES[family.type]:
            out[family.name + suffix] = (family, labels)
        # the mapping above is the one the exporter's samples follow
        for s in family.samples:
            assert s.name in out and out[s.name][0] is family, (s.name, family.type)
    return out


def test_every_query_names_an_exported_metric(exported):
    dash = dashboard()
    assert export_problems(dash, exported) == []
    families = {f.name for f, _ in exported.values()}
    missing = sorted(families - used_families(dash, exported))
    assert not missing, f"exported but on no panel of {DASHBOARD.name}: {missing}"


@pytest.mark.parametrize(("title", "expr", "problem"), [
    ("Queue", 'sum(leased_queue_size{crawl=~"$crawl"})', "leased_queue_size is not exported"),
    # a counter's family name is not a series: Prometheus stores leased_done_requests_total
    ("Requests done / s", 'sum(rate(leased_done_requests{crawl=~"$crawl"}[5m]))',
     "leased_done_requests is not exported"),
    ("Requests done / s", 'sum(rate(leased_done_requests_count{crawl=~"$crawl"}[5m]))',
     "leased_done_requests_count is not exported"),
    ("Requests done / s", 'sum(leased_done_requests_total{crawl=~"$crawl"})',
     "graphed without rate()"),
    ("Queue", 'sum(rate(leased_queued_requests{crawl=~"$crawl"}[5m]))', "rate() of gauge"),
    ("Queue", 'sum(leased_queued_requests{crawl=~"$crawl", host="a"})', "has no label 'host'"),
    ("Queue", 'sum by (status) (leased_queued_requests{crawl=~"$crawl"})',
     "by/without labels ['status']"),
    ("Queue", 'sum by (crawl) (leased_queued_requests{crawl=~"$crawl"})', "legend labels"),
])
def test_what_the_export_check_catches(exported, title, expr, problem):
    dash = with_expr(dashboard(), title, expr)
    if problem == "legend labels":
        next(p for p in query_panels(dash) if p["title"] == title)["targets"][0][
            "legendFormat"] = "{{host}}"
    problems = export_problems(dash, exported)
    assert len(problems) == 1 and problem in problems[0], problems


def test_docs_say_how_to_import_it():
    text = DOC.read_text(encoding="utf-8")
    assert "## Grafana" in text
    assert str(DASHBOARD.relative_to(REPO)) in text
